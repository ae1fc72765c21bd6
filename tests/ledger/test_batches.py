"""No change of a tenant's ledger writes an atomic batch above ``cas.MAX_BATCH`` messages,
whatever the tenant's size: nats-server refuses a batch of more than 1,000
(``jetstream.limits.batch.max_msgs``), and a refused change fails the same way at every retry.

A ledger made anew over thousands of running runs (its bucket lost, its use rebuilt from the
runs) and a one-value ledger remembering thousands of runs are written in several batches,
guarded, their run entries first and their totals last: cut between two batches (its process
dead, or another process's write landing between them), the ledger reads as before the change
— no budget while it is missing, the one value untouched for the workers of this release and
the previous one — and the next change finishes it, adopting or rewriting what was written,
with every charge counted once. Changes of many runs (the sweep's repairs, admissions
group-committed) are cut into writes of bounded size. Checked against the real server."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from decimal import Decimal
from typing import Any

import nats
import nats.js.errors
import pytest
from kube_support import FakeKube
from kv_support import live_keys
from nats.aio.client import Client as NATS

from agentrun import kernel
from agentrun.ledger import (
    Book,
    BudgetRefusal,
    Hold,
    LedgerStore,
    QueuedRun,
    Repair,
    TurnRef,
    codec,
)
from agentrun.ledger.cas import GUARD_IDLE, MAX_BATCH, Stored, Write
from agentrun.ledger.entries import BUDGET_EXHAUSTED, Active, Seed, TenantLimits, UsageFloor
from agentrun.ledger.store import INLINE_RUNS, book_key, making_key
from agentrun.operator.admission.queue import QueueBoard
from agentrun.operator.admission.sweep import LedgerSweep, SweepDeps
from agentrun.operator.platform.events import EventRecorder, Throttle
from agentrun.operator.tenants.registry import Tenants
from agentrun.operator.tenants.writer import TenantStatusWriter
from agentrun.protocol import RunEvent
from agentrun_dev import natsserver

NOW = 1_800_000_000.0
LIMITS = TenantLimits(tokens=10**9, cost_usd=Decimal(1_000), max_concurrent_runs=5_000)
TENANT = "big"
COST = Decimal("0.000001")
"""USD a token."""


class Died(Exception):
    """The process writing died here."""


Step = Callable[[int], Awaitable[object]]


class Hooked(LedgerStore):
    """A store (a process) whose ``before(n)`` runs before it sends its ``n``-th atomic batch
    (from 1) and ``listed()`` after each listing of a tenant's run entries: its death, or
    another process's steps, between its own."""

    before: Step | None = None
    listed: Callable[[], Awaitable[object]] | None = None
    sent = 0

    async def _put(self, writes: Sequence[Write]) -> None:
        if len(writes) > 1:
            self.sent += 1
            if self.before is not None:
                await self.before(self.sent)
        await super()._put(writes)

    async def _list_runs(self, tenant: str, *, deleted: bool = False) -> dict[str, Stored]:
        found = await super()._list_runs(tenant, deleted=deleted)
        if self.listed is not None:
            await self.listed()
        return found


def dies_before(batch: int) -> Step:
    """A ``Hooked.before`` that dies before the ``batch``-th atomic batch goes out."""

    async def before(n: int) -> None:
        if n == batch:
            raise Died(f"before batch {n}")

    return before


class Running:
    """The rebuild of a tenant whose ``runs`` running runs each show ``tokens`` used (a status
    that may move between two asks)."""

    def __init__(self, runs: int, *, tokens: int = 100, more: Sequence[str] = ()) -> None:
        self.uids = [f"run-{i:05d}" for i in range(runs)] + list(more)
        self.tokens = tokens

    async def __call__(self, tenant: str, window: float, end: float) -> Seed:
        active = {
            u: Active("ns", u, window, -1, self.tokens, self.tokens * COST) for u in self.uids
        }
        used = len(self.uids) * self.tokens
        return Seed(UsageFloor(window, used, used * COST, 0.0, end), active)


Opener = Callable[..., Awaitable[Any]]


class Followed:
    """Every run is followed by a process: the sweep leaves active runs alone."""

    def is_tracked(self, uid: str) -> bool:
        return True


class NoEvents:
    async def last_event(self, namespace: str, name: str) -> RunEvent | None:
        return None


def sweeper(store: LedgerStore) -> LedgerSweep:
    """The operator's ledger sweep over ``store``, its clock the store's."""
    api = FakeKube()
    events = EventRecorder(api, throttle=Throttle(repeat_after=0, rate=1000, burst=1000))
    deps = SweepDeps(
        store=store,
        tenants=Tenants(api),
        board=QueueBoard(),
        runs=Followed(),  # type: ignore[arg-type]
        events=NoEvents(),
        api=api,
        tenant_status=TenantStatusWriter(api, events=events),
        clock=store.clock,
    )
    return LedgerSweep(deps)


@pytest.fixture
async def open_store(nats_server: natsserver.NatsServer) -> AsyncIterator[Opener]:
    """``await open_store(cls=LedgerStore, **kwargs)``: a store (a process of its own: its own
    connection and cache) on this test's bucket, its clock at ``NOW``."""
    bucket = f"BATCHES_{uuid.uuid4().hex[:8]}"
    clients: list[NATS] = []

    async def opener(cls: type[LedgerStore] = LedgerStore, **kwargs: Any) -> LedgerStore:
        client = await nats.connect(**nats_server.client_options())
        clients.append(client)
        kwargs.setdefault("clock", lambda: NOW)
        store = await LedgerStore.open(client.jetstream(), bucket=bucket, **kwargs)
        if cls is not LedgerStore:
            store = cls(store.kv, **kwargs)
        return store

    yield opener
    await clients[0].jetstream().delete_key_value(bucket)
    for client in clients:
        await client.close()


async def keys(store: LedgerStore, pattern: str) -> list[str]:
    """The live keys matching ``pattern``; ``"run"``: the tenant's run entries stored apart
    (read many at once: ``live_keys`` reads one at a time)."""
    if pattern != "run":
        return await live_keys(store.kv, pattern)
    prefix: str = store.kv._pre
    info = await store.kv._js.stream_info(store.kv._stream, subjects_filter=f"{prefix}run.>")
    found = [subject.removeprefix(prefix) for subject in info.state.subjects or {}]

    async def live(key: str) -> bool:
        with contextlib.suppress(nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return (await store.kv.get(key)).value is not None
        return False

    alive = await asyncio.gather(*map(live, found))
    return sorted(key for key, ok in zip(found, alive, strict=True) if ok)


async def admit(store: LedgerStore, uid: str) -> BudgetRefusal | None:
    run = QueuedRun(uid, "ns", uid, NOW)
    return await store.admit_run(TENANT, run, limits=LIMITS, need=(100, 100 * COST), now=NOW)


def turn(uid: str, number: int) -> TurnRef:
    return TurnRef(TENANT, uid, "ns", uid, number)


async def settle(worker: LedgerStore, uid: str, *, cumulative: int) -> tuple[int, Decimal]:
    """A worker reserves turn 0 of run ``uid`` and settles it with the run's cumulative usage
    after it; what the settlement charged."""
    ref = turn(uid, 0)
    hold = Hold(uid, 0, 500, 500 * COST, NOW + 60, "w-1", "ns", uid)
    assert await worker.reserve_turn(ref, hold, before=None, prior_owner="", now=NOW) is None
    after = kernel.Usage(input_tokens=cumulative, cost_usd=cumulative * COST)
    return await worker.settle_turn(ref, owner="w-1", prior_owner="", after=after, now=NOW)


async def whole(store: LedgerStore) -> Book:
    """The tenant's ledger read whole, split, its totals the sums over its entries."""
    book = await store.read(TENANT)
    assert book is not None and not book.one_value
    assert book.totals_mismatch() == []
    assert await keys(store, making_key(TENANT)) == []  # the guard is gone
    return book


async def only_runs_apart(store: LedgerStore, book: Book) -> None:
    """Every run's value apart is an entry the ledger holds (nothing left over)."""
    inline = codec.decode_totals((await store.kv.get(book_key(TENANT))).value or b"").inline
    stored = {key.rsplit(".", 1)[1] for key in await keys(store, "run")}
    assert stored == {uid for uid, entry in book.runs.items() if not entry.empty} - inline
    assert len(inline) == INLINE_RUNS


# --- a ledger made anew ---------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["single", "split"])
async def test_a_ledger_made_anew_over_2500_running_runs_admits_and_settles(
    open_store: Opener, layout: str
) -> None:
    """Its bucket lost, a tenant with 2,500 running runs gets its ledger made anew by its next
    admission, every run seeded with what its status showed, in batches of at most
    ``MAX_BATCH`` (the one value of the ``single`` layout cannot hold them: it is split); its
    runs then settle only what is new."""
    running = Running(2_500)
    store = await open_store(layout=layout, rebuild=running)
    worker = await open_store(create=False)
    assert await admit(store, "new") is None
    assert store.batches > 2_500 // MAX_BATCH and store.largest_batch <= MAX_BATCH
    book = await whole(store)
    assert book.active_runs == 2_501 == len(book.active)
    assert (book.used_tokens, book.used_cost) == (250_000, 250_000 * COST)
    assert book.reserved_tokens == 100  # the admission's hold
    await only_runs_apart(store, book)
    assert await settle(worker, "run-01234", cumulative=140) == (40, 40 * COST)
    assert await store.close_run(TENANT, "run-01234", None, end=NOW, now=NOW)
    after = await whole(store)
    assert after.active_runs == 2_500 and after.used_tokens == 250_040
    assert max(worker.largest_batch, store.largest_batch) <= MAX_BATCH


async def test_a_ledger_made_anew_cut_between_batches_is_no_budget_until_finished(
    open_store: Opener,
) -> None:
    """The process making the ledger dies after three of its batches: the run entries written
    are read by nobody (no totals: no budget, as before), and the next admission — another
    process, the runs' statuses moved meanwhile by a turn that committed — adopts them, each
    charged what the floor now counts for it: nothing is charged twice."""
    running = Running(2_500)
    dying = await open_store(Hooked, layout="split", rebuild=running)
    worker = await open_store(create=False)
    dying.before = dies_before(4)
    with pytest.raises(Died):
        await admit(dying, "new")
    assert len(await keys(dying, "run")) == 3 * (MAX_BATCH - 1)
    assert await keys(dying, making_key(TENANT)) == [making_key(TENANT)]
    assert await worker.read(TENANT) is None
    hold = Hold("run-00001", 0, 500, 500 * COST, NOW + 60, "w-1", "ns", "run-00001")
    refusal = await worker.reserve_turn(
        turn("run-00001", 0), hold, before=None, prior_owner="", now=NOW
    )
    assert isinstance(refusal, BudgetRefusal) and refusal.reason == BUDGET_EXHAUSTED
    running.tokens = 120
    again = await open_store(layout="split", rebuild=running)
    assert await admit(again, "new") is None
    book = await whole(again)
    assert book.active_runs == 2_501 and book.used_tokens == 2_500 * 120
    assert {book.active[uid].tokens for uid in running.uids} == {120}
    await only_runs_apart(again, book)
    assert await settle(worker, "run-00001", cumulative=150) == (30, 30 * COST)
    assert again.largest_batch <= MAX_BATCH


async def test_a_guarded_batch_landing_after_another_makers_listing_makes_it_start_over(
    open_store: Opener,
) -> None:
    """Two operators make the same lost ledger at once from rebuilds that differ (1,000 runs
    started between them). The second lists the run entries between the first's third and
    fourth batch, the fourth holding only runs the second does not know, and the first dies
    after it: the fourth batch changed the guard, so the second starts over, lists again and
    counts every entry there is — none is left that its totals do not count."""
    first = await open_store(Hooked, layout="split")
    first.rebuild = Running(600, more=[f"x-{i:04d}" for i in range(1_000)])
    second = await open_store(Hooked, layout="split", rebuild=Running(600))
    paused, listed, sent = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def first_before(n: int) -> None:
        if n == 4:  # x-0196 to x-0450: all unknown to the second
            paused.set()
            await listed.wait()
        elif n == 5:
            sent.set()
            raise Died(f"before batch {n}")

    async def second_listed() -> None:
        if paused.is_set() and not listed.is_set():
            listed.set()
            await sent.wait()

    first.before, second.listed = first_before, second_listed
    dying = asyncio.create_task(admit(first, "new-1"))
    pausing = asyncio.create_task(paused.wait())
    await asyncio.wait([dying, pausing], timeout=30, return_when=asyncio.FIRST_COMPLETED)
    pausing.cancel()
    assert paused.is_set(), str(dying.exception() if dying.done() else "the first never paused")
    assert await admit(second, "new-2") is None
    with pytest.raises(Died):
        await dying
    book = await whole(second)
    assert book.active_runs == 1 + 600 + 451 == len(book.active)
    await only_runs_apart(second, book)
    assert second.conflicts >= 1


# --- a one-value ledger split ---------------------------------------------------------------------


async def remembering(store: LedgerStore, *, ended: int = 1_500, active: int = 100) -> bytes:
    """Store a one-value ledger (as the previous release reads it) with ``active`` runs, each
    with its admission's hold, and ``ended`` runs remembered as ended until ``NOW + 3_000``;
    its value."""
    book = Book.new(TENANT, LIMITS, now=NOW, one_value=True)
    for i in range(active):
        assert book.admit(f"a-{i:04d}", "ns", f"a-{i:04d}", now=NOW, need_tokens=100) is None
    for i in range(ended):
        book.load_end(f"e-{i:04d}", NOW + 3_000)
    value = codec.encode_one_value(book)
    await store.kv.put(book_key(TENANT), value)
    return value


@pytest.mark.parametrize("by", ["operator set to split", "admission past 800 runs"])
async def test_a_one_value_ledger_remembering_1500_runs_is_split_and_its_memories_go(
    open_store: Opener, by: str
) -> None:
    """A one-value ledger remembering 1,500 ended runs beside 100 active ones is split — by
    an operator set to ``split``, or by an admission of one that is not — in batches of at
    most ``MAX_BATCH``, every run and hold kept; an ended run admitted again takes no slot;
    and the sweep's forgetting of the 1,500 memories, an hour on, deletes their values in
    writes of bounded size."""
    store = await open_store(layout="split" if by.startswith("operator") else "single")
    await remembering(store)
    if by.startswith("operator"):
        await store.repair_entry(TENANT, [], limits=LIMITS, now=NOW)
    else:
        assert await admit(store, "new") is None
    book = await whole(store)
    assert sum(bool(entry.ended) for entry in book.runs.values()) == 1_500
    active = 100 if by.startswith("operator") else 101
    assert book.active_runs == active and book.reserved_tokens == 100 * active
    await only_runs_apart(store, book)
    assert await admit(store, "e-0007") is None  # remembered as ended: no slot
    assert (await whole(store)).active_runs == active
    later = NOW + 3_001
    forget = book.forgettable(later)
    assert len(forget) == 1_500
    await store.repair_entry(TENANT, [], limits=LIMITS, now=later, forget=forget)
    after = await whole(store)
    assert after.active_runs == active and len(after.runs) == active
    await only_runs_apart(store, after)
    assert store.largest_batch <= MAX_BATCH


async def test_a_split_cut_between_batches_leaves_the_one_value_working_until_redone(
    open_store: Opener,
) -> None:
    """The operator splitting a one-value ledger dies after two batches: the one value is
    untouched (the workers of this release and of the previous one read and write it as
    before: a worker reserves and settles a call on it), and the next change — later, when
    the runs' memories have expired — splits it whole, the worker's charge and hold in it,
    and deletes what the cut split wrote for runs it no longer holds."""
    dying = await open_store(Hooked, layout="split")
    worker = await open_store(create=False)
    before = await remembering(dying)
    dying.before = dies_before(3)
    with pytest.raises(Died):
        await dying.repair_entry(TENANT, [], limits=LIMITS, now=NOW)
    assert len(await keys(dying, "run")) == 2 * (MAX_BATCH - 1)
    assert (
        await dying.kv.get(book_key(TENANT))
    ).value == before  # as the previous release reads it
    assert await settle(worker, "a-0003", cumulative=70) == (70, 70 * COST)
    hold = Hold("a-0004", 0, 500, 500 * COST, NOW + 600, "w-2", "ns", "a-0004")
    assert (
        await worker.reserve_turn(turn("a-0004", 0), hold, before=None, prior_owner="", now=NOW)
        is None
    )
    assert codec.is_one_value((await worker.kv.get(book_key(TENANT))).value or b"")
    later = NOW + 3_001
    again = await open_store(layout="split", clock=lambda: later)
    await again.repair_entry(TENANT, [], limits=LIMITS, now=later)
    book = await whole(again)
    assert book.active_runs == 100 and len(book.runs) == 100  # the memories expired
    assert book.used_tokens == 70 and book.hold("a-0004:0") == hold
    assert book.reserved_tokens == 100 * 100 + 500
    await only_runs_apart(again, book)
    assert again.largest_batch <= MAX_BATCH


async def test_a_worker_writing_between_the_splits_batches_makes_it_start_over(
    open_store: Opener,
) -> None:
    """A worker reserves a call on the one value between two batches of its split: the
    split's last batch loses its compare-and-set, and its next attempt splits the ledger with
    that hold in it, rewriting only what changed."""
    store = await open_store(Hooked, layout="split")
    worker = await open_store(create=False)
    await remembering(store)
    hold = Hold("a-0009", 0, 500, 500 * COST, NOW + 600, "w-3", "ns", "a-0009")
    ref = turn("a-0009", 0)

    async def between(n: int) -> None:
        if n == 2:
            assert (
                await worker.reserve_turn(ref, hold, before=None, prior_owner="", now=NOW) is None
            )

    store.before = between
    await store.repair_entry(TENANT, [], limits=LIMITS, now=NOW)
    assert store.conflicts == 1
    book = await whole(store)
    assert book.hold(ref.key) == hold and book.reserved_tokens == 100 * 100 + 500
    await only_runs_apart(store, book)
    assert store.largest_batch <= MAX_BATCH


async def test_what_a_split_that_never_finished_left_is_dropped_once_its_guard_is_idle(
    open_store: Opener,
) -> None:
    """A split cut between batches whose ledger stays one value (the operator set back to
    ``single``, or the admissions that needed it gone) leaves values apart that nobody reads:
    the operator's sweep drops them once their guard has been idle ``GUARD_IDLE`` — not while
    a split may still be writing — and the one value stays as it is."""
    dying = await open_store(Hooked, layout="split")
    before = await remembering(dying)
    dying.before = dies_before(2)
    with pytest.raises(Died):
        await dying.repair_entry(TENANT, [], limits=LIMITS, now=NOW)
    soon = await open_store(clock=lambda: NOW + GUARD_IDLE - 1)
    assert await soon.unfinished() == []
    await soon.drop_unfinished(TENANT)
    assert len(await keys(soon, "run")) == MAX_BATCH - 1
    idle = await open_store(clock=lambda: NOW + GUARD_IDLE)
    assert await idle.unfinished() == [TENANT]
    await sweeper(idle).sweep()
    assert await keys(idle, "run") == [] and await idle.unfinished() == []
    assert await keys(idle, making_key(TENANT)) == []
    assert (await idle.kv.get(book_key(TENANT))).value == before


# --- changes of many runs -------------------------------------------------------------------------


async def test_admissions_of_many_runs_at_once_are_written_in_bounded_batches(
    open_store: Opener,
) -> None:
    """Forty admissions of 32 runs each at once, group-committed: each write carries as many
    as its batch holds (not all forty: 1,280 runs and the totals), and every run is
    admitted."""
    store = await open_store(layout="split")
    assert await admit(store, "first") is None  # the ledger exists: no write makes it
    runs = [QueuedRun(f"r-{i:04d}", "ns", f"r-{i:04d}", NOW) for i in range(40 * 32)]
    need = (100, 100 * COST)

    async def admit_32(start: int) -> list[BudgetRefusal | None]:
        part = [(run, need) for run in runs[start : start + 32]]
        return await store.admit_runs(TENANT, part, limits=LIMITS, now=NOW)

    answers = await asyncio.gather(*map(admit_32, range(0, len(runs), 32)))
    assert answers == [[None] * 32] * 40
    book = await whole(store)
    assert book.active_runs == 1 + 1_280
    assert store.largest_batch <= MAX_BATCH


async def test_the_sweeps_repair_of_1000_runs_that_ended_unseen_is_written_in_bounded_batches(
    open_store: Opener,
) -> None:
    """A thousand runs of a split ledger ended while no operator watched (their objects and
    events gone): the sweep closes them all in one repair, written ``BATCH_VALUES`` runs a
    write, each slot freed once."""
    store = await open_store(layout="split")
    uids = [f"r-{i:04d}" for i in range(1_000)]
    for start in range(0, len(uids), 100):
        answers = await asyncio.gather(*(admit(store, uid) for uid in uids[start : start + 100]))
        assert answers == [None] * 100
    read = await whole(store)
    repairs = [Repair("", uid, None, since=read.slot_since(uid)) for uid in uids]
    await store.repair_entry(TENANT, repairs, limits=LIMITS, now=NOW + 60)
    book = await whole(store)
    assert book.active_runs == 0 and book.reserved_tokens == 0
    assert sum(bool(entry.ended) for entry in book.runs.values()) == 1_000
    assert store.largest_batch <= MAX_BATCH
