"""A tenant's admission queue in memory: its runs in FIFO order, a run's position in O(log n).

The queue is stored one value per run (``queue.<tenant>.<uid>``, see ``store``), so its
length is bounded by nothing but the platform's setting; its order is computed: runs are
admitted oldest first by their AgentRun's creation time, and runs created in the same instant
in the order they arrived (the stream sequence of their queue value, which only grows). The
operator — the queue's only writer — keeps this index of it, built from the stored values when
it first needs a tenant's queue and changed with every enqueue and dequeue it makes.

What belongs here: the order and positions, pure. What does not: storing the values
(``store``), deciding admission (the operator).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from sortedcontainers import SortedList


@dataclasses.dataclass(frozen=True, slots=True)
class QueuedRun:
    """A run waiting in its tenant's admission queue."""

    uid: str
    namespace: str
    name: str
    at: float
    """The AgentRun's creation time, epoch seconds: the queue's order (ties: arrival order)."""


_Place = tuple[float, int, str]
"""Where a run sorts: (creation time, arrival, uid)."""


class TenantQueue:
    """One tenant's admission queue, ordered by creation time, then arrival.

    ``add``, ``remove`` and ``position`` take O(log n) (a ``SortedList``), so showing every
    queued run its position costs no more per run at 10,000 queued than at ten."""

    def __init__(self) -> None:
        self._order: SortedList[_Place] = SortedList()
        self._runs: dict[str, tuple[_Place, QueuedRun]] = {}

    def __len__(self) -> int:
        return len(self._runs)

    def __contains__(self, uid: object) -> bool:
        return uid in self._runs

    def __iter__(self) -> Iterator[QueuedRun]:
        """The runs, head first."""
        return (self._runs[uid][1] for _, _, uid in self._order)

    def add(self, run: QueuedRun, *, arrival: int) -> int:
        """Queue ``run``, which arrived ``arrival``-th (any increasing number: the stream
        sequence of its stored value); a run already queued keeps its place. Returns its
        1-based position."""
        if run.uid not in self._runs:
            place = (run.at, arrival, run.uid)
            self._order.add(place)
            self._runs[run.uid] = (place, run)
        position = self.position(run.uid)
        assert position is not None
        return position

    def remove(self, uid: str) -> QueuedRun | None:
        """Take run ``uid`` out of the queue; the run, or ``None`` if it was not queued."""
        found = self._runs.pop(uid, None)
        if found is None:
            return None
        self._order.remove(found[0])
        return found[1]

    def get(self, uid: str) -> QueuedRun | None:
        """The queued run ``uid``, or ``None``."""
        found = self._runs.get(uid)
        return None if found is None else found[1]

    def position(self, uid: str) -> int | None:
        """The run's 1-based position (1: the head), or ``None`` if it is not queued."""
        found = self._runs.get(uid)
        return None if found is None else self._order.index(found[0]) + 1

    def head(self) -> QueuedRun | None:
        """The run admitted next, or ``None`` for an empty queue."""
        if not self._order:
            return None
        return self._runs[self._order[0][2]][1]

    def runs(self) -> list[QueuedRun]:
        """Every run, head first."""
        return list(self)
