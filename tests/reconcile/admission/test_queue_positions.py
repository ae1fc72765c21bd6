"""A queued run shows its reason and position at any queue length, at a cost that does not grow
with the queue: its first ``Queued`` status is written at once (its position found in O(log n)),
later position refreshes within a rate for every tenant together, the stalest first; a tenant's
queue is bounded only by the platform's setting, and a run over it ends with a typed reason that
says so (never ``checkpoint_failed``) — unless its ledger is one value (``single``), whose queue
keeps the earlier releases' cap and reason."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

from kube_support import FakeKube
from nats.aio.client import Client as NATS

from agentrun import kernel
from agentrun.ledger import LedgerStore, QueuedRun, TenantQueue
from agentrun.operator.admission.pump import PumpDeps, QueuePump
from agentrun.operator.admission.queue import QueueBoard
from agentrun.operator.admission.queuestatus import QueueStatus, RefreshBudget, Waiting, stalest
from agentrun.operator.platform import events as recorder
from agentrun.operator.platform.events import EventRecorder
from agentrun.operator.runs import RunKey
from agentrun.operator.tenants import QueueWait, Tenants, WaitReason

NOW = 1.8e9
EARLIER_CAP = 1_000
"""Runs a one-value tenant's queue held in earlier releases."""
WAIT = QueueWait(WaitReason.CONCURRENCY_LIMIT, "2000 of maxConcurrentRuns 2000 runs are active")


class Writes:
    """The status writer and end counter, recording what they are told."""

    def __init__(self) -> None:
        self.bodies: dict[str, dict[str, Any]] = {}
        self.count = 0
        self.counted: list[kernel.RunState] = []

    def submit(
        self,
        key: RunKey,
        body: dict[str, Any],
        *,
        seq: int,
        terminal: bool,
        on_end: Callable[[], None] | None = None,
    ) -> None:
        self.bodies[key.uid] = body
        self.count += 1
        if on_end is not None:
            on_end()  # the write that ended the object

    def count_end(self, uid: str, state: kernel.RunState, *, tenant: str) -> bool:
        self.counted.append(state)
        return True


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def long_queue(runs: int) -> TenantQueue:
    queue = TenantQueue()
    for i in range(runs):
        queue.add(QueuedRun(f"u{i}", "ns", f"r{i}", NOW + i / 1e3), arrival=i)
    return queue


def shown_status(writes: Writes) -> QueueStatus:
    events = EventRecorder(FakeKube(), throttle=recorder.standard_throttle())
    return QueueStatus.of(writes, writes, events, rate=20, clock=Clock())  # type: ignore[arg-type]


def test_every_run_of_a_queue_of_10_000_shows_its_position_once_it_is_queued() -> None:
    queue, writes, seen = long_queue(10_000), Writes(), dict[str, Waiting]()
    shown = shown_status(writes)
    shown.show_queued("t", queue, WAIT, seen=seen, fresh=queue.runs())
    assert writes.count == 10_000  # the first status of each run, whatever the rate
    assert writes.bodies["u0"]["queuePosition"] == 1
    assert writes.bodies["u9999"]["queuePosition"] == 10_000
    assert "at position 10000: behind 9999 run(s)" in writes.bodies["u9999"]["message"]
    assert writes.bodies["u4321"]["conditions"][0]["reason"] == "ConcurrencyLimit"


def test_positions_are_refreshed_within_the_rate_the_stalest_first() -> None:
    queue, writes, seen = long_queue(10_000), Writes(), dict[str, Waiting]()
    shown = shown_status(writes)
    clock: Clock = shown.clock  # type: ignore[assignment]
    shown.show_queued("t", queue, WAIT, seen=seen, fresh=queue.runs())
    for i in range(500):  # 500 runs admitted from the head: every position moved
        queue.remove(f"u{i}")
    writes.count = 0
    clock.now += 0.5  # looked at half a second ago: not again yet
    shown.show_queued("t", queue, WAIT, seen=seen, fresh=[])
    assert writes.count == 0
    clock.now += 1.0
    shown.show_queued("t", queue, WAIT, seen=seen, fresh=[])
    assert writes.count == 20  # one second's worth, not 9,500
    # the furthest from the truth relative to their position: the new head first
    assert writes.bodies["u500"]["queuePosition"] == 1
    assert {uid for uid in writes.bodies if writes.bodies[uid]["queuePosition"] <= 20} >= {
        f"u{i}" for i in range(500, 520)
    }
    for _ in range(60):  # a minute later every run near the head shows the truth
        clock.now += 1.0
        shown.show_queued("t", queue, WAIT, seen=seen, fresh=[])
    assert all(seen[f"u{i}"].shown == (i - 499, "ConcurrencyLimit") for i in range(500, 1_700))


def test_a_new_reason_reaches_the_head_first() -> None:
    queue, seen = long_queue(50), {}
    for position, run in enumerate(queue, start=1):
        seen[run.uid] = Waiting(shown=(position, "ConcurrencyLimit"))
    picked = stalest(queue, seen, "BudgetHeld", limit=3)
    assert [(run.uid, position) for run, position in picked] == [("u0", 1), ("u1", 2), ("u2", 3)]
    assert stalest(queue, seen, "ConcurrencyLimit", limit=3) == []  # nothing moved
    assert stalest(queue, seen, "BudgetHeld", limit=0) == []


def test_the_refresh_budget_is_shared_by_every_tenant_and_saves_up_a_second_at_most() -> None:
    budget = RefreshBudget(10)
    assert budget.available("a", NOW) == 10
    budget.spend("a", 10)
    assert budget.available("b", NOW + 0.35) == 3  # another tenant: the same bucket
    budget.spend("b", 3)
    assert budget.available("a", NOW + 0.5) == 0  # looked at less than a second ago
    budget.spend("a", 0)
    assert budget.available("a", NOW + 100) == 10  # a second's worth, never more


def test_a_tenant_looked_at_first_each_second_leaves_another_its_share() -> None:
    """Tenant A's queue, thousands of positions stale, is looked at first every second: it took
    every write of the bucket, and tenant B's stale positions were never refreshed. Each takes
    its share while both want more; A alone, once B wants none, takes most of it again."""
    budget, got = RefreshBudget(20), {"a": 0, "b": 0}
    for second in range(10):
        for tenant, stale in (("a", 10_000), ("b", 10_000 if second < 5 else 0)):
            given = budget.available(tenant, NOW + second + 0.01 * (tenant == "b"))
            budget.spend(tenant, min(given, stale))
            got[tenant] += min(given, stale)
        if second == 4:
            assert got == {"a": 20 + 4 * 10, "b": 4 * 10}, got  # B's first look got nothing
    assert got["a"] >= 60 + 10 + 3 * 20, got  # B content from second 5: A takes most of it


class Policy:
    def __init__(self) -> None:
        self.name = f"overflowing-{uuid.uuid4().hex[:6]}"


class NoConfigs:
    """The pump's run configs, none built (a run refused at the queue is never built)."""

    def forget(self, uid: str) -> None:
        """Nothing is kept."""


def queue_pump(store: LedgerStore, writes: Writes, *, max_queued: int) -> QueuePump:
    """A pump over ``store`` whose status writes go to ``writes``."""
    deps: Any = dict.fromkeys(("settlement", "storage"))
    deps["configs"] = NoConfigs()  # the refused run's build is dropped: nothing kept here
    api = FakeKube()
    deps["tenants"] = Tenants(api)  # type: ignore[arg-type]  # binding nothing
    events = EventRecorder(api, throttle=recorder.standard_throttle())
    shown = QueueStatus(writes, writes, events, time.time)  # type: ignore[arg-type]
    return QueuePump(
        PumpDeps(
            store=store,
            runs=writes,
            shown=shown,
            board=QueueBoard(),
            events=events,
            api=api,
            **deps,
        ),  # type: ignore[arg-type]
        max_queued=max_queued,
    )


async def test_a_run_over_the_platforms_queue_limit_ends_saying_so_for_that_run_only(
    client: NATS,
) -> None:
    store = await LedgerStore.open(client.jetstream(), bucket="AGENTRUN_LEDGER_QUEUE_TEST")
    writes = Writes()
    pump = queue_pump(store, writes, max_queued=3)
    policy = Policy()
    for i in range(3):
        key = RunKey("ns", f"r{i}", str(uuid.uuid4()))
        await pump.enqueue_run(key, policy, generation=1, created=NOW + i)  # type: ignore[arg-type]
    assert writes.counted == [] and len(await store.queue(policy.name)) == 3
    late = RunKey("ns", "late", str(uuid.uuid4()))
    await pump.enqueue_run(late, policy, generation=1, created=NOW + 99)  # type: ignore[arg-type]
    assert [s.phase for s in writes.counted] == [kernel.Phase.TENANT_BUDGET_EXHAUSTED]
    body = writes.bodies[late.uid]
    assert body["terminalReason"] == "tenant_budget_exhausted" and body["outcome"] == "none"
    assert (
        "holds 3 runs, the most the platform allows (AGENTRUN_MAX_QUEUED_RUNS)" in (body["message"])
    )
    assert len(await store.queue(policy.name)) == 3  # the queued runs keep their places


async def test_a_one_value_tenants_queue_takes_runs_past_the_earlier_cap(client: NATS) -> None:
    """B14: a tenant whose ledger is one value (``single``, the default) queues its 1,001st
    run like any other (earlier releases ended it ``checkpoint_failed``): the queue is one
    value per run in both layouts, so only ``AGENTRUN_MAX_QUEUED_RUNS`` bounds it."""
    store = await LedgerStore.open(client.jetstream(), bucket="AGENTRUN_LEDGER_QUEUE_TEST")
    writes = Writes()
    pump = queue_pump(store, writes, max_queued=0)
    policy = Policy()
    for start in range(0, EARLIER_CAP, 100):
        await asyncio.gather(
            *(
                store.enqueue(policy.name, QueuedRun(f"q{i}", "ns", f"q{i}", NOW + i))
                for i in range(start, start + 100)
            )
        )
    late = RunKey("ns", "late", str(uuid.uuid4()))
    await pump.enqueue_run(late, policy, generation=1, created=NOW + 9_999)  # type: ignore[arg-type]
    assert writes.counted == []
    assert len(await store.queue(policy.name)) == EARLIER_CAP + 1
    assert store.position(policy.name, late.uid) == EARLIER_CAP + 1


def test_more_tenants_wanting_than_writes_a_second_each_get_some() -> None:
    """30 tenants' queues, each with thousands of stale positions, are looked at in the same
    order every second with 20 writes a second for all: each look takes at least one write,
    so the first 20 took every write each second and the last 10 never got one. Those given
    nothing are owed the next writes, so every tenant is refreshed in turn."""
    budget = RefreshBudget(20)
    tenants = [f"t{n:02}" for n in range(30)]
    got = dict.fromkeys(tenants, 0)
    for second in range(10):
        for n, tenant in enumerate(tenants):
            given = budget.available(tenant, NOW + second + 0.001 * n)
            budget.spend(tenant, given)
            got[tenant] += given
    assert min(got.values()) >= 4, got  # 200 writes over 30 tenants: about 6.7 each
    assert sum(got.values()) >= 180, got  # the bucket still spent
