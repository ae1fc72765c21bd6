"""Runs waiting for a person whose AgentRun was deleted unseen.

A run that waits for a person's decision writes nothing: no turn is dispatched, no status is
patched. Its deletion is normally seen from its ``DELETED`` watch event; one missed (a watch
that re-listed after a gap: a re-list reports the objects there, not the ones that went) would
keep the run's slot and hold, and its events, until its deadline. A running run so deleted is
found by its next status write (the writer's 404); a waiting one has none. ``WaitingCheck``
reads the object of each run that has waited at least ``every`` seconds, once every ``every``
seconds: one GET a waiting run a period, one at a time, at most ``most`` a period, so
thousands of waiting runs cost the API server a bounded rate and each is read within a few
periods. The reads of a pass go to the tenants in turn, and inside each to its namespaces in
turn (in each, the runs read longest ago first: ``platform.rounds``), so one tenant with
thousands of waiting runs, in however many namespaces, delays no other's. A run found gone
goes the way of a write that found it gone (``StatusWriter.next_gone``: stopped as a deleted
run).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from agentrun import loops

from ..platform import rounds
from .dispatch import Dispatcher
from .keys import RunKey
from .writer import StatusWriter

log = logging.getLogger(__name__)

WAITING_CHECK_EVERY = 60.0
"""Seconds between two reads of the object of a run waiting for a person (and how long a run
waits before its first read)."""
WAITING_READS = 600
"""Reads a pass makes at most (10 a second at the default period)."""


class WaitingCheck:
    """Reads the objects of the runs waiting for a person, every ``every`` seconds."""

    def __init__(
        self,
        runs: Dispatcher,
        writer: StatusWriter,
        *,
        every: float = WAITING_CHECK_EVERY,
        most: int = WAITING_READS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``runs`` names the waiting runs; ``writer`` reads each object (``exists``), hands
        a gone run out by ``next_gone`` and names whose turn a namespace's reads take
        (``StatusWriter.party``); ``most`` reads a pass at most; ``clock`` is epoch
        seconds."""
        self.runs = runs
        self.writer = writer
        self.every = every
        self.most = most
        self.clock = clock
        self._stopping = asyncio.Event()
        self._read: dict[RunKey, float] = {}
        """When each waiting run's object was last read (epoch seconds)."""

    def stop(self) -> None:
        """Let ``run`` return after its current pass."""
        self._stopping.set()

    async def run(self) -> None:
        """Until ``stop``: ``check`` every ``every`` seconds, the first after one period. An
        API server away is logged; the next pass reads again."""
        await loops.every(
            self.every,
            self.check,
            what="waiting-run check",
            stopping=self._stopping,
            wait_first=True,
        )

    async def check(self) -> int:
        """Read the object of each run that has waited ``every`` seconds or more, ``most`` at
        most, the namespaces in turn (``_turns``); returns how many were found gone (each
        handed out by the writer's ``next_gone``)."""
        now = self.clock()
        waiting = self.runs.waiting_runs(since=now - self.every)
        self._read = {key: self._read.get(key, 0.0) for key in waiting}
        gone = 0
        for key in self._turns(waiting)[: self.most]:
            self._read[key] = now
            if not await self.writer.exists(key, reread=True):
                log.info(
                    "%s/%s waited for a person and its AgentRun is gone; stopping it",
                    key.namespace,
                    key.name,
                )
                gone += 1
        return gone

    def _turns(self, waiting: list[RunKey]) -> list[RunKey]:
        """``waiting`` in reading order: each namespace's runs read longest ago (or never)
        first (ties: longest-waiting first, as given), the parties (the writer's: its tenants)
        taking turns and their namespaces inside each — the first of each, then the second of
        each, … — in the order of their longest-unread runs."""
        unread = sorted(waiting, key=self._read.__getitem__)
        party = self.writer.party
        return list(rounds.in_turn(unread, namespace=lambda key: key.namespace, party=party))
