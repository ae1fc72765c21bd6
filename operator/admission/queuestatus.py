"""What a run that is not running shows: the ``Queued`` status of a waiting run, the terminal
status of a run that ends without being admitted, and the Kubernetes Events of both.

What belongs here: projecting a tenant queue's waiting runs into their status (position and
reason, written only when either changed; one Event per reason) — a run's first ``Queued``
status at once, later refreshes of positions within a rate for all queues together, the
stalest first, so a queue of 10,000 runs costs the API server no more writes a second than a
queue of ten — and ending a run that was never admitted (rejected spec, no tenant, no budget
under ``whenExhausted: Fail``, a full queue, cancelled while queued), counted once. What does
not: deciding which run is admitted or waits (``pump``), the status bodies themselves and
writing them (``runs``).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import math
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, Protocol

from agentrun import kernel
from agentrun.ledger import QueuedRun, TenantQueue
from agentrun.protocol import DEFAULT_TENANT

from .. import runs, tenants
from ..platform.events import EventRecorder, EventType, Involved

log = logging.getLogger(__name__)


class StatusSubmitter(Protocol):
    """Where run status bodies go (``StatusWriter``)."""

    def submit(
        self,
        run: runs.RunKey,
        body: Mapping[str, Any],
        *,
        seq: int,
        terminal: bool,
        on_end: Callable[[], None] | None = None,
    ) -> None:
        """Queue ``body`` as the run's status; ``on_end`` runs once this write ends the run."""


@dataclasses.dataclass(slots=True)
class Waiting:
    """What this operator knows of a queued run's status."""

    generation: int = 1
    """The AgentRun's ``metadata.generation``, written as the status' observed generation."""
    shown: tuple[int, str] | None = None
    """(position, reason) last written to the run's status."""


@dataclasses.dataclass(frozen=True, slots=True)
class QueueStatus:
    """Writes the status of runs that wait in a queue or end without being admitted."""

    writer: StatusSubmitter
    counter: runs.LiveRuns
    """Counts a run's end once (``count_end``)."""
    events: EventRecorder
    clock: Callable[[], float]
    """Epoch seconds."""
    refresh: RefreshBudget = dataclasses.field(default_factory=lambda: RefreshBudget(20.0))
    """The position refreshes allowed (``AGENTRUN_QUEUE_STATUS_WRITES``), for every tenant."""

    @classmethod
    def of(
        cls,
        writer: StatusSubmitter,
        counter: runs.LiveRuns,
        events: EventRecorder,
        *,
        rate: float,
        clock: Callable[[], float] = time.time,
    ) -> QueueStatus:
        """Wired at start-up: ``rate`` position refreshes a second for every tenant together."""
        return cls(writer, counter, events, clock, RefreshBudget(rate))

    def end_unadmitted(
        self,
        key: runs.RunKey,
        phase: kernel.Phase,
        message: str,
        *,
        tenant: str | None,
        generation: int,
        seq: int = 0,
    ) -> None:
        """End a run that was never admitted (or is not admitted again: ``seq`` is the event
        sequence its status shows, so the end is not taken for an older projection): write
        its terminal status; the write that ends the object counts the end and records its
        Event."""
        log.info("%s/%s ends unadmitted (%s): %s", key.namespace, key.name, phase.value, message)
        body = runs.rejected_status(
            message, at=self.clock(), generation=generation, phase=phase, tenant=tenant
        )
        state = kernel.stop(kernel.initial_state(goal=""), phase, message)

        def ended() -> None:  # counted once: only by the write that ended the object
            if self.counter.count_end(key.uid, state, tenant=tenant or DEFAULT_TENANT):
                runs.record_end(self.events, key, state.summary(), model=None)

        self.writer.submit(key, body, seq=seq, terminal=True, on_end=ended)

    def end_unbound(self, key: runs.RunKey, message: str, *, generation: int) -> None:
        """End a run whose namespace binds no tenant now (``message``: ``tenants.NoTenant``'s,
        naming why) ``invalid_spec``, charged to no tenant: a new run there (the admission
        handler) and a queued one whose tenant no longer binds its namespace
        (``pump``, ``rebinding``) end the same."""
        self.end_unadmitted(
            key, kernel.Phase.INVALID_SPEC, message, tenant=None, generation=generation
        )

    def hand_over(self, key: runs.RunKey, tenant: str, *, generation: int, since: float) -> None:
        """Show a queued run taken out of its queue for AgentTenant ``tenant`` of another
        operator shard, which its namespace binds now (``runs.handed_over_status``): that
        shard's owner admits it as a new run, queued from ``since`` (epoch seconds: when it
        joined the queue it leaves, its ``Admitted=False`` condition's ``lastTransitionTime``,
        which ``recovery.queued_since`` reads)."""
        message = (
            f"handed to the operator shard of AgentTenant {tenant!r}, which its namespace binds "
            "now; it is queued there"
        )
        body = runs.handed_over_status(
            tenant=tenant, message=message, at=since, generation=generation
        )
        self.writer.submit(key, body, seq=0, terminal=False)

    def show_queued(
        self,
        tenant: str,
        queue: TenantQueue,
        wait: tenants.QueueWait,
        *,
        seen: dict[str, Waiting],
        fresh: Collection[QueuedRun],
        apart: Collection[str] = (),
    ) -> None:
        """Show the tenant's waiting runs as ``Queued`` with their position and why the head
        waits: ``fresh`` (runs queued since the last call, with their current positions in
        ``queue``) at once; then, at most once a second per tenant and within ``self.refresh``, the
        runs whose status is furthest from the truth (``stalest``). ``queue`` is the tenant's
        queue, its head blocked (positions in O(log n)); ``apart``: uids of runs that wait for
        a reason of their own (shown with ``show_run``), left alone here; ``seen`` (uid → what
        the status shows) is updated, so an unchanged position and reason is not written
        again."""
        now = self.clock()
        for run in fresh:
            position = queue.position(run.uid)
            if position is not None and run.uid not in apart:
                self.show_run(tenant, run, position, wait, seen=seen)
        limit = self.refresh.available(tenant, now)
        picked: list[tuple[QueuedRun, int]] = []
        if limit:
            waiting = (run for run in queue if run.uid not in apart)
            counts = queue if apart else None  # the runs apart still take their places
            picked = stalest(waiting, seen, wait.reason.value, limit=limit, positions=counts)
            for run, position in picked:
                self.show_run(tenant, run, position, wait, seen=seen)
        self.refresh.spend(tenant, len(picked))

    def show_run(
        self,
        tenant: str,
        run: QueuedRun,
        position: int,
        wait: tenants.QueueWait,
        *,
        seen: dict[str, Waiting],
    ) -> None:
        """Write one queued run's status, at ``position`` waiting for ``wait`` (and its
        ``Queued`` Event, once per reason), unless it shows that already. Its ``Admitted=False``
        condition's ``lastTransitionTime`` is when it joined the queue (``QueuedRun.at``: its
        creation, or its rerun's start), as the convention has it: the condition has been
        False since then, whatever its reason now (``recovery.queued_since`` reads it back)."""
        known = seen.setdefault(run.uid, Waiting())
        shown = (position, wait.reason.value)
        if known.shown == shown:
            return
        if known.shown is None or known.shown[1] != wait.reason:  # an event per reason
            self.events.record(
                Involved("AgentRun", run.name, run.namespace, run.uid),
                type=EventType.NORMAL,
                reason="Queued",
                message=f"queued in AgentTenant {tenant!r} ({wait.reason}): {wait.message}",
                key=(run.uid, "Queued", wait.reason),
            )
        known.shown = shown
        why = (
            wait.message
            if position == 1
            else f"behind {position - 1} run(s); the first waits because {wait.message}"
        )
        body = runs.queued_status(
            tenant=tenant,
            reason=wait.reason.value,
            message=f"queued in AgentTenant {tenant!r} at position {position}: {why}",
            position=position,
            at=run.at,
            generation=known.generation,
        )
        self.writer.submit(
            runs.RunKey(run.namespace, run.name, run.uid), body, seq=0, terminal=False
        )


@dataclasses.dataclass(slots=True)
class RefreshBudget:
    """Status writes that may refresh queued runs' positions: ``rate`` a second for every
    tenant together (a token bucket holding at most a second's worth), each tenant's queue
    looked at most once per ``every`` seconds. So a queue of any length costs the API server
    at most ``rate`` writes a second beyond each run's first ``Queued`` status.

    The tenants share it: a look takes at most ``rate / n`` (rounded up) of the bucket, ``n``
    the tenants left wanting at their last look in the past ``2 × every`` seconds (writing all
    they were given; given none, unless they wrote fewer than given within that time) with
    the one looking. A tenant whose queue is looked at first each second and whose thousands
    of stale positions would take every write leaves the others their share; a tenant alone
    wanting takes nearly all of it (another's look given none now and then finds out whether
    that one wants again). A look takes at least one write, so more tenants wanting than
    ``rate`` would leave the ones looked at last each second none, for ever: a tenant left
    wanting and given none is owed, and another's look leaves one write of the bucket to each
    tenant owed (within ``2 × every`` seconds), so every tenant wanting is refreshed in
    turn."""

    rate: float
    every: float = 1.0
    tokens: float = 0.0
    at: float | None = None
    looked: dict[str, float] = dataclasses.field(default_factory=dict)
    """When each tenant's queue was last looked at (epoch seconds)."""
    given: dict[str, int] = dataclasses.field(default_factory=dict)
    """What each tenant's look was given, until its ``spend``."""
    wanting: dict[str, float] = dataclasses.field(default_factory=dict)
    """Tenants left wanting at their last look, by its time, the earliest first."""
    content: dict[str, float] = dataclasses.field(default_factory=dict)
    """Tenants that wrote fewer than they were given, by that look's time: given nothing
    since, within ``2 × every`` seconds, they are still taken as content."""
    owed: dict[str, float] = dataclasses.field(default_factory=dict)
    """Tenants left wanting and given nothing since a look, by its time, the earliest first:
    a write of the bucket is left to each by the others' looks, the earliest served first."""

    def available(self, tenant: str, now: float) -> int:
        """Refreshes the tenant's queue may write now (0 when it was looked at less than
        ``every`` seconds ago), its share at most; tell what it wrote with ``spend``."""
        if now - self.looked.get(tenant, -math.inf) < self.every:
            return 0
        if self.at is not None:
            self.tokens = min(self.rate, self.tokens + max(0.0, now - self.at) * self.rate)
        else:
            self.tokens = self.rate
        self.at = now
        self.looked[tenant] = now
        for lately in (self.wanting, self.content):
            while lately and next(iter(lately.values())) <= now - 2 * self.every:
                del lately[next(iter(lately))]
        while self.owed and self.looked[next(iter(self.owed))] <= now - 2 * self.every:
            del self.owed[next(iter(self.owed))]  # looked at no more: its queue is gone
        sharing = len(self.wanting) + (tenant not in self.wanting)
        given = self.given[tenant] = min(self._free(tenant), math.ceil(self.rate / sharing))
        return given

    def _free(self, tenant: str) -> int:
        """Writes of the bucket ``tenant``'s look may take: those not left to the tenants owed
        (one each); an owed tenant among the first the bucket holds a write for takes at
        least one, the others owed longer before it."""
        tokens, owed = int(self.tokens), len(self.owed)
        if tenant not in self.owed:
            return max(0, tokens - owed)
        if tenant not in itertools.islice(self.owed, tokens):
            return 0
        return max(1, tokens - owed + 1)

    def spend(self, tenant: str, writes: int) -> None:
        """``writes`` refreshes of ``tenant``'s queue were written (after ``available``; one
        that gave nothing for a look too soon leaves its wanting as it was)."""
        self.tokens = max(0.0, self.tokens - writes)
        given = self.given.pop(tenant, None)
        if given is None:
            return
        at = self.looked[tenant]
        if given == 0 and at - self.content.get(tenant, -math.inf) < 2 * self.every:
            return  # nothing to tell by: content as it was lately
        self.wanting.pop(tenant, None)
        self.content.pop(tenant, None)
        if given:
            self.owed.pop(tenant, None)
        if writes >= given:
            self.wanting[tenant] = at
            if not given:
                self.owed.setdefault(tenant, at)  # owed since its first look given none
        else:
            self.content[tenant] = at


def stalest(
    queue: Iterable[QueuedRun],
    seen: Mapping[str, Waiting],
    reason: str,
    *,
    limit: int,
    positions: TenantQueue | None = None,
) -> list[tuple[QueuedRun, int]]:
    """Up to ``limit`` runs of ``queue`` (head first) whose status is furthest from the truth,
    with their positions (counted along ``queue``, or taken from ``positions``): first those
    showing another reason (or nothing yet), nearest the head first; then those whose shown
    position is furthest from their position, relative to it (a run shown at 900 now at 450
    before one shown at 3 now at 2). O(n log limit)."""
    if limit <= 0:
        return []
    candidates: list[tuple[int, float, int, QueuedRun]] = []
    for counted, run in enumerate(queue, start=1):
        known = seen.get(run.uid)
        shown = None if known is None else known.shown
        position = counted if positions is None else (positions.position(run.uid) or counted)
        if shown == (position, reason):
            continue
        if shown is None or shown[1] != reason:
            candidates.append((0, 0.0, position, run))
        else:
            candidates.append((1, -abs(shown[0] - position) / position, position, run))
    picked = heapq.nsmallest(limit, candidates, key=lambda c: (c[0], c[1], c[2]))
    return [(run, position) for _, _, position, run in picked]
