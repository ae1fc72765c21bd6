"""The signing and trust files as a process reads them: parsed once, read again when the file
changes (a Kubernetes Secret volume swaps its files in place when the Secret is updated, so a
rotation reaches running processes without a restart).

Each read compares the file's modification time and size with the last parse (one ``stat``), so
checking a seal per run costs no file read. A file that changed to something unreadable keeps
the last good keys and logs the error once per change: a half-written update never empties a
process's trust.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from agentrun.trust.keys import SigningKeys, TrustedKeys

log = logging.getLogger(__name__)

K = TypeVar("K", SigningKeys, TrustedKeys)


class KeyFile(Generic[K]):
    """A key file, parsed by ``parse``; call the object for the current keys."""

    def __init__(self, path: Path, parse: Callable[[str], K]) -> None:
        """Reads ``path`` now. Raises ``OSError`` and ``keys.KeyFileError`` when the first
        read fails: a process does not start without its keys."""
        self.path = path
        self.parse: Callable[[str], K] = parse
        self._stamp = self._stat()
        self._keys: K = parse(path.read_text())

    def _stat(self) -> tuple[int, int]:
        found = os.stat(self.path)
        return found.st_mtime_ns, found.st_size

    def __call__(self) -> K:
        """The keys as the file holds them now (the last good ones if it became unreadable)."""
        try:
            stamp = self._stat()
        except OSError as err:
            log.error("cannot stat %s (%s): keeping the keys read before", self.path, err)
            return self._keys
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                self._keys = self.parse(self.path.read_text())
                log.info("read %s again: it changed", self.path)
            except (OSError, ValueError) as err:
                log.error(
                    "%s changed but cannot be read (%s): keeping the keys read before",
                    self.path,
                    err,
                )
        return self._keys


def signing_file(path: Path) -> KeyFile[SigningKeys]:
    """The operator's signing file at ``path``."""
    return KeyFile(path, SigningKeys.parse)


def trust_file(path: Path) -> KeyFile[TrustedKeys]:
    """A trust file at ``path``."""
    return KeyFile(path, TrustedKeys.parse)
