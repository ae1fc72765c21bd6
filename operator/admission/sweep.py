"""The periodic ledger sweep and the AgentTenant status it writes.

Every few seconds, per tenant: make the ledger of a known AgentTenant that has none (the bucket
or its totals were lost, or no run came yet; its window's use rebuilt from the tenant's
AgentRuns by the store's ``rebuild`` hook, ``tenants.rebuild``), undo a rollback of its totals
(``used`` below what the operator saw in the window — in the values it read, and in the
AgentTenant status it wrote, which no NATS credential can change — or a window that has not
started: counted as a refused message, ``ledger_rollback``, and told as a ``LedgerRolledBack``
Event), start a new window when the old one is over, release holds whose worker died (charging
what the run's events show it committed, and a call of a turn that never committed what its hold
recorded or, with nothing recorded, its prompt's bound), free the slots of runs that ended while
no operator watched, end the runs of a tenant whose wall-clock budget ran out, pump its queue,
and write its AgentTenant ``.status`` and the tenant budget metrics. Each sweep reads a tenant's
totals (one value); every ``FULL_READ_EVERY`` seconds, and when its wall-clock budget ran out,
it reads every run's entry too. A ledger split in several atomic batches that never committed
(its writer died) leaves values apart nobody reads: the sweep drops them once their guard is
idle (``LedgerStore.unfinished``, ``drop_unfinished``). Invalid AgentTenants get
``Accepted=False`` with the reason.

What does not belong here: admitting runs (``pump``), the AgentTenant status and its Events
(``tenants``: the sweep tells its ``TenantStatusWriter`` when).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Protocol

from agentrun import kernel, loops, metrics
from agentrun.ledger import Book, LedgerStore, Repair, UsageFloor
from agentrun.protocol import RunEvent
from agentrun.trust import SealFault

from ..platform.failures import Failures
from ..platform.kubeapi import KubeApi
from ..platform.shards import ALL_OF_ONE, Ownership
from ..runs import LiveRuns, RunKey
from ..tenants import TenantPolicy, Tenants, TenantStatusWriter
from .queue import QueueBoard

log = logging.getLogger(__name__)

STALE_GRACE = 30.0
"""Seconds an active ledger entry without a live run view is left alone before the sweep
checks the run's events (admission in progress, an operator just restarted)."""
FULL_READ_EVERY = 10.0
"""Seconds between two reads of a tenant's whole ledger (every run's entry: for expired holds
and runs that ended unseen; or every sweep, if sweeps are further apart); the sweeps between
read its totals with the runs inline in them only (one value, whatever the tenant's size), so
a hold of a run stored apart is found expired at most this much later than one inline. Far
below a hold's TTL (60 s) and ``STALE_GRACE``."""


class EventLog(Protocol):
    """Reads runs' event streams (``Bus``)."""

    async def last_event(self, namespace: str, name: str) -> RunEvent | None:
        """The run subject's last event, if any."""


@dataclasses.dataclass(frozen=True, slots=True)
class SweepDeps:
    """The sweep's collaborators."""

    store: LedgerStore
    tenants: Tenants
    board: QueueBoard
    runs: LiveRuns
    events: EventLog
    api: KubeApi
    """Checks whether an AgentRun still exists."""
    tenant_status: TenantStatusWriter
    """Writes AgentTenant status (and records its budget moments as Kubernetes Events)."""
    clock: Callable[[], float] = time.time
    """Epoch seconds."""


class LedgerSweep:
    """Runs the sweep every ``interval`` seconds. One per operator process."""

    def __init__(
        self, deps: SweepDeps, *, interval: float = 2.0, ownership: Ownership = ALL_OF_ONE
    ) -> None:
        """``interval``: seconds between two sweeps; ``ownership``: only the tenants of its
        shards are swept (their ledger entries and AgentTenant status)."""
        self.deps = deps
        self.ownership = ownership
        self.store = deps.store
        self.clock = deps.clock
        self.interval = interval
        self.tenant_status = deps.tenant_status
        self._stopping = asyncio.Event()
        self._read_whole: dict[str, float] = {}
        """When each tenant's whole ledger was last read (epoch seconds)."""
        self._floors: dict[str, UsageFloor] = {}
        """The most each tenant's window was seen to use (``UsageFloor``)."""
        self.failures = Failures(log, what="ledger sweep")
        """Tenants whose sweep failed (each logged once, until it recovers)."""

    def stop(self) -> None:
        """Stop after the current sweep."""
        self._stopping.set()

    async def run(self) -> None:
        """Sweep every ``interval`` seconds until stopped."""
        await loops.every(self.interval, self._pass, what="ledger sweep", stopping=self._stopping)

    async def _pass(self) -> None:
        """One sweep; a failure counted and logged once (``failures``), until it recovers."""
        try:
            await self.sweep()
        except Exception as err:
            self.failures.failed("", err, subject="every tenant")
        else:
            self.failures.succeeded("", subject="every tenant")

    async def sweep(self) -> None:
        """One pass over every tenant (see the module docstring)."""
        owns = self.ownership.owns_tenant
        for name, (generation, why) in list(self.deps.tenants.invalid.items()):
            if owns(name):
                await self.tenant_status.write_invalid(name, generation, why, now=self.clock())
        names = set(self.deps.tenants.policies) | set(await self.store.tenants())
        unfinished = set(await self.store.unfinished())
        for tenant in sorted(filter(owns, names)):
            subject = f"tenant {tenant}"
            try:
                if tenant in unfinished:  # a split that never committed left values apart
                    await self.store.drop_unfinished(tenant)
                await self._sweep_tenant(tenant)
            except Exception as err:  # the next sweep tries again; logged once
                self.failures.failed(tenant, err, subject=subject)
            else:
                self.failures.succeeded(tenant, subject=subject)

    async def _sweep_tenant(self, tenant: str) -> None:
        policy = self.deps.tenants.policies.get(tenant)
        now = self.clock()
        book = await self.store.read_totals(tenant)
        if book is None and policy is None:
            return
        if book is None and policy is not None:  # lost, or no run yet: made, its use rebuilt
            await self.store.repair_entry(tenant, [], limits=policy.limits, now=now)
            book = await self.store.read(tenant)
        if book is not None:
            book = await self._undo_rollback(book, policy, now)
            wall_out = (
                book.limits.wall_seconds is not None
                and book.active_runs > 0
                and book.wall_used(now) >= book.limits.wall_seconds
            )
            every = max(FULL_READ_EVERY, self.interval)
            if wall_out or now - self._read_whole.get(tenant, 0.0) >= every:
                self._read_whole[tenant] = now
                book = await self.store.read(tenant) or book  # every run's entry
            whole = book
            book = await self._repair_entry(book, policy, now)
            self._floors[tenant] = self._floor(tenant, book).raised(
                book.window, *book.usage_floor(), end=book.end
            )
            if wall_out:
                await self._end_all(whole)
        self.deps.board.kick(tenant)  # a deleted tenant's queue too: its runs may move
        if policy is not None:
            await self.tenant_status.write_enforced(
                policy,
                book,
                queued=self.deps.board.queued(tenant),
                blocked=self.deps.board.blocked(tenant),
                now=now,
                ambiguous=self.deps.tenants.ambiguous_of(tenant),
            )

    def _floor(self, tenant: str, book: Book) -> UsageFloor:
        """The floor of ``tenant``'s entry: what this process saw, else what the AgentTenant's
        status said, else nothing below ``book``'s own window."""
        seen = self.deps.tenants.seen.get(tenant)
        floor = self._floors.get(tenant) or seen or UsageFloor(book.window, end=book.end)
        if seen is not None:
            floor = floor.raised(
                seen.window, seen.tokens, seen.cost_usd, seen.wall_seconds, end=seen.end
            )
        return floor

    async def _undo_rollback(self, book: Book, policy: TenantPolicy | None, now: float) -> Book:
        """``book`` with a rollback below its floor undone (counted and told); as read if
        there was none. The check uses the tenant's own limits, not the entry's."""
        floor = self._floor(book.tenant, book)
        if policy is not None:
            book.limits = policy.limits  # a copy as read: its window length, not a forged one
        if not book.undercuts(floor, now=now):
            return book
        metrics.record_refusal(SealFault.LEDGER_ROLLBACK)
        self.tenant_status.record_rollback(book.tenant, book, floor)
        log.warning("tenant %s: ledger entry rolled back below %s; restoring", book.tenant, floor)
        await self.store.repair_entry(
            book.tenant, [], limits=policy.limits if policy else None, now=now, floor=floor
        )
        restored = await self.store.read(book.tenant)
        return restored if restored is not None else book

    async def _repair_entry(self, book: Book, policy: TenantPolicy | None, now: float) -> Book:
        """The ledger after its repairs, limits and window are brought up to date (``book``
        holds the runs whose entries the sweep looks at: all of them, or the inline ones)."""
        repairs = await self._find_repairs(book, now)
        forget = book.forgettable(now)  # ended runs' entries whose memories expired
        if not (
            repairs
            or forget
            or (policy is not None and policy.limits != book.limits)
            or (book.reset_time <= now)
            or self.store.splits(book)  # a one-value ledger, the operator set to split
        ):
            return book
        await self.store.repair_entry(
            book.tenant,
            repairs,
            limits=policy.limits if policy else None,
            now=now,
            forget=forget,
        )
        repaired = await self.store.read_totals(book.tenant)
        assert repaired is not None
        return repaired

    async def _find_repairs(self, book: Book, now: float) -> list[Repair]:
        """What the sweep must fix, read from the runs' events before the compare-and-set;
        each repair names the entry it judged (``Repair.since``), so a rerun of the run
        admitted before it is applied (a new life, the same uid) is left alone."""
        found: list[Repair] = []
        events = self.deps.events
        for key, hold in book.expired(now):
            since = book.slot_since(hold.run_uid)
            if not hold.name:  # its run is no longer active: nothing of it left to charge
                found.append(Repair(key, hold.run_uid, None, since=since))
                continue
            last = await events.last_event(hold.namespace, hold.name)
            mine = last if last and last.run_uid == hold.run_uid else None
            if mine is None:
                found.append(Repair(key, hold.run_uid, None, since=since))
            else:
                found.append(
                    Repair(key, hold.run_uid, mine.summary, mine.time, mine.owner, since=since)
                )
        for uid, run in book.active.items():
            if self.deps.runs.is_tracked(uid) or self.deps.board.is_admitting(uid):
                continue
            if now - run.since < STALE_GRACE:
                continue
            last = await events.last_event(run.namespace, run.name)
            if last is None or last.run_uid != uid:
                found.append(Repair("", uid, None, since=book.since_of(run)))
            elif last.phase.is_terminal:
                summary, since = last.summary, book.since_of(run)
                found.append(Repair("", uid, summary, last.time, last.owner, since=since))
            else:
                await self._end_unfollowed(RunKey(run.namespace, run.name, uid))
        return found

    async def _end_unfollowed(self, key: RunKey) -> None:
        """An active run no process follows whose events have not ended: if its object is gone
        (deleted while no operator watched, or its stop failed), stop it as a deleted run
        (``LiveRuns.forget``: ended, settled, its events purged); if its status shows an end,
        end its events too. Else it is left to its resume. Either way its slot and budget
        would otherwise stay taken for ever. Best effort: the next pass tries again."""
        obj = await self.deps.api.get(key.ref)
        with contextlib.suppress(Exception):
            if obj is None or (obj.get("metadata") or {}).get("uid") != key.uid:
                await self.deps.runs.forget(key.namespace, key.name, key.uid)
            elif (obj.get("status") or {}).get("terminalReason"):
                message = "the AgentRun's status shows its end"
                await self.deps.runs.end(
                    key.namespace, key.name, key.uid, kernel.Phase.CANCELLED, message
                )

    async def _end_all(self, book: Book) -> None:
        message = (
            f"AgentTenant {book.tenant!r} used its wall-clock budget of "
            f"{book.limits.wall_seconds:.0f}s for this window"
        )
        for uid, run in list(book.active.items()):
            with contextlib.suppress(Exception):
                await self.deps.runs.end(
                    run.namespace, run.name, uid, kernel.Phase.TENANT_BUDGET_EXHAUSTED, message
                )
