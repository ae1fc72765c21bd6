"""The wire schema's version: what every TurnRequest and run event says it is written in, and
the check every reader makes before it reads one.

The rule (the version-skew policy, docs/operations.md): a release writes ``SCHEMA_VERSION``
into every message (``"schemaVersion"``) and reads every version up to it; a message without
the field is version 1 (written before messages carried it). Adding an optional field keeps
the version (readers ignore fields they do not know). A change an older reader would misread
raises it, and the release that can read the new version ships before any release writes it.
A reader handed a newer version than it knows refuses it (``UnsupportedSchema``) and leaves
the message for a newer process, never guessing and never dropping it.

What belongs here: the number and the check. The shapes are ``shapes`` and ``events``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SCHEMA_VERSION = 1
"""The version this release writes, and the newest it reads."""
FIELD = "schemaVersion"
"""The field every message carries it in."""


class UnsupportedSchema(ValueError):
    """A message written in a newer schema than this process reads: leave it for a newer one
    (nak it with a delay), never end a run or drop the message over it."""

    def __init__(self, version: int, *, what: str) -> None:
        self.version = version
        super().__init__(
            f"{what} is written in wire schema {version}; this release reads up to "
            f"{SCHEMA_VERSION} (an operator or worker newer than this one wrote it: upgrade "
            "this one)"
        )


def check(data: Mapping[str, Any], *, what: str) -> int:
    """The schema version of the decoded message ``data`` (1 when it has none).

    Raises ``UnsupportedSchema`` when it is newer than ``SCHEMA_VERSION``, and ``ValueError``
    when the field is not a positive integer.
    """
    version = data.get(FIELD, 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"{what}: {FIELD} must be a positive integer, not {version!r}")
    if version > SCHEMA_VERSION:
        raise UnsupportedSchema(version, what=what)
    return version
