"""Fair shares of the worker slots: running runs' TurnRequests reach the work queue in fair
order, and only while its backlog is short.

Why here: every worker pulls TurnRequests from one shared consumer in stream order (one
consumer, so KEDA and the orphan watch see one queue), and a run has one TurnRequest at a time.
Published as their turns became ready, a tenant with 1,000 runs going would put 1,000 requests
ahead of another tenant's one: that turn would wait for 1,000 others. So the dispatcher hands
each ready turn to a ``TurnGate`` instead, which publishes it

- only while the work queue's undelivered backlog is under ``backlog`` plus the workers' pull
  requests waiting for work (a short queue: a turn published now waits behind at most that
  many others), and
- in fair order: the tenant with the fewest turns published and not yet done goes first (ties:
  the one served longest ago), skipping a tenant at its AgentTenant's ``maxConcurrentTurns``.

A newly ready turn of a tenant with nothing in flight is therefore next as soon as a worker
slot frees: with one tenant flooding, another tenant's turn waits about one turn's time, not
the flood's. A quiet queue costs nothing: a turn is published at once while there is room, and
every turn a worker commits makes room for one more without asking the server; the backlog is
read back from the consumer (``Bus.turn_backlog``) only when the estimate says the queue is
full, at most every ``poll`` seconds, and every second while turns wait, so an estimate that
drifted (a stale request acked uncommitted) is corrected.

The commit rule and the de-duplication are untouched: a published TurnRequest is the same
message with the same ``Nats-Msg-Id``; only the moment it is published moves. A turn waiting
here is in memory only; an operator that dies loses nothing, because the next leader
re-dispatches every running run's pending turn from its events (``Dispatcher.recover``).

What belongs here: ``TurnQueue`` and ``Backlog`` (pure: the fair order, the caps, the backlog
estimate) and ``TurnGate`` (the loop that publishes through the dispatcher). What does not:
deciding a run's next turn or publishing it (``dispatch``).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Protocol

from agentrun.loops import sleep_until_set
from agentrun.protocol import TurnRequest

from ..platform.failures import Failures

log = logging.getLogger(__name__)

BACKLOG = 2
"""Default most TurnRequests the work queue holds undelivered beyond the workers' waiting pull
requests (``AGENTRUN_TURN_BACKLOG``)."""
POLL_SECONDS = 0.05
"""Least seconds between two reads of the consumer's backlog while the queue is full."""
REFRESH_SECONDS = 1.0
"""Seconds between two reads of the backlog while turns wait, whatever the estimate says."""


@dataclasses.dataclass(frozen=True, slots=True)
class ReadyTurn:
    """A running run's next TurnRequest, waiting to be published."""

    request: TurnRequest
    tenant: str
    since: float
    """When the event it builds on was committed (epoch seconds; 0: unknown)."""
    attempt: int = 0
    """> 0: a re-dispatch of a lost turn (``Bus.publish_turn``'s ``attempt``)."""

    @property
    def uid(self) -> str:
        """The run's uid."""
        return self.request.run_uid


class TurnQueue:
    """The ready turns per tenant, and the turns each tenant has published and not yet done.
    Pure: no I/O, no clock."""

    def __init__(self) -> None:
        self._ready: dict[str, collections.deque[ReadyTurn]] = {}
        """Per tenant, its ready turns in the order they became ready."""
        self._where: dict[str, str] = {}
        """uid → tenant of each run with a ready turn here."""
        self._flying: dict[str, dict[str, ReadyTurn]] = {}
        """Per tenant, uid → the turn ``take`` gave out, published and not yet done."""
        self._served = 0
        self._last_served: dict[str, int] = {}
        """Per tenant, when it was last served (a counter: lower is longer ago)."""

    @property
    def waiting(self) -> int:
        """Ready turns not yet published."""
        return len(self._where)

    def in_flight(self, tenant: str) -> int:
        """Turns of ``tenant`` published and not yet done."""
        return len(self._flying.get(tenant, ()))

    def holds(self, uid: str) -> bool:
        """Whether the run's turn waits here or was taken to be published."""
        return uid in self._where or any(uid in flying for flying in self._flying.values())

    def put(self, turn: ReadyTurn) -> None:
        """A run's turn is ready (replacing a turn of the same run still waiting)."""
        self.discard(turn.uid)
        self.done(turn.uid)  # its earlier turn, if any, is over: the run moved on
        self._ready.setdefault(turn.tenant, collections.deque()).append(turn)
        self._where[turn.uid] = turn.tenant

    def put_back(self, turn: ReadyTurn) -> None:
        """A turn ``take`` gave out could not be published: first again in its tenant, no
        longer counted in flight. Dropped instead when its run moved on while it was being
        published (a newer turn of the run was put, or the run's turn was done or
        discarded): the run waits on it no longer, and a run has one turn here at most."""
        flying = self._flying.get(turn.tenant, {})
        if flying.get(turn.uid) is not turn or turn.uid in self._where:
            return
        self.done(turn.uid)
        self._ready.setdefault(turn.tenant, collections.deque()).appendleft(turn)
        self._where[turn.uid] = turn.tenant

    def discard(self, uid: str) -> None:
        """The run's waiting turn, if any, will not be published (the run ended or moved on)."""
        tenant = self._where.pop(uid, None)
        if tenant is None:
            return
        ready = self._ready[tenant]
        for turn in ready:
            if turn.uid == uid:
                ready.remove(turn)
                break
        if not ready:
            del self._ready[tenant]

    def done(self, uid: str) -> None:
        """The run's published turn is over (its event came, or the run ended)."""
        for tenant, flying in list(self._flying.items()):
            if uid in flying:
                del flying[uid]
                if not flying:
                    del self._flying[tenant]
                return

    def take(self, cap: Callable[[str], int | None]) -> ReadyTurn | None:
        """The next turn to publish, counted as published: of the tenant with the fewest
        turns in flight (ties: the one served longest ago), skipping tenants whose in-flight
        turns reached ``cap(tenant)`` (``None``: no cap); ``None`` when no tenant may go."""
        eligible = [
            tenant
            for tenant in self._ready
            if (most := cap(tenant)) is None or self.in_flight(tenant) < most
        ]
        if not eligible:
            return None
        tenant = min(eligible, key=lambda t: (self.in_flight(t), self._last_served.get(t, -1)))
        ready = self._ready[tenant]
        turn = ready.popleft()
        if not ready:
            del self._ready[tenant]
        del self._where[turn.uid]
        self._flying.setdefault(tenant, {})[turn.uid] = turn
        self._served += 1
        self._last_served[tenant] = self._served
        return turn

    def unpublished(self, turn: ReadyTurn) -> None:
        """A turn ``take`` gave out was not published after all (its run moved on)."""
        self.done(turn.uid)


@dataclasses.dataclass(slots=True)
class Backlog:
    """The work queue's undelivered backlog as last read, moved on by what was published and
    committed since. Pure: times are passed in (monotonic seconds)."""

    limit: int = BACKLOG
    """Most TurnRequests left undelivered beyond the workers' waiting pull requests."""
    pending: int = 0
    """Undelivered TurnRequests at the last read."""
    pulls: int = 0
    """Workers' pull requests waiting for work at the last read (free slots asking)."""
    published: int = 0
    """TurnRequests published since the last read."""
    freed: int = 0
    """Turns committed since the last read (each freed the slot of a worker, which takes the
    next undelivered request)."""
    read_at: float | None = None
    """When it was last read (``None``: never)."""

    def room(self) -> int:
        """How many more TurnRequests may be published now."""
        return self.limit + self.pulls + self.freed - self.pending - self.published

    def read(self, *, pending: int, pulls: int, at: float) -> None:
        """The backlog as read from the consumer at ``at``."""
        self.pending, self.pulls = pending, pulls
        self.published = self.freed = 0
        self.read_at = at

    def read_due(self, now: float, *, waiting: int) -> bool:
        """Whether to read the backlog now: the estimate says the queue is full and the last
        read is ``POLL_SECONDS`` old, or turns wait and it is ``REFRESH_SECONDS`` old."""
        if self.read_at is None:
            return self.room() <= 0
        age = now - self.read_at
        return (self.room() <= 0 and age >= POLL_SECONDS) or (
            waiting > 0 and age >= REFRESH_SECONDS
        )

    def next_read(self, now: float) -> float:
        """Seconds until a read may be due (while the queue is full)."""
        if self.read_at is None:
            return 0.0
        return max(0.0, self.read_at + POLL_SECONDS - now)


class Publisher(Protocol):
    """Publishes a ready turn (the dispatcher, which owns the runs' views)."""

    async def publish_ready(self, turn: ReadyTurn) -> bool:
        """Publish ``turn`` if its run still waits on it; False when the run moved on. Raises
        what publishing raises."""


class BacklogSource(Protocol):
    """Reads the work queue's backlog (``Bus``)."""

    async def turn_backlog(self) -> tuple[int, int]:
        """(TurnRequests not yet delivered, workers' pull requests waiting)."""


class TurnCaps(Protocol):
    """Each tenant's cap on its turns in flight (the AgentTenants, ``tenants.Tenants``)."""

    def max_concurrent_turns(self, tenant: str) -> int | None:
        """``spec.maxConcurrentTurns`` of ``tenant``'s AgentTenant; ``None``: no cap."""


class TurnGate:
    """Publishes ready turns in fair order while the work queue has room (see the module)."""

    def __init__(
        self,
        publisher: Publisher,
        backlog: BacklogSource,
        *,
        caps: TurnCaps,
        limit: int = BACKLOG,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``limit``: ``Backlog.limit``; ``clock``: monotonic seconds."""
        self.publisher = publisher
        self.source = backlog
        self.caps = caps
        self.clock = clock
        self.queue = TurnQueue()
        self.backlog = Backlog(limit=limit)
        self.failures = Failures(log, what="publishing turns")
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._lock = asyncio.Lock()
        """One step at a time: the loop's, or the one ``offer`` takes itself."""

    # --- told by the dispatcher -------------------------------------------------------------

    async def offer(self, turn: ReadyTurn) -> None:
        """A run's next turn is ready. When nothing else waits, it is published (or the
        backlog read) here and now, so a quiet queue adds no hop; else the loop publishes it
        in its fair place. Never raises: a failed publication is retried by the loop."""
        self.queue.put(turn)
        self._wake.set()
        if self.queue.waiting > 1 or self._lock.locked():
            return
        async with self._lock:
            while self.queue.waiting and await self._step() == 0.0:
                pass

    def committed(self, uid: str) -> None:
        """A worker committed the run's turn: it is done, and its worker slot is free."""
        self.queue.done(uid)
        self.backlog.freed += 1
        self._wake.set()

    def moved_on(self, uid: str) -> None:
        """The run moved on without a worker's commit (a ``stop`` or ``approval`` event, an
        end, a deletion): neither its waiting nor its published turn counts any longer."""
        self.queue.discard(uid)
        self.queue.done(uid)
        self._wake.set()

    def stop(self) -> None:
        """End ``run`` at its next pass."""
        self._stopping.set()
        self._wake.set()

    # --- the loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Publish ready turns while there is room, in fair order, until ``stop``."""
        while not self._stopping.is_set():
            self._wake.clear()
            async with self._lock:
                delay = await self._step()
            if delay != 0.0:
                await sleep_until_set(self._wake, delay)

    async def _step(self) -> float | None:
        """One step: read the backlog, or publish one turn; returns how long to wait for a
        wake-up before the next (0: none; ``None``: until woken)."""
        now = self.clock()
        if not self.queue.waiting:
            return None
        if self.backlog.read_due(now, waiting=self.queue.waiting):
            return await self._read_backlog(now)
        if self.backlog.room() <= 0:
            return self.backlog.next_read(now) or POLL_SECONDS
        turn = self.queue.take(self.caps.max_concurrent_turns)
        if turn is None:
            return None  # every waiting tenant is at its cap: a commit wakes us
        return await self._publish(turn)

    async def _read_backlog(self, now: float) -> float:
        try:
            pending, pulls = await self.source.turn_backlog()
        except Exception as err:  # NATS away: publishing would fail too; try again shortly
            self.failures.failed("backlog", err, subject="the work queue's backlog")
            self.backlog.read(pending=self.backlog.limit, pulls=0, at=now)
            return REFRESH_SECONDS
        self.failures.succeeded("backlog", subject="the work queue's backlog")
        self.backlog.read(pending=pending, pulls=pulls, at=now)
        return 0.0

    async def _publish(self, turn: ReadyTurn) -> float:
        subject = f"turn {turn.request.turn} of {turn.request.namespace}/{turn.request.name}"
        try:
            published = await self.publisher.publish_ready(turn)
        except Exception as err:  # NATS away: keep its place, try again shortly
            self.queue.put_back(turn)
            self.failures.failed("publish", err, subject=subject)
            return REFRESH_SECONDS
        self.failures.succeeded("publish", subject="turns")
        if published:
            self.backlog.published += 1
        else:
            self.queue.unpublished(turn)
        return 0.0
