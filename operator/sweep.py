"""The periodic ledger sweep and the AgentTenant status it writes.

Every few seconds, per tenant: start a new window when the old one is over, release holds whose
worker died (charging what the run's events show it committed), free the slots of runs that
ended while no operator watched, end the runs of a tenant whose wall-clock budget ran out, pump
its queue, and write its AgentTenant ``.status`` and the tenant budget metrics. Each sweep reads
a tenant's totals (one value); every ``FULL_READ_EVERY`` seconds, and when its wall-clock
budget ran out, it reads every run's entry too. Invalid
AgentTenants get ``Accepted=False`` with the reason.

What does not belong here: admitting runs (``pump``), the status body's shape
(``tenantstatus``, pure).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from agentrun import kernel, kube, metrics
from agentrun.ledger import Book, LedgerStore, Repair
from agentrun.protocol import RunEvent

from . import status, tenantstatus
from .pump import fetch_pending_run
from .recorder import EventRecorder, EventType, Involved
from .runs import RunKey
from .settlement import QueueBoard
from .statuswriter import MERGE_PATCH
from .tenancy import TenantPolicy
from .tenants import Tenants

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


class LiveRuns(Protocol):
    """What the sweep needs of the dispatcher."""

    def is_tracked(self, uid: str) -> bool:
        """Whether the run has a live view in this operator."""

    async def end(
        self, namespace: str, name: str, uid: str, phase: kernel.Phase, message: str
    ) -> bool:
        """Append a ``stop`` event ending the run with ``phase``."""


class EventLog(Protocol):
    """Reads runs' event streams (``Bus``)."""

    async def last_event(self, namespace: str, name: str) -> RunEvent | None:
        """The run subject's last event, if any."""


EXHAUSTED = tenantstatus.TenantCondition.BUDGET_EXHAUSTED


class TenantStatusWriter:
    """Merge-patches AgentTenant ``.status`` (skipping a body equal to the last one written),
    keeps each condition's last transition, and records the moments a person looks for as
    Kubernetes Events: a window budget used up (``BudgetExhausted``, Warning) and a new window
    (``WindowReset``, Normal)."""

    def __init__(self, api: client.ApiClient | None, *, events: EventRecorder) -> None:
        """``api`` ``None``: nothing is written (tests without an API server)."""
        self.api = api
        self.events = events
        self._windows: dict[str, Book] = {}
        """The last book seen per tenant (its window start and usage)."""
        self._written: dict[str, dict[str, Any]] = {}
        self._transitions: dict[str, dict[tenantstatus.TenantCondition, tenantstatus.Transition]]
        self._transitions = {}

    async def write_invalid(self, name: str, generation: int, why: str, *, now: float) -> None:
        """``Accepted=False`` with ``why`` for an AgentTenant that cannot be enforced."""
        projected = tenantstatus.invalid_tenant_status(
            generation, why, now=now, previous=self._transitions.get(name, {})
        )
        self._transitions[name] = projected.transitions
        await self._patch(name, projected.body)

    async def write_enforced(
        self, policy: TenantPolicy, book: Book | None, *, board: QueueBoard, now: float
    ) -> None:
        """The status of an enforced AgentTenant and its budget metrics; ``book`` ``None``:
        the tenant has no ledger entry yet (an empty one is shown)."""
        if book is None:
            book = Book.new(policy.name, policy.limits, now=now)
        before = self._transitions.get(policy.name, {}).get(EXHAUSTED)
        projected = tenantstatus.tenant_status(
            policy,
            book,
            queued=board.queued.get(policy.name, 0),
            blocked=board.blocked.get(policy.name),
            now=now,
            previous=self._transitions.get(policy.name, {}),
        )
        self._transitions[policy.name] = projected.transitions
        metrics.record_tenant_budget(policy.name, book, now=now)
        await self._patch(policy.name, projected.body)
        after = projected.transitions.get(EXHAUSTED)
        if after is not None and after.status and (before is None or not before.status):
            condition = next(
                c for c in projected.body["conditions"] if c["type"] == EXHAUSTED.value
            )
            self.events.record(
                Involved("AgentTenant", policy.name),
                type=EventType.WARNING,
                reason="BudgetExhausted",
                message=condition["message"],
                key=(policy.name, "BudgetExhausted", book.window),
            )
        self._record_window(policy.name, book)

    def _record_window(self, tenant: str, book: Book) -> None:
        previous = self._windows.get(tenant)
        self._windows[tenant] = book
        if previous is None or book.window <= previous.window:
            return
        self.events.record(
            Involved("AgentTenant", tenant),
            type=EventType.NORMAL,
            reason="WindowReset",
            message=(
                f"budget window reset: a new window runs from {status.rfc3339(book.window)} to "
                f"{status.rfc3339(book.reset_time)}; the previous one used "
                f"{previous.used_tokens} tokens, {previous.used_cost} USD"
            ),
            key=(tenant, "WindowReset", book.window),
        )

    async def _patch(self, name: str, body: dict[str, Any]) -> None:
        if self._written.get(name) == body or self.api is None:
            return
        try:
            await client.CustomObjectsApi(self.api).patch_cluster_custom_object_status(
                kube.GROUP, kube.VERSION, kube.TENANTS, name, {"status": body}, **MERGE_PATCH
            )
        except ApiException as err:
            if err.status != 404:
                log.warning("status of AgentTenant %s: HTTP %s", name, err.status)
            return
        self._written[name] = body


@dataclasses.dataclass(frozen=True, slots=True)
class SweepDeps:
    """The sweep's collaborators."""

    store: LedgerStore
    tenants: Tenants
    board: QueueBoard
    runs: LiveRuns
    events: EventLog
    api: client.ApiClient | None
    """Checks whether an AgentRun still exists; writes AgentTenant status."""
    recorder: EventRecorder
    """Records tenant budget moments as Kubernetes Events."""
    clock: Callable[[], float] = time.time
    """Epoch seconds."""


class LedgerSweep:
    """Runs the sweep every ``interval`` seconds. One per operator process."""

    def __init__(self, deps: SweepDeps, *, interval: float = 2.0) -> None:
        """``interval``: seconds between two sweeps."""
        self.deps = deps
        self.store = deps.store
        self.clock = deps.clock
        self.interval = interval
        self.tenant_status = TenantStatusWriter(deps.api, events=deps.recorder)
        self._stopping = asyncio.Event()
        self._read_whole: dict[str, float] = {}
        """When each tenant's whole ledger was last read (epoch seconds)."""

    def stop(self) -> None:
        """Stop after the current sweep."""
        self._stopping.set()

    async def run(self) -> None:
        """Sweep every ``interval`` seconds until stopped."""
        while not self._stopping.is_set():
            try:
                await self.sweep()
            except Exception:
                log.exception("ledger sweep failed; next one in %ss", self.interval)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval):
                    await self._stopping.wait()

    async def sweep(self) -> None:
        """One pass over every tenant (see the module docstring)."""
        for name, (generation, why) in list(self.deps.tenants.invalid.items()):
            await self.tenant_status.write_invalid(name, generation, why, now=self.clock())
        names = set(self.deps.tenants.policies) | set(await self.store.tenants())
        for tenant in sorted(names):
            try:
                await self._sweep_tenant(tenant)
            except Exception:
                log.exception("sweep of tenant %s failed", tenant)

    async def _sweep_tenant(self, tenant: str) -> None:
        policy = self.deps.tenants.policies.get(tenant)
        now = self.clock()
        book = await self.store.read_totals(tenant)
        if book is None and policy is None:
            return
        if book is not None:
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
            if wall_out:
                await self._end_all(whole)
        if policy is not None:
            self.deps.board.kick(tenant)
            await self.tenant_status.write_enforced(policy, book, board=self.deps.board, now=now)

    async def _repair_entry(self, book: Book, policy: TenantPolicy | None, now: float) -> Book:
        """The ledger after its repairs, limits and window are brought up to date (``book``
        holds the runs whose entries the sweep looks at: all of them, or the inline ones)."""
        repairs = await self._find_repairs(book, now)
        if not (
            repairs
            or (policy is not None and policy.limits != book.limits)
            or (book.window + book.limits.window_seconds <= now)
        ):
            return book
        await self.store.repair_entry(
            book.tenant, repairs, limits=policy.limits if policy else None, now=now
        )
        repaired = await self.store.read_totals(book.tenant)
        assert repaired is not None
        return repaired

    async def _find_repairs(self, book: Book, now: float) -> list[Repair]:
        """What the sweep must fix, read from the runs' events before the compare-and-set."""
        found: list[Repair] = []
        events = self.deps.events
        for key, hold in book.expired(now):
            if not hold.name:  # its run is no longer active: nothing of it left to charge
                found.append(Repair(key, hold.run_uid, None))
                continue
            last = await events.last_event(hold.namespace, hold.name)
            mine = last if last and last.run_uid == hold.run_uid else None
            if mine is None:
                found.append(Repair(key, hold.run_uid, None))
            else:
                found.append(Repair(key, hold.run_uid, mine.summary, mine.time, mine.owner))
        for uid, run in book.active.items():
            if self.deps.runs.is_tracked(uid) or uid in self.deps.board.admitting:
                continue
            if now - run.since < STALE_GRACE:
                continue
            last = await events.last_event(run.namespace, run.name)
            if last is None or last.run_uid != uid:
                found.append(Repair("", uid, None))
            elif last.phase.is_terminal:
                found.append(Repair("", uid, last.summary, last.time, last.owner))
            elif (
                await fetch_pending_run(self.deps.api, RunKey(run.namespace, run.name, uid)) is None
            ):
                # its object was removed while no operator watched (e.g. a finalizer forced
                # off): end it, or its slot and budget would stay taken forever
                with contextlib.suppress(Exception):
                    await self.deps.runs.end(
                        run.namespace, run.name, uid, kernel.Phase.CANCELLED, "the AgentRun is gone"
                    )
        return found

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
