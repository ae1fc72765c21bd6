"""What the CronAgentRun controller remembers of the schedules: each one known, its wake-up, the
objects as last seen within a bound of memory, and the last schedule time this process created
a run for.

What belongs here: that memory and its bookkeeping (a schedule seen, changed, forgotten; which
are due at a time, and the next wake-up), with no I/O and no clock of its own (times are given).
What does not: reading an object forgotten again (``store``), deciding or acting on a schedule
(``controller``, ``plan``), the status (``status``).
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Container, Mapping
from typing import Any

from agentrun.kernel import schemas

from ..platform.weighed import WeighedCache

BODIES_MEMORY = 64 * 2**20
"""Bytes of CronAgentRun objects kept as last seen, about (each weighed by
``schemas.footprint``; the least recently used forgotten first): a namespace's thousands of
schedules with megabyte templates cost the operator bounded memory; one forgotten is read
again (one GET) when it is next due."""

CronKey = tuple[str, str]
"""(namespace, name) of a CronAgentRun."""


@dataclasses.dataclass(slots=True)
class Entry:
    """A CronAgentRun known: its identity and when to look at it again."""

    uid: str
    generation: int
    wake: float | None = None
    """Epoch seconds (``None``: only when it or one of its runs changes); set with
    ``CronMemory.wake``."""


class CronMemory:
    """Every CronAgentRun known (small whatever its spec), the objects as last seen (``memory``
    bytes at most), the schedules to look at again, and the schedule times created for."""

    def __init__(self, memory: int = BODIES_MEMORY) -> None:
        """``memory``: bytes of objects kept as seen (``BODIES_MEMORY``)."""
        self._entries: dict[CronKey, Entry] = {}
        self._bodies: WeighedCache[CronKey, Mapping[str, Any]] = WeighedCache(
            memory, schemas.footprint
        )
        """The objects as last seen, ``memory`` at most (one forgotten is read again)."""
        self._wakes: list[tuple[float, CronKey]] = []
        """The wake-ups set, earliest first (a heap; one set again since, or of a schedule
        forgotten, is left behind until it comes up, or the heap is rebuilt past twice the
        schedules): the loop finds those due without looking at every schedule."""
        self._dirty: set[CronKey] = set()
        """Schedules to look at again at the next pass, whatever their wake-up."""
        self._last: dict[str, float] = {}
        """By CronAgentRun uid: the last schedule time this process created a run for, in case
        the object it reconciles next predates its own status write (the watch lags)."""

    def observe(self, body: Mapping[str, Any]) -> bool:
        """A CronAgentRun as listed or changed, kept as last seen; ``True`` when it is new, or
        of a new spec (then marked to be looked at again)."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        uid, generation = str(meta.get("uid", "")), int(meta.get("generation") or 1)
        self._bodies[key] = body
        known = self._entries.get(key)
        if known is not None and known.uid == uid and known.generation == generation:
            return False
        self._entries[key] = Entry(uid, generation)
        self._dirty.add(key)
        return True

    def forget(self, namespace: str, name: str) -> None:
        """The CronAgentRun is gone: everything of it."""
        entry = self._entries.pop((namespace, name), None)
        self._bodies.pop((namespace, name), None)
        self._dirty.discard((namespace, name))
        if entry is not None:
            self._last.pop(entry.uid, None)

    def mark(self, key: CronKey) -> bool:
        """Look at ``key`` again at the next pass; ``False`` (and nothing) when it is not
        known."""
        if key not in self._entries:
            return False
        self._dirty.add(key)
        return True

    def entry(self, key: CronKey) -> Entry | None:
        """``key``'s entry (its ``wake`` is the controller's to set), or ``None``."""
        return self._entries.get(key)

    def keys(self) -> set[CronKey]:
        """Every CronAgentRun known."""
        return set(self._entries)

    def body(self, key: CronKey) -> Mapping[str, Any] | None:
        """``key``'s object as last seen, or ``None`` when forgotten (or never seen)."""
        return self._bodies.get(key)

    def keep(self, key: CronKey, body: Mapping[str, Any]) -> None:
        """Keep ``body``, read again, as ``key``'s object last seen."""
        self._bodies[key] = body

    def wake(self, key: CronKey, at: float | None) -> None:
        """Look at ``key`` again at ``at`` (epoch seconds; ``None``: only when it or one of
        its runs changes)."""
        entry = self._entries.get(key)
        if entry is None:
            return
        entry.wake = at
        if at is not None:
            heapq.heappush(self._wakes, (at, key))
        if len(self._wakes) > 2 * len(self._entries) + 64:  # wake-ups set again, left behind
            self._wakes = [(e.wake, k) for k, e in self._entries.items() if e.wake is not None]
            heapq.heapify(self._wakes)

    def take_due(self, now: float, *, busy: Container[CronKey] = ()) -> set[CronKey]:
        """The schedules to look at now but those ``busy`` (queued or being reconciled, whose
        next wake-up their reconcile sets): those marked (no longer, once taken; a busy one
        stays marked) and those whose wake-up is at or before ``now`` (epoch seconds)."""
        due = {key for key in self._dirty if key not in busy}
        self._dirty -= due
        while self._wakes and self._wakes[0][0] <= now:
            at, key = heapq.heappop(self._wakes)
            if self._current(key, at) and key not in busy:
                due.add(key)
        return due

    def next_wake(self) -> float | None:
        """The earliest wake-up of any schedule (epoch seconds), or ``None``."""
        while self._wakes and not self._current(self._wakes[0][1], self._wakes[0][0]):
            heapq.heappop(self._wakes)  # set again since, or forgotten
        return self._wakes[0][0] if self._wakes else None

    def _current(self, key: CronKey, at: float) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry.wake == at

    def last_created(self, uid: str) -> float:
        """The last schedule time this process created a run for, for CronAgentRun ``uid``
        (0: none)."""
        return self._last.get(uid, 0.0)

    def created(self, uid: str, scheduled: float) -> None:
        """A run was created for schedule time ``scheduled`` of CronAgentRun ``uid``."""
        self._last[uid] = max(scheduled, self._last.get(uid, 0.0))
