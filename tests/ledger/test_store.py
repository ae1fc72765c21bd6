"""``LedgerStore`` against a real nats-server with JetStream (session fixture ``nats_server``).

Every test uses its own tenant (the ``AGENTRUN_LEDGER`` bucket is shared by the session). Two
stores on two NATS connections stand in for two processes: their writes to one entry race, and
only compare-and-set on the entry's revision keeps the tenant within its limits (concurrent
turns of one tenant: only those that fit run).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from decimal import Decimal
from typing import Any

import nats
import pytest
from kv_support import live_keys
from nats.aio.client import Client as NATS

from agentrun import kernel
from agentrun.ledger import (
    BookMissing,
    BudgetRefusal,
    CallNeed,
    Hold,
    LedgerStore,
    LedgerUnavailable,
    QueuedRun,
    QueueFull,
    Repair,
    TenantLimits,
    TurnRef,
    codec,
)
from agentrun.ledger.store import BUCKET, book_key, queue_key
from agentrun_dev import natsserver

from .conftest import TEST_BUCKET

Opener = Callable[..., Awaitable[LedgerStore]]


def tenant_name() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def open_store(nats_server: natsserver.NatsServer) -> AsyncIterator[Opener]:
    """``await open_store(**kwargs)``: a LedgerStore on its own NATS connection."""
    clients: list[NATS] = []

    async def opener(**kwargs: object) -> LedgerStore:
        client = await nats.connect(**nats_server.client_options())
        clients.append(client)
        return await LedgerStore.open(client.jetstream(), bucket=TEST_BUCKET, **kwargs)  # type: ignore[arg-type]

    yield opener
    for client in clients:
        await client.close()


async def test_open_binds_the_ledger_bucket(open_store: Opener, nats_server: Any) -> None:
    store = await open_store()
    assert store.kv._name == TEST_BUCKET  # type: ignore[attr-defined]
    again = await open_store()  # binding an existing bucket works too
    assert again.kv._name == TEST_BUCKET  # type: ignore[attr-defined]
    client = await nats.connect(**nats_server.client_options())
    try:
        default = await LedgerStore.open(client.jetstream())
        assert default.kv._name == BUCKET == "AGENTRUN_LEDGER"  # type: ignore[attr-defined]
    finally:
        await client.close()


async def test_change_creates_the_entry_with_the_given_limits(open_store: Opener) -> None:
    store = await open_store()
    tenant = tenant_name()
    assert await store.read(tenant) is None
    given = TenantLimits(tokens=5_000, cost_usd=Decimal("5.00"), max_concurrent_runs=2)
    refusal = await store._change(
        tenant, lambda b: b.admit("uid-1", "ns", "run", now=store.clock()), limits=given
    )
    assert refusal is None
    stored = await store.read(tenant)
    assert stored is not None
    assert stored.tenant == tenant
    assert stored.limits == given
    assert str(stored.limits.cost_usd) == "5.00"
    assert list(stored.active) == ["uid-1"]
    # limits only seed a missing entry; later changes keep what is stored
    await store._change(tenant, lambda b: None, limits=TenantLimits(tokens=1))
    assert (await store.read(tenant)).limits == given  # type: ignore[union-attr]


async def test_a_missing_book_is_no_budget_never_an_unlimited_one(open_store: Opener) -> None:
    """Only an admission (with the AgentTenant's limits) makes a book: a call of a tenant with
    none is refused, and nothing a turn does creates one."""
    store = await open_store()
    tenant = tenant_name()
    with pytest.raises(BookMissing, match="no ledger book"):
        await store._change(tenant, lambda b: b.used_tokens)
    ref = TurnRef(tenant, "run", "ns", "r", 0)
    hold = Hold("run", 0, 0, Decimal(0), store.clock() + 60, "o")
    refused = await store.reserve_call(
        ref,
        CallNeed(prompt_tokens=10, output_tokens=10, pricing=kernel.Pricing()),
        hold,
        before=None,
        prior_owner="",
        now=store.clock(),
    )
    assert isinstance(refused, BudgetRefusal) and "no budget" in refused.message
    assert await store.reserve_turn(ref, hold, before=None, prior_owner="", now=1.0) is not None
    assert not await store.record_spend(ref, owner="o", usage=kernel.Usage(5, 5))
    assert not await store.refresh_hold(ref, owner="o", expires=2.0)
    assert not await store.release_hold(ref, owner="o")
    assert not await store.close_run(tenant, "run", None, end=1.0)
    assert await store.settle_turn(
        ref, owner="o", prior_owner="", after=kernel.Usage(5, 5), now=1.0
    ) == (0, Decimal(0))
    assert await store.read(tenant) is None  # still no book: nobody made one up


async def test_a_change_that_changes_nothing_writes_nothing(open_store: Opener) -> None:
    store = await open_store()
    tenant = tenant_name()
    await store._change(tenant, lambda b: None, limits=TenantLimits(tokens=10))
    revision = (await store.kv.get(book_key(tenant))).revision
    refused = await store._change(
        tenant,
        lambda b: b.reserve("r:0", Hold("r", 0, 11, Decimal(0), 0.0, "o"), now=store.clock()),
    )
    assert refused is not None and refused.resource == "tokens"
    assert (await store.kv.get(book_key(tenant))).revision == revision


async def test_a_stale_cached_revision_is_detected_and_the_change_reapplied(
    open_store: Opener,
) -> None:
    one, two = await open_store(), await open_store()
    tenant = tenant_name()
    await one._change(
        tenant, lambda b: b.admit("a", "ns", "a", now=one.clock()), limits=TenantLimits()
    )
    await two._change(tenant, lambda b: b.admit("b", "ns", "b", now=two.clock()))
    # one's cached copy lacks "b": its first write must lose, re-read and keep "b"
    await one._change(tenant, lambda b: b.admit("c", "ns", "c", now=one.clock()))
    assert one.conflicts == 1
    stored = await one.read(tenant)
    assert stored is not None and set(stored.active) == {"a", "b", "c"}


async def test_exhausting_the_attempts_raises_ledger_unavailable(open_store: Opener) -> None:
    one, two = await open_store(attempts=1, patience=0), await open_store()
    tenant = tenant_name()
    await one._change(
        tenant, lambda b: b.admit("a", "ns", "a", now=one.clock()), limits=TenantLimits()
    )
    await two._change(tenant, lambda b: b.admit("b", "ns", "b", now=two.clock()))
    with pytest.raises(LedgerUnavailable, match="1 compare-and-set attempts"):
        await one._change(tenant, lambda b: b.admit("c", "ns", "c", now=one.clock()))
    assert one.conflicts == 1
    stored = await two.read(tenant)
    assert stored is not None and set(stored.active) == {"a", "b"}  # "c" never landed


async def test_a_monkeypatched_stale_revision_with_one_attempt_raises(
    open_store: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await open_store(attempts=1, patience=0)
    tenant = tenant_name()
    await store._change(
        tenant, lambda b: b.admit("a", "ns", "a", now=store.clock()), limits=TenantLimits()
    )
    key = book_key(tenant)
    revision, data = store._cache[key]
    monkeypatch.setitem(store._cache, key, (revision - 1 if revision > 1 else 10**9, data))
    with pytest.raises(LedgerUnavailable):
        await store._change(tenant, lambda b: b.admit("b", "ns", "b", now=store.clock()))
    assert store.conflicts == 1


async def reserve_and_settle(
    store: LedgerStore, tenant: str, uid: str, tokens: int, actual: int, delay: float = 0.0
) -> tuple[int, Decimal] | None:
    """One turn: reserve ``tokens``; if held, settle ``actual`` (what the settle charged).

    ``delay`` spreads the turns out so the stores' group commits interleave and race."""
    await asyncio.sleep(delay)
    now = store.clock()
    hold = Hold(uid, 0, tokens, Decimal(0), now + 60, f"owner-{uid}", "ns", uid)
    refusal = await store._change(tenant, lambda b: b.reserve(f"{uid}:0", hold, now=now))
    if refusal is not None:
        assert refusal.resource == "tokens"
        return None
    await asyncio.sleep(0)
    return await store._change(
        tenant,
        lambda b: b.settle(
            uid, turn=0, tokens=actual, cost_usd=Decimal(0), now=store.clock(), key=f"{uid}:0"
        ),
    )


async def test_two_processes_racing_never_overspend_and_charge_exactly(
    open_store: Opener,
) -> None:
    one, two = await open_store(), await open_store()
    tenant = tenant_name()
    limit = 2_000
    runs = [f"{store_index}-{i}" for store_index in (1, 2) for i in range(32)]
    # 64 turns of 100 tokens each: 6400 tokens demanded against a limit of 2000
    await one._change(
        tenant,
        lambda b: [b.admit(uid, "ns", uid, now=one.clock()) for uid in runs],
        limits=TenantLimits(tokens=limit),
    )
    jobs = []
    for index, uid in enumerate(runs):
        store = one if uid.startswith("1-") else two
        delay = (index % 16) * 0.004
        jobs.append(reserve_and_settle(store, tenant, uid, 100, 100 - index % 7, delay))
    results = await asyncio.gather(*jobs)
    stored = await one.read(tenant)
    assert stored is not None
    charged = [r for r in results if r is not None]
    assert len(charged) >= limit // 100  # the limit was reached, not missed
    assert len(charged) < len(runs)  # and some turns were refused
    assert stored.used_tokens <= limit
    assert stored.used_tokens == sum(tokens for tokens, _ in charged)
    assert stored.holds == {}
    assert one.conflicts + two.conflicts > 0, "no compare-and-set race happened"


async def test_queue_is_fifo_and_enqueue_is_idempotent(open_store: Opener) -> None:
    store = await open_store()
    tenant = tenant_name()
    assert await store.queue(tenant) == []
    first = QueuedRun("u1", "ns", "one", 100.0)
    second = QueuedRun("u2", "ns", "two", 101.0)
    third = QueuedRun("u3", "other", "three", 102.5)
    assert await store.enqueue(tenant, first) == 1
    assert await store.enqueue(tenant, second) == 2
    assert await store.enqueue(tenant, first) == 1  # already queued: its position
    assert await store.enqueue(tenant, third) == 3
    assert await store.queue(tenant) == [first, second, third]
    assert await store.dequeue(tenant, "u2") is True
    assert await store.dequeue(tenant, "u2") is False
    assert await store.queue(tenant) == [first, third]
    assert await store.enqueue(tenant, second) == 2  # by creation time, not arrival
    assert store.position(tenant, "u3") == 3
    # one value per run, nothing else: no value grows with the queue
    stored = json.loads((await store.kv.get(queue_key(tenant, "u2"))).value)
    assert stored == {"uid": "u2", "ns": "ns", "name": "two", "at": 101.0}
    assert await live_keys(store.kv, f"queue.{tenant}.*") == [
        queue_key(tenant, uid) for uid in ("u1", "u2", "u3")
    ]


async def test_runs_arriving_out_of_creation_order_queue_in_creation_order(
    open_store: Opener,
) -> None:
    store = await open_store()
    tenant = tenant_name()
    late, early, same = (
        QueuedRun("late", "ns", "late", 200.0),
        QueuedRun("early", "ns", "early", 100.0),
        QueuedRun("same", "ns", "same", 200.0),
    )
    assert await store.enqueue(tenant, late) == 1
    assert await store.enqueue(tenant, early) == 1  # created first: goes ahead
    assert await store.enqueue(tenant, same) == 3  # a tie keeps arrival order
    assert [r.uid for r in await store.queue(tenant)] == ["early", "late", "same"]
    # another process (an operator taking the lead over) reads the same order from the bucket
    again = await open_store()
    assert [r.uid for r in await again.queue(tenant)] == ["early", "late", "same"]


async def test_dequeue_from_an_empty_queue_is_false(open_store: Opener) -> None:
    store = await open_store()
    assert await store.dequeue(tenant_name(), "nobody") is False


async def test_a_dequeued_run_is_gone_for_the_next_operator_too(open_store: Opener) -> None:
    one = await open_store()
    tenant = tenant_name()
    for i in range(4):
        await one.enqueue(tenant, QueuedRun(f"u{i}", "ns", f"r{i}", float(i)))
    assert await one.dequeue(tenant, "u0") and await one.dequeue(tenant, "u2")
    two = await open_store()
    assert [r.uid for r in await two.queue(tenant)] == ["u1", "u3"]
    assert await two.dequeue(tenant, "u0") is False
    one.forget_queues()  # after a lead lost and regained: read from the bucket again
    await two.dequeue(tenant, "u1")
    assert [r.uid for r in await one.queue(tenant)] == ["u3"]


async def test_concurrent_enqueues_from_two_processes_lose_nothing(open_store: Opener) -> None:
    one, two = await open_store(), await open_store()
    tenant = tenant_name()
    jobs = [
        (one if i % 2 else two).enqueue(tenant, QueuedRun(f"u{i}", "ns", f"r{i}", float(i)))
        for i in range(20)
    ]
    await asyncio.gather(*jobs)
    reader = await open_store()
    assert [r.uid for r in await reader.queue(tenant)] == [f"u{i}" for i in range(20)]


async def test_a_queue_over_the_platforms_limit_refuses_only_the_next_run(
    open_store: Opener,
) -> None:
    store = await open_store()
    tenant = tenant_name()
    for i in range(3):
        assert await store.enqueue(tenant, QueuedRun(f"u{i}", "ns", f"r{i}", float(i)), limit=3)
    with pytest.raises(QueueFull, match="holds 3 runs, the most the platform allows") as full:
        await store.enqueue(tenant, QueuedRun("u3", "ns", "r3", 3.0), limit=3)
    assert (full.value.tenant, full.value.limit) == (tenant, 3)
    assert await store.enqueue(tenant, QueuedRun("u1", "ns", "r1", 1.0), limit=3) == 2  # queued
    assert len(await store.queue(tenant)) == 3
    await store.dequeue(tenant, "u0")
    assert await store.enqueue(tenant, QueuedRun("u3", "ns", "r3", 3.0), limit=3) == 3


async def test_concurrent_enqueues_of_one_tenant_queue_no_more_than_the_limit(
    open_store: Opener,
) -> None:
    """``AGENTRUN_MAX_QUEUED_RUNS`` holds for runs created together: each enqueue read the
    queue's length and then stored its run, so every one that read it before the first was
    stored passed the check (a queue of 3 took all 8)."""
    store = await open_store()
    tenant, limit = tenant_name(), 3
    runs = [QueuedRun(f"u{i}", "ns", f"r{i}", float(i)) for i in range(limit + 5)]
    answers = await asyncio.gather(
        *(store.enqueue(tenant, run, limit=limit) for run in runs), return_exceptions=True
    )
    refused = [a for a in answers if isinstance(a, QueueFull)]
    assert len(refused) == 5 and sum(isinstance(a, int) for a in answers) == limit
    assert len(await store.queue(tenant)) == limit
    assert len(await (await open_store()).queue(tenant)) == limit  # as stored
    await store.dequeue(tenant, (await store.queue(tenant))[0].uid)  # room again: one more
    again = await asyncio.gather(
        *(store.enqueue(tenant, run, limit=limit) for run in runs), return_exceptions=True
    )
    assert sum(isinstance(a, QueueFull) for a in again) == 5


async def test_tenants_lists_tenants_with_a_book(open_store: Opener) -> None:
    store = await open_store()
    with_book, only_queued = tenant_name(), tenant_name()
    await store._change(with_book, lambda b: None, limits=TenantLimits())
    await store.enqueue(only_queued, QueuedRun("u", "ns", "n", 0.0))
    assert book_key(with_book) in await live_keys(store.kv)  # the entry is in the bucket
    tenants = await store.tenants()
    # nats-py's KeyValue.keys(filters=...) matches filters as substrings on the client, so a
    # subject wildcard such as "book.>" matches no key at all
    assert with_book in tenants
    assert only_queued not in tenants
    assert all(not name.startswith("book.") for name in tenants)


async def test_a_stored_book_decodes_as_written(open_store: Opener) -> None:
    store = await open_store()
    tenant = tenant_name()
    await store._change(
        tenant,
        lambda b: b.reserve(
            "r:1", Hold("r", 1, 5, Decimal("0.000001"), 1e9, "o", "ns", "n"), now=store.clock()
        ),
        limits=TenantLimits(cost_usd=Decimal("1.50")),
    )
    entry = await store.kv.get(book_key(tenant))
    decoded = codec.decode_book(entry.value or b"")
    assert decoded.holds["r:1"].cost_usd == Decimal("0.000001")
    assert decoded == await store.read(tenant)


async def test_a_refusal_is_never_judged_on_a_stale_cached_copy(open_store: Opener) -> None:
    """A worker's store refused a call and so wrote nothing (its cache keeps the old limit);
    the operator then raised the limit. The next call must be judged on the entry as it is."""
    worker, operator_ = await open_store(), await open_store()
    tenant = tenant_name()
    now = worker.clock()
    await worker._change(
        tenant, lambda b: b.admit("r", "ns", "r", now=now), limits=TenantLimits(tokens=100)
    )
    big = Hold("r", 0, 500, Decimal(0), now + 60, "w", "ns", "r")
    assert await worker._change(tenant, lambda b: b.reserve("r:0", big, now=now)) is not None
    await operator_._change(tenant, lambda b: b.set_limits(TenantLimits(tokens=1_000_000), now=now))
    assert await worker._change(tenant, lambda b: b.reserve("r:0", big, now=now)) is None
    # and an operator that cached the entry before a hold appeared still sees the hold
    stale_view = await operator_._change(tenant, lambda b: sorted(b.holds))
    assert stale_view == ["r:0"]


# --------------------------------------------------------------------------- named operations


def summary(phase: kernel.Phase, *, turns: int, tokens: int, cost: str = "0") -> kernel.RunSummary:
    """A run's last summary after ``turns`` committed turns that used ``tokens``."""
    usage = kernel.Usage(input_tokens=tokens, cost_usd=Decimal(cost))
    return kernel.RunSummary(phase, turn=turns, steps=turns, usage=usage)


async def test_a_run_is_admitted_then_closed_with_what_it_committed(open_store: Opener) -> None:
    store = await open_store()
    tenant, now = tenant_name(), store.clock()
    limits = TenantLimits(tokens=10_000, max_concurrent_runs=1)
    run = QueuedRun("uid-1", "ns", "run", now)
    assert await store.admit_run(tenant, run, limits=limits, need=(500, Decimal(0))) is None
    refusal = await store.admit_run(
        tenant, QueuedRun("uid-2", "ns", "other", now), limits=limits, need=(0, Decimal(0))
    )
    assert refusal is not None and refusal.reason == "ConcurrencyLimit"
    book = await store.read(tenant)
    assert book is not None and set(book.holds) == {"uid-1:admission"}
    ended = summary(kernel.Phase.COMPLETED, turns=3, tokens=1_200, cost="0.01")
    assert await store.close_run(tenant, "uid-1", ended, end=now + 5, now=now + 6) is True
    book = await store.read(tenant)
    assert book is not None and book.active == {} and book.holds == {}
    assert (book.used_tokens, book.used_cost, book.used_wall) == (1_200, Decimal("0.01"), 5.0)
    assert await store.close_run(tenant, "uid-1", ended, end=now + 5) is False  # once


async def test_the_sweeps_repairs_charge_expired_holds_and_close_ended_or_vanished_runs(
    open_store: Opener,
) -> None:
    store = await open_store()
    tenant, now = tenant_name(), store.clock()
    for uid in ("alive", "ended", "vanished"):
        run = QueuedRun(uid, "ns", uid, now - 100)
        await store.admit_run(
            tenant, run, limits=TenantLimits(), need=(0, Decimal(0)), now=now - 100
        )
    dead = store.turn_hold(
        TurnRef(tenant, "alive", "ns", "alive", 2), ttl=10, clock=lambda: now - 50
    )
    await dead.reserve(tokens=900, cost_usd=Decimal(0))  # its worker died: expired at now - 40
    read = await store.read(tenant)
    assert read is not None
    since = {uid: read.slot_since(uid) for uid in ("alive", "ended", "vanished")}
    ended = summary(kernel.Phase.MAX_STEPS, turns=4, tokens=700)
    repairs = [
        Repair(
            "alive:2",
            "alive",
            summary(kernel.Phase.RUNNING, turns=2, tokens=300),
            since=since["alive"],
        ),
        Repair("", "ended", ended, now - 20, since=since["ended"]),
        Repair("", "vanished", None, since=since["vanished"]),
    ]
    limits = TenantLimits(tokens=50_000)
    await store.repair_entry(tenant, repairs, limits=limits, now=now)
    book = await store.read(tenant)
    assert book is not None and book.limits == limits
    assert book.holds == {}  # the expired hold dropped, its run's commits charged
    assert set(book.active) == {"alive"} and book.active["alive"].tokens == 300
    assert book.used_tokens == 300 + 700
    assert book.used_wall == pytest.approx(80 + 100)  # ended at now - 20; vanished at now


async def test_queue_heads_are_admitted_fifo_in_one_write_up_to_the_first_that_does_not_fit(
    open_store: Opener,
) -> None:
    store = await open_store(inline_runs=2)
    tenant, now = tenant_name(), store.clock()
    limits = TenantLimits(tokens=10_000, max_concurrent_runs=3)
    heads = [(QueuedRun(f"u{i}", "ns", f"r{i}", now + i), (1_000, Decimal(0))) for i in range(5)]
    writes = store.writes
    answers = await store.admit_runs(tenant, heads, limits=limits, now=now)
    assert answers[:3] == [None, None, None] and len(answers) == 4  # the 5th was not tried
    assert answers[3] is not None and answers[3].reason == "ConcurrencyLimit"
    assert store.writes - writes == 1  # three slots, two inline and one apart: one batch
    book = await store.read(tenant)
    assert book is not None and sorted(book.active) == ["u0", "u1", "u2"]
    assert book.reserved_tokens == 3_000 and book.totals_mismatch() == []
    # a head whose first call does not fit stops the runs behind it, however small theirs
    big = [(QueuedRun("big", "ns", "big", now), (9_000, Decimal(0))), heads[4]]
    await store.close_run(tenant, "u0", None, end=now, now=now)
    answers = await store.admit_runs(tenant, big, limits=limits, now=now)
    assert len(answers) == 1 and answers[0] is not None and answers[0].resource == "tokens"
