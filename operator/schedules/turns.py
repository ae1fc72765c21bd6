"""The schedules waiting for a reconcile, taken one namespace's after another's in turn.

What belongs here: that queue (``Turns``), pure bookkeeping with no I/O and no clock. What
does not: which schedules are due (``memory``), running the reconciles (``controller``).
"""

from __future__ import annotations

from collections.abc import Iterable

from .memory import CronKey


class Turns:
    """CronAgentRuns waiting for a reconcile, each once: the namespaces take turns (the first
    waiting of one, then of the next, ...), each namespace's in the order they came. A
    namespace with hundreds of schedules waiting delays another's newly due one by one turn
    of each namespace waiting, not by all of its own."""

    def __init__(self) -> None:
        self._waiting: dict[str, dict[CronKey, None]] = {}
        """By namespace, in turn order (the next to take first): its keys, in order."""

    def add(self, keys: Iterable[CronKey]) -> None:
        """Queue ``keys`` (one waiting already keeps its place); a namespace new to the queue
        takes its turn after those waiting."""
        for key in keys:
            self._waiting.setdefault(key[0], {})[key] = None

    def take(self) -> CronKey | None:
        """The next key (its namespace then goes to the end of the turns), or ``None``."""
        namespace = next(iter(self._waiting), None)
        if namespace is None:
            return None
        keys = self._waiting.pop(namespace)
        key = next(iter(keys))
        del keys[key]
        if keys:
            self._waiting[namespace] = keys
        return key

    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and key in self._waiting.get(str(key[0]), {})

    def __len__(self) -> int:
        return sum(len(keys) for keys in self._waiting.values())
