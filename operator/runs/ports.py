"""What the live runs offer to the rest of the operator: the ``LiveRuns`` port and the
snapshots the dispatcher hands out.

What belongs here: the one Protocol other kinds (admission: the queue pump, the queue status,
the ledger sweep) use to start, count, find and end live runs, implemented by
``dispatch.Dispatcher``; ``PendingTurn``, a frozen snapshot of a running run's dispatched turn
(the orphan watch reads those, never the dispatcher's views). What does not: the views
themselves (``views``, private to ``dispatch``).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from agentrun import kernel
from agentrun.protocol import RunConfig

from .keys import RunKey


class LiveRuns(Protocol):
    """The runs the operator follows (``dispatch.Dispatcher``)."""

    async def start_run(self, config: RunConfig, *, start_time: float, generation: int) -> None:
        """Append the admitted run's ``admitted`` event and follow it; raises
        ``agentrun.bus.EventTooLarge`` (or nats-py's ``MaxPayloadError``) when its config is
        too large to checkpoint, and what NATS raises."""

    def count_end(self, uid: str, state: kernel.RunState, *, tenant: str) -> bool:
        """Count the run's end once (``agentrun_runs_total``); True the first time."""

    def is_tracked(self, uid: str) -> bool:
        """Whether the run has a live view in this operator."""

    async def end(
        self, namespace: str, name: str, uid: str, phase: kernel.Phase, message: str
    ) -> bool:
        """End the run with ``phase`` (a ``stop`` event); False if it had already ended."""

    async def forget(self, namespace: str, name: str, uid: str) -> None:
        """The run's AgentRun was deleted: end it ``cancelled`` (counted and told), settle its
        ledger entry, purge its events; best effort, bounded."""


@dataclasses.dataclass(frozen=True, slots=True)
class PendingTurn:
    """A running run's dispatched turn as the dispatcher saw it (``Dispatcher.pending_turns``)."""

    key: RunKey
    tenant: str
    turn: int
    """The turn its TurnRequest asks for."""
    seq: int
    """The sequence of the run's last event processed (the turn builds on it)."""
    queued_seq: int
    """Stream sequence of its TurnRequest in the work queue."""
    checked_at: float
    """When that TurnRequest was published or last seen still queued (epoch seconds)."""
    queued_at: float
    """When that TurnRequest was published (epoch seconds)."""
    redispatches: int
    """Times this turn was published again after its TurnRequest was lost."""
