"""Lost turns: a running run whose TurnRequest left the work queue with no newer event.

A TurnRequest can leave the work queue without its turn being committed (acked by a worker
that then gave the turn up, or deleted). ``OrphanWatch`` finds such runs and publishes their
turn again under a fresh ``Nats-Msg-Id`` (a duplicate is harmless: the commit is
compare-and-set); after ``MAX_REDISPATCHES`` such losses of one turn it ends the run
``checkpoint_failed`` naming the cause.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from agentrun import kernel
from agentrun.bus import Bus
from agentrun.protocol import TurnRequest

from .views import RunView

log = logging.getLogger(__name__)

MAX_REDISPATCHES = 3
"""Times a lost turn is published again before the run ends ``checkpoint_failed``."""


class LiveRuns(Protocol):
    """The runs the operator follows (``Dispatcher``)."""

    def running_views(self) -> list[RunView]:
        """A snapshot of the live run views; the watch updates their dispatch bookkeeping."""

    async def end(
        self, namespace: str, name: str, uid: str, phase: kernel.Phase, message: str
    ) -> bool:
        """End the run with ``phase`` (a ``stop`` event); False if it had already ended."""


class OrphanWatch:
    """Finds running runs with no turn in flight and dispatches their turn again."""

    def __init__(
        self, bus: Bus, runs: LiveRuns, *, after: float, clock: Callable[[], float] = time.time
    ) -> None:
        """``runs`` gives the live views and ends runs; a run is looked at once its
        TurnRequest was published or last seen queued ``after`` seconds ago (so a lost turn is
        found within about ``1.25 × after`` seconds); ``clock`` is epoch seconds."""
        self.bus = bus
        self.runs = runs
        self.after = after
        self.clock = clock
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        """Let ``run`` return after its current pass."""
        self._stopping.set()

    async def run(self) -> None:
        """Until ``stop``: look at every live run each ``after / 4`` seconds (at least 0.2).

        Each look is one stream read, a second one only for a run whose request is gone; NATS
        trouble is logged and the next pass looks again.
        """
        interval = max(0.2, self.after / 4)
        while not self._stopping.is_set():
            await asyncio.sleep(interval)
            for view in self.runs.running_views():
                try:
                    await self.check(view)
                except Exception as err:  # NATS trouble: the next pass looks again
                    log.warning("orphan check of %s/%s failed: %r", view.namespace, view.name, err)

    async def check(self, view: RunView) -> bool:
        """Re-dispatch ``view``'s pending turn if its TurnRequest is gone and no newer event
        came, or end the run ``checkpoint_failed`` once that happened ``MAX_REDISPATCHES``
        times; True when it acted."""
        now = self.clock()
        summary = view.summary
        if (
            view.terminal
            or summary is None
            or summary.phase is not kernel.Phase.RUNNING
            or not view.queued_seq
            or now - view.checked_at < self.after
        ):
            return False
        if await self.bus.turn_queued(view.queued_seq):
            view.checked_at = now
            return False
        last = await self.bus.last_event(view.namespace, view.name)
        if last is None or last.run_uid != view.uid or last.seq != view.seq:
            return False  # deleted, or the event consumer has not caught up yet
        if view.redispatches >= MAX_REDISPATCHES:
            message = (
                f"turn {summary.turn} left the work queue {view.redispatches + 1} times "
                "without being committed (its TurnRequest was lost or its worker gave it up)"
            )
            log.error("%s/%s: %s", view.namespace, view.name, message)
            await self.runs.end(
                view.namespace, view.name, view.uid, kernel.Phase.CHECKPOINT_FAILED, message
            )
            return True
        await self._redispatch(view, summary.turn)
        return True

    async def _redispatch(self, view: RunView, turn: int) -> None:
        view.redispatches += 1
        log.warning(
            "%s/%s: turn %s is in no worker's hands and not queued; dispatching it again (%d)",
            view.namespace,
            view.name,
            turn,
            view.redispatches,
        )
        request = TurnRequest(view.uid, view.namespace, view.name, turn, view.seq, view.traceparent)
        view.queued_seq = await self.bus.publish_turn(
            request, tenant=view.tenant, attempt=view.redispatches
        )
        view.checked_at = self.clock()
