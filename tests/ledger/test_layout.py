"""The ledger's layout: a tenant's totals and its runs' entries, stored apart, none of them
growing with the tenant's runs.

Pure: random interleavings of every budget operation applied the way the store applies them —
each loading the totals and the one run it touches, then laid out again (``codec.split``) —
end exactly where the same operations on the whole ledger in memory end, with the totals equal
to the sums over the entries after every step, whether every run is inline, some are, or none.

Against the real server: a small tenant's changes are one write of one value; runs beyond the
inline ones get values of their own, written with the totals in one atomic batch, and leave
nothing behind when they end; the totals are the same size at 40 active runs and at 400; two
processes racing on runs stored apart (or on a one-value ledger, the ``single`` layout) never
overspend and charge exactly; where a new run's
entry goes is decided on the totals' revision, so a stale process never stores it twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from decimal import Decimal
from typing import Any

import nats
import pytest
from clock_support import steady_clock
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kv_support import live_keys
from nats.aio.client import Client as NATS

from agentrun import kernel
from agentrun.ledger import (
    Active,
    Book,
    CallNeed,
    Granted,
    Hold,
    LedgerStore,
    QueuedRun,
    Seed,
    TenantLimits,
    TurnRef,
    UsageFloor,
    codec,
    window_start,
)
from agentrun.ledger.entries import ENDED_MEMORY, FIRST_WAITERS, LedgerCorrupt
from agentrun.ledger.store import book_key, run_key
from agentrun_dev import natsserver

from .conftest import TEST_BUCKET
from .test_book import COST_LIMIT, NOW, RUNS, T0, TOKEN_LIMIT, RunModel, _check, _do_close, _step
from .test_book import ops as budget_ops

PRICING = kernel.Pricing(Decimal("2.50"), Decimal("1.25"), Decimal("10"))


# --------------------------------------------------------------------------- pure: the split


@dataclasses.dataclass
class Stored:
    """A tenant's ledger as the store keeps it: the totals value and one value per run stored
    apart, changed only by loading what an operation touches and laying it out again."""

    room: int
    totals: bytes
    inline: frozenset[str] = frozenset()
    runs: dict[str, bytes] = dataclasses.field(default_factory=dict)

    def load(self, uids: Collection[str]) -> Book:
        """The totals, with the entries of ``uids`` (inline or apart) loaded."""
        view = codec.decode_totals(self.totals)
        for uid in set(uids) - view.inline:
            if uid in self.runs:
                view.book.load(uid, codec.decode_run(self.runs[uid], uid=uid))
        return view.book

    def save(self, book: Book, uids: Collection[str]) -> None:
        """Lay out ``book`` (loaded with ``uids``) as the store writes it."""
        apart = {u: self.runs.get(u) for u in set(uids) - self.inline}
        laid = codec.split(book, inline=self.inline, stored=apart, room=self.room)
        self.totals, self.inline = laid.totals, laid.inline
        for uid, value in laid.runs.items():
            if value is None:
                self.runs.pop(uid, None)
            else:
                self.runs[uid] = value
        assert not (self.inline & self.runs.keys()), "a run stored twice"

    def whole(self) -> Book:
        view = codec.decode_totals(self.totals)
        return self.load(view.inline | self.runs.keys())


def same_ledger(a: Book, b: Book, now: float) -> None:
    """``a`` and ``b`` hold the same: totals, entries, first waiters (expired waiters dropped
    in both: an entry not loaded keeps its own until its run is next touched; empty entries,
    which are never stored, dropped too)."""
    for ledger in (a, b):
        ledger.drop_expired_waiters(now)
        for uid in [u for u, entry in ledger.runs.items() if entry.empty]:
            ledger.unload(uid)
    assert a == b


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=budget_ops, room=st.sampled_from([0, 1, len(RUNS)]))
def test_runs_stored_apart_end_where_the_whole_ledger_ends(
    script: list[tuple],
    room: int,  # type: ignore[type-arg]
) -> None:
    limits = TenantLimits(tokens=TOKEN_LIMIT, cost_usd=COST_LIMIT)
    whole = Book.new("acme", limits, now=NOW)
    stored = Stored(room, codec.encode_book(whole))
    models = {uid: RunModel() for uid in RUNS}
    twins = {uid: RunModel() for uid in RUNS}  # the same run as the whole ledger sees it
    for step, op in enumerate(script):
        now = NOW + step
        _step(whole, op, twins, now)
        part = stored.load({op[1]})
        _step(part, op, models, now)
        stored.save(part, {op[1]})
        reloaded = stored.whole()
        assert reloaded.totals_mismatch() == []
        _check(reloaded, models)
        same_ledger(reloaded, whole, now)
        assert len(stored.inline) <= room
    end = NOW + len(script) + 1
    for uid, run in models.items():
        if run.admitted and not run.closed:
            part = stored.load({uid})
            _do_close(part, uid, run, 4, end)
            stored.save(part, {uid})
    final = stored.whole()
    _check(final, models)
    assert final.holds == {} and final.active_runs == 0 and final.reserved_tokens == 0
    # nothing of the runs is left but the memory that they ended, apart from the totals
    assert stored.inline == frozenset()
    assert set(stored.runs) == {uid for uid, run in models.items() if run.admitted}
    assert all(entry.only_ended for entry in final.runs.values())
    assert final.window == T0
    # once that memory expired, a roll with them loaded leaves nothing
    later = end + ENDED_MEMORY
    forgotten = stored.load(final.forgettable(later))
    forgotten.roll(later)
    stored.save(forgotten, final.forgettable(later))
    assert stored.runs == {} and stored.inline == frozenset()


WAITING_RUNS = tuple(f"w{i}" for i in range(FIRST_WAITERS + 4))
"""More runs than the totals remember waiting calls."""

waiting_ops = st.lists(
    st.one_of(
        st.tuples(st.just("ask"), st.sampled_from(WAITING_RUNS), st.integers(100, 3_000)),
        st.tuples(st.just("settle"), st.sampled_from(WAITING_RUNS), st.integers(0, 4)),
        st.tuples(st.just("give_up"), st.sampled_from(WAITING_RUNS)),
        st.tuples(st.just("tick"), st.sampled_from(WAITING_RUNS), st.integers(1, 12)),
    ),
    max_size=80,
)


@dataclasses.dataclass
class Asker:
    """A run whose calls ask for room in a tight budget."""

    turn: int = 0
    tokens: int = 0
    prompt: int = 0
    held: Granted | None = None


def _wait_step(b: Book, op: tuple, run: Asker, now: float) -> None:  # type: ignore[type-arg]
    uid = op[1]
    key = f"{uid}:{run.turn}"
    if op[0] == "ask" and run.held is None:
        run.prompt = run.prompt or op[2]
        need = CallNeed(run.prompt, 2_000, PRICING, min_output_tokens=200)
        template = Hold(uid, run.turn, 0, Decimal(0), now + 60, f"o-{uid}", "ns", uid)
        answer = b.reserve_call(key, need, template, now=now)
        run.held = answer if isinstance(answer, Granted) else None
    elif op[0] == "settle" and run.held is not None:
        run.tokens += run.held.tokens * op[2] // 4
        b.settle(uid, turn=run.turn, tokens=run.tokens, cost_usd=Decimal(0), now=now, key=key)
        run.turn, run.held, run.prompt = run.turn + 1, None, 0
    elif op[0] == "give_up":
        b.release(key, owner=f"o-{uid}")
        b.stop_waiting(key)
        run.held, run.prompt = None, 0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=waiting_ops, room=st.sampled_from([0, 3]))
def test_waiting_calls_stored_apart_are_served_as_in_the_whole_ledger(
    script: list[tuple],
    room: int,  # type: ignore[type-arg]
) -> None:
    limits = TenantLimits(tokens=12_000)
    whole = Book.new("acme", limits, now=NOW)
    for uid in WAITING_RUNS:
        assert whole.admit(uid, "ns", uid, now=NOW) is None
    stored = Stored(room, codec.encode_book(whole))
    stored.save(stored.whole(), WAITING_RUNS)
    runs = {uid: Asker() for uid in WAITING_RUNS}
    twins = {uid: Asker() for uid in WAITING_RUNS}
    now = NOW
    for op in script:
        if op[0] == "tick":  # time passes: waiters that stop asking expire
            now += op[2]
            continue
        _wait_step(whole, op, twins[op[1]], now)
        part = stored.load({op[1]})
        _wait_step(part, op, runs[op[1]], now)
        stored.save(part, {op[1]})
        assert runs == twins  # every call got the same answer as in the whole ledger
        reloaded = stored.whole()
        assert reloaded.totals_mismatch() == []
        assert len(reloaded.first_waiters) <= FIRST_WAITERS
        assert reloaded.used_tokens + reloaded.reserved_tokens <= 12_000
        same_ledger(reloaded, whole, now)


def test_the_oldest_waiter_keeps_its_room_when_more_wait_than_the_totals_remember() -> None:
    b = Book.new("acme", TenantLimits(tokens=10_000), now=NOW)
    b.put_hold("big:0", Hold("big", 0, 9_000, Decimal(0), NOW + 60, "o", "ns", "big"))
    need = CallNeed(3_000, 1_000, PRICING, min_output_tokens=1_000)
    for i in range(FIRST_WAITERS + 3):  # each waits: 9 000 held, 4 000 needed of 10 000
        template = Hold(f"r{i}", 0, 0, Decimal(0), NOW + 60, "o")
        assert not isinstance(b.reserve_call(f"r{i}:0", need, template, now=NOW + i / 100), Granted)
    assert sorted(b.first_waiters) == [f"r{i}:0" for i in range(FIRST_WAITERS)]  # the oldest
    assert len(b.waiting) == FIRST_WAITERS + 3  # every one in its run's entry
    b.take_hold("big:0")  # room for two calls now: the oldest goes first
    small = CallNeed(2_000, 1_000, PRICING, min_output_tokens=1_000)
    late = f"r{FIRST_WAITERS + 2}"
    young = b.reserve_call(
        f"{late}:0", small, Hold(late, 0, 0, Decimal(0), NOW + 60, "o"), now=NOW + 1
    )
    assert isinstance(young, Granted)  # 3 000 fits next to the oldest's 4 000
    assert not isinstance(
        b.reserve_call("r9x:0", need, Hold("r9x", 0, 0, Decimal(0), NOW + 60, "o"), now=NOW + 1.1),
        Granted,
    )  # a newcomer's 4 000 would take the oldest's room (3 000 + 4 000 + 4 000): it waits
    assert isinstance(
        b.reserve_call("r0:0", need, Hold("r0", 0, 0, Decimal(0), NOW + 60, "o"), now=NOW + 1.2),
        Granted,
    )


# --------------------------------------------------------------------------- the real server

Opener = Callable[..., Awaitable[LedgerStore]]


@pytest.fixture
async def open_store(nats_server: natsserver.NatsServer) -> AsyncIterator[Opener]:
    """``await open_store(**kwargs)``: a LedgerStore on its own NATS connection."""
    clients: list[NATS] = []

    async def opener(**kwargs: Any) -> LedgerStore:
        client = await nats.connect(**nats_server.client_options())
        clients.append(client)
        kwargs.setdefault("layout", "split")  # the layout this module is about
        kwargs.setdefault("clock", steady_clock)  # its jumps of an hour stay in one window
        return await LedgerStore.open(client.jetstream(), bucket=TEST_BUCKET, **kwargs)

    yield opener
    for client in clients:
        await client.close()


def tenant_name() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


async def admit(store: LedgerStore, tenant: str, uid: str, **limits: Any) -> None:
    refusal = await store.admit_run(
        tenant,
        QueuedRun(uid, "ns", f"run-{uid}", store.clock()),
        limits=TenantLimits(**limits),
        need=(0, Decimal(0)),
    )
    assert refusal is None, refusal


async def one_turn(store: LedgerStore, tenant: str, uid: str, *, tokens: int = 100) -> bool:
    """Reserve a call, record its spend and settle it: True if it was held."""
    hold = store.turn_hold(TurnRef(tenant, uid, "ns", f"run-{uid}", 0))
    answer = await hold.reserve_call(CallNeed(tokens, 0, PRICING))
    if not isinstance(answer, Granted):
        return False
    usage = kernel.Usage(input_tokens=tokens)
    await hold.spend(usage)
    after = dataclasses.replace(kernel.initial_state(goal="x"), usage=usage, turn=1)
    await hold.settle(after)
    return True


async def run_keys(store: LedgerStore, tenant: str) -> list[str]:
    return await live_keys(store.kv, f"run.{tenant}.*")


async def test_a_small_tenants_every_change_is_one_write_of_one_value(open_store: Opener) -> None:
    store = await open_store()
    tenant = tenant_name()
    await admit(store, tenant, "a", tokens=10_000)
    assert store.batches == 1  # made: its totals, guarded against another making it (cas)
    assert await one_turn(store, tenant, "a")
    for uid in ("b", "c"):
        await admit(store, tenant, uid, tokens=10_000)
        assert await one_turn(store, tenant, uid)
    assert store.batches == 1
    assert await run_keys(store, tenant) == []
    book = await store.read(tenant)
    assert book is not None and set(book.active) == {"a", "b", "c"}
    assert book.used_tokens == 300 and book.totals_mismatch() == []


async def test_runs_past_the_inline_ones_are_stored_apart_and_leave_nothing_when_they_end(
    open_store: Opener,
) -> None:
    store = await open_store(inline_runs=2)
    tenant = tenant_name()
    uids = [f"u{i}" for i in range(5)]
    for uid in uids:
        await admit(store, tenant, uid)
    assert await run_keys(store, tenant) == [run_key(tenant, u) for u in uids[2:]]
    writes = store.writes
    for uid in uids:
        assert await one_turn(store, tenant, uid)
    assert store.batches >= 6  # the runs stored apart: a reserve and a settle each, batched
    assert store.writes - writes == 3 * len(uids)  # reserve, spend, settle: one write each
    book = await store.read(tenant)
    assert book is not None and book.active_runs == 5 and book.used_tokens == 500
    assert book.totals_mismatch() == []
    for uid in uids:
        summary = kernel.RunSummary(
            kernel.Phase.COMPLETED, turn=1, steps=1, usage=kernel.Usage(input_tokens=100)
        )
        assert await store.close_run(tenant, uid, summary, end=store.clock())
    # the memory that each ended, apart (the inline places free again), until it expires
    assert await run_keys(store, tenant) == [run_key(tenant, u) for u in uids]
    book = await store.read(tenant)
    assert book is not None and book.active_runs == 0
    assert sorted(book.runs) == uids and all(e.only_ended for e in book.runs.values())
    later = store.clock() + ENDED_MEMORY
    await store.repair_entry(tenant, [], limits=None, now=later, forget=book.forgettable(later))
    assert await run_keys(store, tenant) == []  # a purge marker each, which expires
    book = await store.read(tenant)
    assert book is not None and book.runs == {} and book.active_runs == 0
    assert (book.used_tokens, book.reserved_tokens) == (500, 0)
    # another process sees the same, and a new run takes a freed inline place again
    other = await open_store(inline_runs=2)
    await admit(other, tenant, "late")
    assert await run_keys(other, tenant) == []


async def test_the_totals_are_as_large_at_400_active_runs_as_at_40(open_store: Opener) -> None:
    store = await open_store()
    tenant = tenant_name()
    sizes: dict[int, int] = {}
    for count in range(400):
        uid = f"{uuid.uuid4()}"
        await admit(store, tenant, uid)
        hold = store.turn_hold(TurnRef(tenant, uid, "ns", f"run-{uid}", 0))
        assert isinstance(await hold.reserve_call(CallNeed(1_000, 500, PRICING)), Granted)
        if count + 1 in (40, 400):
            sizes[count + 1] = len((await store.kv.get(book_key(tenant))).value or b"")
    assert sizes[400] - sizes[40] < 32, sizes  # a few more digits in the sums, nothing else
    one = (await store.kv.get(run_key(tenant, uid))).value or b""
    assert len(one) < 1_000
    book = await store.read(tenant)
    assert book is not None and book.active_runs == 400 and len(book.holds) == 400
    assert book.totals_mismatch() == []


@pytest.mark.parametrize(
    ("layout", "inline"),
    [("split", 0), ("split", 32), ("single", 0)],
    ids=["apart", "inline", "single"],
)
async def test_two_processes_racing_on_runs_never_overspend_and_charge_exactly(
    open_store: Opener, layout: str, inline: int
) -> None:
    one = await open_store(inline_runs=inline, layout=layout)
    two = await open_store(inline_runs=inline, layout=layout)
    tenant = tenant_name()
    uids = [f"{i}" for i in range(48)]
    for uid in uids:
        await admit(one, tenant, uid, tokens=2_000)

    async def turn(index: int, uid: str) -> bool:
        await asyncio.sleep((index % 12) * 0.003)
        return await one_turn(one if index % 2 else two, tenant, uid, tokens=100)

    held = await asyncio.gather(*(turn(i, uid) for i, uid in enumerate(uids)))
    book = await one.read(tenant)
    assert book is not None and book.totals_mismatch() == []
    assert sum(held) == 20 and book.used_tokens == 2_000  # exactly the limit, not more
    assert sum(a.tokens for a in book.active.values()) == book.used_tokens
    assert book.holds == {} and book.reserved_tokens == 0
    assert one.conflicts + two.conflicts > 0, "no compare-and-set race happened"
    if layout == "single":  # the whole ledger in one value of the earlier releases' format
        assert await run_keys(one, tenant) == [] and one.batches + two.batches == 0
        assert codec.is_one_value((await one.kv.get(book_key(tenant))).value or b"")
    elif not inline:
        assert one.batches + two.batches > 0  # the runs stored apart: atomic batches


async def test_where_a_new_runs_entry_goes_is_decided_on_the_current_totals(
    open_store: Opener,
) -> None:
    one, two = await open_store(inline_runs=1), await open_store(inline_runs=1)
    tenant = tenant_name()
    await admit(one, tenant, "a")  # inline: the totals are full now, as one last saw them
    await two.free_run(tenant, "a")  # the inline place is free again
    await admit(one, tenant, "b")  # one's copy says "full": its batch must lose, then go inline
    assert one.conflicts == 1
    assert await run_keys(one, tenant) == []
    book = await two.read(tenant)
    assert book is not None and set(book.active) == {"b"} and book.active_runs == 1
    await asyncio.gather(admit(one, tenant, "c"), admit(two, tenant, "c"))  # both: stored once
    book = await one.read(tenant)
    assert book is not None and book.active_runs == 2 and book.totals_mismatch() == []
    assert await run_keys(one, tenant) == [run_key(tenant, "c")]


@pytest.mark.parametrize("inline", [0, 32], ids=["apart", "inline"])
async def test_an_admission_done_again_by_a_restarted_operator_after_the_run_ended_takes_no_slot(
    open_store: Opener, inline: int
) -> None:
    """An operator admitted a run, crashed before it dequeued it; the run ran and ended. The
    next operator admits it again: no slot is taken (the sweep would have closed it charging
    the run's usage a second time), and the run's entry goes once its memory expired."""
    store, tenant, uid = await open_store(inline_runs=inline), tenant_name(), str(uuid.uuid4())
    await admit(store, tenant, uid, tokens=1_000, max_concurrent_runs=1)
    usage = kernel.Usage(input_tokens=40, output_tokens=52, cost_usd=Decimal("0.01"))
    summary = kernel.RunSummary(phase=kernel.Phase.COMPLETED, turn=1, usage=usage)
    assert await store.close_run(tenant, uid, summary, end=store.clock())
    restarted = await open_store(inline_runs=inline)
    await admit(restarted, tenant, uid, tokens=1_000, max_concurrent_runs=1)
    book = await restarted.read(tenant)
    assert book is not None and (book.active_runs, book.used_tokens) == (0, 92)
    await admit(restarted, tenant, "next", tokens=1_000, max_concurrent_runs=1)  # a free slot
    later = store.clock() + ENDED_MEMORY
    book = await restarted.read(tenant)
    assert book is not None and book.forgettable(later) == [uid]
    await restarted.repair_entry(tenant, [], limits=None, now=later, forget=[uid])
    book = await restarted.read(tenant)
    assert book is not None and uid not in book.runs and book.used_tokens == 92
    assert run_key(tenant, uid) not in await run_keys(restarted, tenant)


async def test_totals_made_anew_count_the_run_entries_a_lost_totals_value_left(
    open_store: Opener,
) -> None:
    """The totals value alone was lost (deleted): the runs stored apart still hold their slots
    and holds. The ledger the operator makes again counts them, and seeds only the runs that
    have no entry."""
    store, tenant = await open_store(inline_runs=0), tenant_name()
    for uid in ("a", "b"):
        await admit(store, tenant, uid, tokens=10_000)
    hold = store.turn_hold(TurnRef(tenant, "a", "ns", "run-a", 0))
    assert isinstance(await hold.reserve_call(CallNeed(1_000, 500, PRICING)), Granted)
    await store.kv.delete(book_key(tenant))
    seeded = Seed(
        UsageFloor(window_start(store.clock(), 86_400.0), tokens=700),
        active={"b": Active("ns", "run-b", store.clock()), "c": Active("ns", "run-c", 0.0)},
    )

    async def rebuild(name: str, start: float, end: float) -> Seed:
        return seeded

    other = await open_store(inline_runs=0, rebuild=rebuild)
    await admit(other, tenant, "d", tokens=10_000)
    book = await other.read(tenant)
    assert book is not None and sorted(book.active) == ["a", "b", "c", "d"]
    assert book.active_runs == 4 and book.reserved_tokens > 0 and book.used_tokens == 700
    assert book.totals_mismatch() == []


async def test_a_ledger_seen_missing_then_made_again_is_found_by_the_process_that_saw_it_gone(
    open_store: Opener,
) -> None:
    """A worker read the tenant's ledger while it was gone (NATS's store lost, the operator not
    yet back) and keeps that answer in its cache; once the operator has made the ledger again,
    the worker's next reservation reads it anew instead of refusing the call for no budget."""
    worker, operator, tenant = await open_store(), await open_store(), tenant_name()
    assert await worker.read(tenant) is None  # the worker has now seen the ledger missing
    await admit(operator, tenant, "a", tokens=10_000)
    assert await one_turn(worker, tenant, "a")
    book = await operator.read(tenant)
    assert book is not None and book.used_tokens == 100


async def test_a_ledger_damaged_then_repaired_is_read_again_by_a_process_that_cached_it(
    open_store: Opener,
) -> None:
    """A worker read the tenant's totals while they were unreadable (written by something
    else); once they are repaired, its next reservation reads them anew instead of failing on
    its cached copy for ever."""
    worker, operator, tenant = await open_store(), await open_store(), tenant_name()
    await admit(operator, tenant, "a", tokens=10_000)
    good = await operator.kv.get(book_key(tenant))
    await operator.kv.put(book_key(tenant), b"{not a ledger entry")
    with pytest.raises(LedgerCorrupt):
        await one_turn(worker, tenant, "a")
    await operator.kv.put(book_key(tenant), good.value or b"")
    assert await one_turn(worker, tenant, "a")
    book = await operator.read(tenant)
    assert book is not None and book.used_tokens == 100


async def test_listing_a_tenants_runs_and_queue_creates_no_consumer(open_store: Opener) -> None:
    """Every listing (the whole ledger, the queue, the tenants) reads the stream's subjects and
    each key's last value: no consumer, so a loop listing over and over never meets the
    account's consumer limit; a dequeued run (a purge marker) and an ended run are left out."""
    store = await open_store(inline_runs=1)
    tenant = tenant_name()
    for uid in ("a", "b", "c"):
        await admit(store, tenant, uid, tokens=10_000)
    for index in range(5):
        run = QueuedRun(f"q{index}", "ns", f"run-q{index}", store.clock() + index)
        await store.enqueue(tenant, run)
    assert await store.dequeue(tenant, "q2")
    other = await open_store(inline_runs=1)  # nothing cached: every read from the server
    before = (await other.kv._js.stream_info(other.kv._stream)).state.consumer_count
    for _ in range(30):
        other.forget_queues()
        assert [run.uid for run in await other.queue(tenant)] == ["q0", "q1", "q3", "q4"]
        book = await other.read(tenant)
        assert book is not None and set(book.active) == {"a", "b", "c"}
        assert tenant in await other.tenants()
    info = await other.kv._js.stream_info(other.kv._stream)
    assert info.state.consumer_count <= before  # (other tests' key listings may expire)
