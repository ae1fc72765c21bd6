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

from agentrun import kernel, loops
from agentrun.bus import Bus

from ..platform.failures import Failures
from .dispatch import Dispatcher
from .ports import PendingTurn

log = logging.getLogger(__name__)

MAX_REDISPATCHES = 3
"""Times a lost turn is published again before the run ends ``checkpoint_failed``."""


class OrphanWatch:
    """Finds running runs with no turn in flight and dispatches their turn again."""

    def __init__(
        self, bus: Bus, runs: Dispatcher, *, after: float, clock: Callable[[], float] = time.time
    ) -> None:
        """``runs`` gives snapshots of the pending turns, dispatches them again and ends runs
        (it alone changes its views); a run is looked at once its
        TurnRequest was published or last seen queued ``after`` seconds ago (so a lost turn is
        found within about ``1.25 × after`` seconds); ``clock`` is epoch seconds."""
        self.bus = bus
        self.runs = runs
        self.after = after
        self.clock = clock
        self._stopping = asyncio.Event()
        self.failures = Failures(log, what="orphan check")
        """Runs whose check failed (each logged once)."""

    def stop(self) -> None:
        """Let ``run`` return after its current pass."""
        self._stopping.set()

    async def run(self) -> None:
        """Until ``stop``: look at every live run each ``after / 4`` seconds (at least 0.2).

        Each look is one stream read, a second one only for a run whose request is gone; NATS
        trouble is logged and the next pass looks again.
        """
        interval = max(0.2, self.after / 4)
        await loops.every(
            interval, self._pass, what="orphan check", stopping=self._stopping, wait_first=True
        )

    async def _pass(self) -> None:
        """Check every pending turn; a run whose check failed is logged once (``failures``).
        Then hand the gate again any running run's turn that is neither published nor waiting
        (``Dispatcher.offer_stranded``)."""
        for turn in self.runs.pending_turns():
            subject = f"AgentRun {turn.key.namespace}/{turn.key.name}"
            try:
                await self.check(turn)
            except Exception as err:  # NATS trouble: the next pass looks again
                self.failures.failed(turn.key.uid, err, subject=subject)
            else:
                self.failures.succeeded(turn.key.uid, subject=subject)
        try:
            await self.runs.offer_stranded(after=self.after)
        except Exception as err:  # NATS trouble: the next pass looks again
            self.failures.failed("stranded", err, subject="turns neither published nor waiting")
        else:
            self.failures.succeeded("stranded", subject="turns neither published nor waiting")

    async def check(self, turn: PendingTurn) -> bool:
        """Re-dispatch ``turn`` if its TurnRequest is gone and no newer event came, or end the
        run ``checkpoint_failed`` once that happened ``MAX_REDISPATCHES`` times; True when it
        acted."""
        now = self.clock()
        if now - turn.checked_at < self.after:
            return False
        if await self.bus.turn_queued(turn.queued_seq):
            self.runs.still_queued(turn, at=now)
            return False
        key = turn.key
        last = await self.bus.last_event(key.namespace, key.name)
        if last is None or last.run_uid != key.uid or last.seq != turn.seq:
            return False  # deleted, or the event consumer has not caught up yet
        if turn.redispatches >= MAX_REDISPATCHES:
            message = (
                f"turn {turn.turn} left the work queue {turn.redispatches + 1} times "
                "without being committed (its TurnRequest was lost or its worker gave it up)"
            )
            log.error("%s/%s: %s", key.namespace, key.name, message)
            await self.runs.end(
                key.namespace, key.name, key.uid, kernel.Phase.CHECKPOINT_FAILED, message
            )
            return True
        log.warning(
            "%s/%s: turn %s is in no worker's hands and not queued; dispatching it again (%d)",
            key.namespace,
            key.name,
            turn.turn,
            turn.redispatches + 1,
        )
        await self.runs.redispatch(turn)
        return True
