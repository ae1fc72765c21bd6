"""No value the ledger writes for a ``split`` tenant grows with its runs: the totals hold at most
``INLINE_RUNS`` run entries and a fixed number of waiting calls, each run's entry holds that
run's own holds and calls, and each queued run is a value of its own — all far below
nats-server's max payload (1 MiB by default) with every name at its longest, however many runs
a tenant has active or queued. The only limits a tenant meets are its ``maxConcurrentRuns`` and
its budget. Checked at the claimed scale against the real server. A ``single`` tenant (its
ledger one value, as earlier releases store it) keeps the earlier releases' caps instead: 500
active runs and 1,000 queued, each refused with the earlier reason."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal

import nats
import pytest
from kv_support import live_keys
from nats.aio.client import Client as NATS

from agentrun.ledger import (
    INLINE_RUNS,
    Active,
    Book,
    BudgetRefusal,
    Hold,
    LedgerStore,
    QueuedRun,
    TenantLimits,
    codec,
)
from agentrun.ledger.entries import CONCURRENCY_LIMIT, FIRST_WAITERS, MAX_ACTIVE_RUNS, Waiter
from agentrun.ledger.hold import TurnRef
from agentrun.ledger.store import QueueFull, book_key, queue_key, run_key
from agentrun_dev import natsserver

NOW = 1.8e9
NAMESPACE = "n" * 63  # the longest namespace name
NAME = "r" * 253  # the longest object name
TENANT = "t" * 253  # the longest AgentTenant name
FAR_BELOW = 64 * 1024
"""A sixteenth of nats-server's default max payload: what "far below" means here."""


@pytest.fixture
async def client(nats_server: natsserver.NatsServer) -> AsyncIterator[NATS]:
    nc = await nats.connect(**nats_server.client_options())
    yield nc
    await nc.close()


async def open_store(client: NATS, layout: str = "split") -> LedgerStore:
    return await LedgerStore.open(
        client.jetstream(), bucket="AGENTRUN_LEDGER_BOUNDS_TEST", layout=layout
    )


def longest_run(book: Book) -> str:
    """Add a run at its largest: its slot, a held call with a recorded spend, a call of
    another delivery set aside, a waiting call and a remembered charge, every number and name
    at its longest. Returns its uid."""
    uid = str(uuid.uuid4())
    owner = "0123456789abcdef"
    book.start_run(uid, Active(NAMESPACE, NAME, NOW, 12_345, 123_456_789, Decimal("1234.5678")))
    for key in (f"{uid}:12345", f"{uid}:12345/{owner}"):
        book.put_hold(
            key,
            Hold(uid, 12_345, 1_234_567, Decimal("12.3456789"), NOW + 60, owner, NAMESPACE, NAME,
                 123_456, Decimal("1.23456789")),
        )  # fmt: skip
    book.put_waiter(f"{uid}:12346", Waiter(NOW, 1_234_567, Decimal("12.3456789"), NOW + 10))
    book.load_memo(f"{uid}:12344/{owner}", NOW + 3_600)
    return uid


def large_book(runs: int) -> Book:
    book = Book.new(
        TENANT, TenantLimits(10**12, Decimal("123456.789"), 1e9, 86_400.0, None), now=NOW
    )
    for _ in range(runs):
        longest_run(book)
    return book


def test_the_totals_with_every_inline_run_at_its_longest_stay_far_below_the_max_payload() -> None:
    book = large_book(INLINE_RUNS + 10)
    totals = codec.encode_totals(book, inline=list(book.runs)[:INLINE_RUNS])
    assert len(totals) < FAR_BELOW, len(totals)
    assert len(book.first_waiters) == FIRST_WAITERS


def test_the_totals_of_10_000_active_runs_are_as_large_as_of_none() -> None:
    few, many = large_book(1), large_book(1)
    many.active_runs, many.reserved_tokens = 10_000, 10_000 * many.reserved_tokens
    sizes = [len(codec.encode_totals(b, inline=())) for b in (few, many)]
    assert sizes[1] - sizes[0] < 16, sizes  # the counts' digits, nothing per run
    assert sizes[1] < 2_048


def test_a_runs_own_value_at_its_longest_is_small() -> None:
    book = large_book(1)
    (uid,) = book.runs
    value = codec.encode_run(book, uid)
    assert value is not None and len(value) < 2_048, len(value or b"")


def test_a_queued_runs_value_at_its_longest_is_small() -> None:
    shape = codec.QueuedRunShape(uid=str(uuid.uuid4()), ns=NAMESPACE, name=NAME, at=NOW + 0.123)
    assert len(codec.QUEUED.dump_json(shape)) < 512


def test_max_concurrent_runs_is_the_only_cap_on_active_runs() -> None:
    book = Book.new("big", TenantLimits(max_concurrent_runs=3_000), now=NOW)
    for i in range(3_000):
        assert book.admit(f"r{i}", "ns", f"r{i}", now=NOW) is None
        book.unload(f"r{i}")  # as the store does: only the run an operation touches is loaded
    refusal = book.admit("one-more", "ns", "one-more", now=NOW)
    assert isinstance(refusal, BudgetRefusal) and refusal.reason == CONCURRENCY_LIMIT
    assert refusal.message == "3000 of maxConcurrentRuns 3000 runs are active"
    unlimited = Book.new("big", TenantLimits(), now=NOW)
    for i in range(20_000):
        assert unlimited.admit(f"r{i}", "ns", f"r{i}", now=NOW) is None
        unlimited.unload(f"r{i}")
    assert unlimited.active_runs == 20_000


async def test_2_000_active_runs_and_10_000_queued_runs_on_the_real_server(client: NATS) -> None:
    store = await open_store(client)
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    limits = TenantLimits(tokens=10**9, max_concurrent_runs=2_000)

    async def admit(_: int) -> None:
        run = QueuedRun(str(uuid.uuid4()), NAMESPACE, NAME, NOW)
        assert await store.admit_run(tenant, run, limits=limits, need=(1_000, Decimal(0))) is None

    for chunk in range(0, 2_000, 100):  # as many as the group commit carries per write
        await asyncio.gather(*map(admit, range(chunk, chunk + 100)))
    refusal = await store.admit_run(
        tenant, QueuedRun("one-more", "ns", "r", NOW), limits=limits, need=(0, Decimal(0))
    )
    assert refusal is not None and refusal.reason == CONCURRENCY_LIMIT
    totals = (await store.kv.get(book_key(tenant))).value or b""
    assert len(totals) < FAR_BELOW, len(totals)
    book = await store.read(tenant)
    assert book is not None and book.active_runs == 2_000 == len(book.active)
    assert book.reserved_tokens == 2_000 * 1_000 and book.totals_mismatch() == []
    apart = await live_keys(store.kv, f"run.{tenant}.*")
    assert len(apart) == 2_000 - INLINE_RUNS  # the others are inline in the totals
    assert all(key.startswith(run_key(tenant, "")) for key in apart)

    async def enqueue(i: int) -> None:
        await store.enqueue(tenant, QueuedRun(f"q{i}", NAMESPACE, NAME, NOW + i / 1e3))

    for chunk in range(0, 10_000, 200):
        await asyncio.gather(*map(enqueue, range(chunk, chunk + 200)))
    assert [store.position(tenant, f"q{i}") for i in (0, 1, 5_000)] == [1, 2, 5_001]
    assert store.position(tenant, "q9999") == 10_000
    value = (await store.kv.get(queue_key(tenant, "q9999"))).value or b""
    assert len(value) < 512
    store.forget_queues()  # another operator reads the whole queue back, in order
    queue = await store.queued(tenant)
    assert len(queue) == 10_000 and queue.position("q4321") == 4_322


def test_a_one_value_ledger_holds_at_most_500_active_runs_whatever_max_concurrent_runs() -> None:
    book = Book.new("small", TenantLimits(max_concurrent_runs=3_000), now=NOW, one_value=True)
    for i in range(MAX_ACTIVE_RUNS):
        assert book.admit(f"r{i}", "ns", f"r{i}", now=NOW) is None
    refusal = book.admit("one-more", "ns", "one-more", now=NOW)
    assert isinstance(refusal, BudgetRefusal) and refusal.reason == CONCURRENCY_LIMIT
    assert refusal.message == "500 runs are active, the most one tenant's ledger entry holds"
    assert len(codec.encode_one_value(book)) < 256 * 1024
    book.split_out()  # split from now on: no cap but maxConcurrentRuns
    assert book.admit("one-more", "ns", "one-more", now=NOW) is None


@pytest.mark.parametrize("layout", ["single", "split"])
async def test_a_tenants_queue_has_no_cap_of_its_storage_in_either_layout(
    client: NATS, layout: str
) -> None:
    """B14: the queue is one value per run in both layouts, so only the platform's
    ``AGENTRUN_MAX_QUEUED_RUNS`` bounds it (earlier releases refused the 1,001st run of a
    one-value tenant)."""
    store = await open_store(client, layout)
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    runs = [QueuedRun(f"q-{i:05d}", "ns", f"q-{i:05d}", NOW + i) for i in range(1_500)]
    for chunk in range(0, len(runs), 100):
        await asyncio.gather(*(store.enqueue(tenant, r) for r in runs[chunk : chunk + 100]))
    one_more = QueuedRun("one-more", "ns", "one-more", NOW + 10_000)
    assert await store.enqueue(tenant, one_more) == 1_501
    with pytest.raises(QueueFull, match="holds 1501 runs, the most the platform allows"):
        await store.enqueue(tenant, QueuedRun("late", "ns", "late", NOW + 20_000), limit=1_501)


@pytest.mark.parametrize("cap", [None, 2_000, 500])
async def test_a_one_value_ledger_its_admissions_outgrow_is_split_and_admits_on(
    client: NATS, cap: int | None
) -> None:
    """B14 with the default layout: a one-value tenant whose admissions would take it past
    the 500 active runs one value holds is split at that admission (one atomic batch, every
    run and hold kept) and admits on to its ``maxConcurrentRuns``; a worker's store (which
    keeps ``single``) goes on reserving and settling on it. A tenant capped at 500 anyway
    stays one value."""
    store = await open_store(client, "single")
    worker = await open_store(client, "single")
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    limits = TenantLimits(tokens=10**9, max_concurrent_runs=cap)
    uids = [str(uuid.uuid4()) for _ in range(MAX_ACTIVE_RUNS + 20)]

    async def admit(uid: str) -> BudgetRefusal | None:
        run = QueuedRun(uid, "ns", uid[:8], NOW)
        return await store.admit_run(tenant, run, limits=limits, need=(100, Decimal(0)))

    for chunk in range(0, MAX_ACTIVE_RUNS, 100):
        assert await asyncio.gather(*map(admit, uids[chunk : chunk + 100])) == [None] * 100
    stored = await store.kv.get(book_key(tenant))
    assert codec.is_one_value(stored.value or b"")  # 500 active: still one value
    answers = [await admit(uid) for uid in uids[MAX_ACTIVE_RUNS:]]
    book = await store.read(tenant)
    assert book is not None
    if cap == 500:
        assert all(a is not None and a.reason == CONCURRENCY_LIMIT for a in answers)
        assert book.one_value and book.active_runs == MAX_ACTIVE_RUNS
        return
    assert answers == [None] * 20
    assert not book.one_value and book.active_runs == MAX_ACTIVE_RUNS + 20
    assert book.reserved_tokens == 100 * (MAX_ACTIVE_RUNS + 20)  # every admission hold kept
    stored = await store.kv.get(book_key(tenant))
    assert not codec.is_one_value(stored.value or b"")
    ref = TurnRef(tenant, uids[0], "ns", uids[0][:8], 0)
    hold = Hold(uids[0], 0, 0, Decimal(0), NOW + 60, "worker-1")
    assert await worker.reserve_turn(ref, hold, before=None, prior_owner="", now=NOW) is None
    after = await worker.read(tenant)
    assert after is not None and after.hold(ref.key) is not None


async def test_a_one_value_ledger_is_split_while_its_runs_fit_one_batch(client: NATS) -> None:
    """A tenant allowed 2,000 runs whose one-value ledger remembers 900 ended runs beside its
    active ones is split before splitting would write more values than nats-server takes in
    one atomic batch (1,000): its admissions go on past 500 active runs, every run kept."""
    store = await open_store(client, "single")
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    limits = TenantLimits(tokens=10**9, max_concurrent_runs=2_000)
    uids = [str(uuid.uuid4()) for _ in range(900 + MAX_ACTIVE_RUNS + 20)]

    async def admit(uid: str) -> BudgetRefusal | None:
        run = QueuedRun(uid, "ns", uid[:8], NOW)
        return await store.admit_run(tenant, run, limits=limits, need=(100, Decimal(0)))

    for chunk in range(0, 900, 100):  # runs that end, remembered as ended
        batch = uids[chunk : chunk + 100]
        assert await asyncio.gather(*map(admit, batch)) == [None] * 100
        ends = [store.close_run(tenant, uid, None, end=NOW + 1, now=NOW + 1) for uid in batch]
        assert all(await asyncio.gather(*ends))
    for chunk in range(900, len(uids), 100):  # then more at once than one value holds
        answers = await asyncio.gather(*map(admit, uids[chunk : chunk + 100]))
        assert answers == [None] * len(answers)
    book = await store.read(tenant)
    assert book is not None and not book.one_value
    assert book.active_runs == MAX_ACTIVE_RUNS + 20


@pytest.mark.parametrize("layout", ["single", "split"])
async def test_two_stores_racing_to_make_a_tenants_first_book_admit_what_fits(
    client: NATS, layout: str
) -> None:
    """B03: the first use of a new tenant's budget from two processes at once. One book is
    made (the other store's create loses and applies its changes to it): exactly the runs
    the budget holds are admitted, every admission hold counted once."""
    stores = [await open_store(client, layout), await open_store(client, layout)]
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    limits = TenantLimits(tokens=25_000)

    async def admit(i: int) -> BudgetRefusal | None:
        run = QueuedRun(f"r{i:02d}", "ns", f"r{i:02d}", NOW)
        return await stores[i % 2].admit_run(tenant, run, limits=limits, need=(1_000, Decimal(0)))

    answers = await asyncio.gather(*map(admit, range(40)))
    admitted = [a for a in answers if a is None]
    assert len(admitted) == 25
    book = await stores[0].read(tenant)
    assert book is not None
    assert (book.active_runs, book.reserved_tokens) == (25, 25_000)
    assert book.totals_mismatch() == []
