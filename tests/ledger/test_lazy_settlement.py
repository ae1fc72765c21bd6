"""A committed turn whose run goes on leaves its settlement to the run's next reservation
(``TurnHold.on_commit``): which turns settle at once, what the book shows in between, and that
every way the settlement can come — the next reservation, a turn that makes no call, the run's
close, the sweep of an expired hold — charges each call exactly once.

The pure part (``Book``) checks the budget's edges in the gap: an answered call's hold holds
what it used (``BookState.record_spend``), so another run's call fits exactly as it would after
the settlement. The rest runs ``TurnHold`` against a real ``LedgerStore`` on nats-server."""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from typing import Any

import pytest

from agentrun import kernel
from agentrun.ledger import Book, Hold, LedgerStore, TenantLimits, TurnRef
from agentrun.ledger.store import Repair

from .conftest import NOW
from .test_hold import Clock, admit, after_turn, budget

LIMIT = 1_000


def pure_book() -> Book:
    b = Book(tenant="acme", limits=TenantLimits(tokens=LIMIT), window=NOW - 60)
    for uid in ("r1", "r2"):
        assert b.admit(uid, "ns", uid, now=NOW) is None
    return b


def hold(uid: str, turn: int, tokens: int, owner: str) -> Hold:
    return Hold(uid, turn, tokens, Decimal(0), NOW + 60, owner, "ns", uid)


def test_an_answered_hold_holds_what_its_call_used_so_another_call_fits_as_after_settlement() -> (
    None
):
    b = pure_book()
    assert b.reserve("r1:0", hold("r1", 0, 800, "w1"), now=NOW) is None
    assert b.reserve("r2:0", hold("r2", 0, 701, "w2"), now=NOW) is not None  # 800 + 701 > 1000
    assert b.record_spend("r1:0", owner="w1", tokens=300, cost_usd=Decimal(0))
    assert (b.used_tokens, b.reserved_tokens) == (0, 300)
    assert b.reserve("r2:0", hold("r2", 0, 701, "w2"), now=NOW) is not None  # 300 + 701
    assert b.reserve("r2:0", hold("r2", 0, 700, "w2"), now=NOW) is None  # exactly the limit
    # the settlement the next reservation makes moves the 300 from reserved to used
    b.catch_up("r1", turn=0, tokens=300, cost_usd=Decimal(0), now=NOW)
    assert (b.used_tokens, b.reserved_tokens) == (300, 700)
    assert b.totals_mismatch() == []


def test_a_call_that_used_more_than_its_worst_case_is_held_for_all_it_used() -> None:
    b = pure_book()
    assert b.reserve("r1:0", hold("r1", 0, 400, "w1"), now=NOW) is None
    # the provider counted 500 prompt tokens it was not sent
    assert b.record_spend("r1:0", owner="w1", tokens=900, cost_usd=Decimal(0))
    assert b.reserved_tokens == 900
    assert b.reserve("r2:0", hold("r2", 0, 101, "w2"), now=NOW) is not None
    assert b.reserve("r2:0", hold("r2", 0, 100, "w2"), now=NOW) is None
    assert b.totals_mismatch() == []


def test_a_spend_recorded_by_another_owner_changes_nothing() -> None:
    b = pure_book()
    assert b.reserve("r1:0", hold("r1", 0, 400, "w1"), now=NOW) is None
    assert not b.record_spend("r1:0", owner="w9", tokens=100, cost_usd=Decimal(0))
    assert (b.reserved_tokens, b.hold("r1:0").tokens) == (400, 400)  # type: ignore[union-attr]


# --------------------------------------------------------------------------- TurnHold.on_commit


def ended(state: kernel.RunState, phase: kernel.Phase) -> kernel.RunState:
    return dataclasses.replace(state, phase=phase)


async def answered_turn(
    store: LedgerStore, tenant: str, turn: int, *, prior_owner: str = "", used: int = 100
) -> tuple[Any, kernel.RunState]:
    """Turn ``turn`` of ``run-1``, reserved (settling the turn before) and answered, using
    ``used`` tokens more than the turn before: its hold and the state after it."""
    ref = TurnRef(tenant, "run-1", "ns", "run-1", turn)
    th = store.turn_hold(ref, clock=Clock(), prior_owner=prior_owner)
    before = None if turn == 0 else after_turn(turn - 1, input_tokens=used * turn)
    assert await th.reserve(tokens=500, cost_usd=Decimal(0), before=before) is None
    await th.spend(kernel.Usage(input_tokens=used))
    return th, after_turn(turn, input_tokens=used * (turn + 1))


async def charged(store: LedgerStore, tenant: str) -> tuple[int, int, list[str]]:
    """The tenant's (used, abandoned) tokens and its holds' keys."""
    book = await store.read(tenant)
    assert book is not None
    return book.used_tokens, book.abandoned_tokens, sorted(book.holds)


async def left_to_next(store: LedgerStore, tenant: str) -> tuple[Any, kernel.RunState]:
    """``run-1`` admitted, its turn 0 answered and committed, its settlement left to the
    next reservation: the turn's hold and the run's state after it."""
    await admit(store, tenant, "run-1", tokens=10_000)
    th, after = await answered_turn(store, tenant, 0)
    assert await th.on_commit(after) is False
    return th, after


async def test_a_turn_whose_run_goes_on_writes_nothing_after_its_commit(
    store: LedgerStore,
    tenant: str,
) -> None:
    await admit(store, tenant, "run-1", tokens=10_000)
    th, after = await answered_turn(store, tenant, 0)
    entry = await store.kv.get(f"book.{tenant}")
    async with th:
        assert await th.on_commit(after) is False
    assert th.held is False
    assert (await store.kv.get(f"book.{tenant}")).revision == entry.revision  # no write at all
    book = await store.read(tenant)
    assert book is not None
    assert (book.used_tokens, book.reserved_tokens, book.abandoned_tokens) == (0, 100, 0)

    # the next turn's reservation settles turn 0 and drops its hold, in one write
    nxt, _ = await answered_turn(store, tenant, 1, prior_owner=th.owner)
    book = await store.read(tenant)
    assert book is not None
    assert sorted(book.holds) == ["run-1:1"]
    assert (book.used_tokens, book.abandoned_tokens) == (100, 0)
    assert book.active["run-1"].turn == 0
    assert nxt.held


@pytest.mark.parametrize(
    "phase",
    [kernel.Phase.COMPLETED, kernel.Phase.AWAITING_APPROVAL, kernel.Phase.MAX_STEPS],
)
async def test_a_turn_that_ends_the_run_or_waits_for_a_person_settles_at_once(
    store: LedgerStore,
    tenant: str,
    phase: kernel.Phase,
) -> None:
    await admit(store, tenant, "run-1", tokens=10_000)
    th, after = await answered_turn(store, tenant, 0)
    async with th:
        assert await th.on_commit(ended(after, phase)) is True
    book = await store.read(tenant)
    assert book is not None
    assert (book.used_tokens, book.holds) == (100, {})


async def test_a_turn_that_made_no_call_settles_at_once_and_resolves_the_turn_left_to_it(
    store: LedgerStore,
    tenant: str,
) -> None:
    """Turn 0 left its settlement to the next reservation; turn 1 makes no call (it holds
    nothing), so it settles itself, resolving turn 0 by its committer: the run's usage once."""
    th, _ = await left_to_next(store, tenant)
    ref = TurnRef(tenant, "run-1", "ns", "run-1", 1)
    async with store.turn_hold(ref, clock=Clock(), prior_owner=th.owner) as no_call:
        assert await no_call.on_commit(after_turn(1, input_tokens=100)) is True
    assert await charged(store, tenant) == (100, 0, [])


async def test_another_deliverys_answered_call_of_a_turn_left_to_the_next_is_charged_once(
    store: LedgerStore,
    tenant: str,
) -> None:
    """Turn 0 run by two deliveries (a redelivery while the first still ran it): the winner
    commits and leaves the settlement; the loser's block exits charging its own call. The next
    reservation then resolves turn 0 by the winner: the loser's call is not charged again."""
    await admit(store, tenant, "run-1", tokens=10_000)
    clock = Clock()
    winner = budget(store, tenant, "run-1", 0, clock)
    loser = budget(store, tenant, "run-1", 0, clock)
    await winner.reserve(tokens=500, cost_usd=Decimal(0))
    await winner.spend(kernel.Usage(input_tokens=100))
    async with loser:
        await loser.reserve(tokens=500, cost_usd=Decimal(0))  # sets the winner's hold aside
        await loser.spend(kernel.Usage(input_tokens=130))
        async with winner:
            assert await winner.on_commit(after_turn(0, input_tokens=100)) is False
    await answered_turn(store, tenant, 1, prior_owner=winner.owner)
    book = await store.read(tenant)
    assert book is not None
    assert sorted(book.holds) == ["run-1:1"]
    assert (book.used_tokens, book.abandoned_tokens) == (100 + 130, 130)


async def test_a_run_cancelled_before_its_next_turn_is_charged_its_usage_once_at_close(
    store: LedgerStore,
    tenant: str,
) -> None:
    th, after = await left_to_next(store, tenant)
    last = kernel.RunSummary(kernel.Phase.RUNNING, turn=1, steps=1, usage=after.usage)
    assert await store.close_run(tenant, "run-1", last, end=NOW, now=NOW, committer=th.owner)
    assert await charged(store, tenant) == (100, 0, [])


async def test_a_hold_left_past_its_expiry_is_resolved_by_its_committer_at_the_sweep(
    store: LedgerStore,
    tenant: str,
) -> None:
    """The run's next turn waited longer than a hold lives (its tenant's turns queued behind
    others): the sweep finds the committed turn's hold expired, and charges it as the run's
    usage, not as an abandoned call; the next reservation charges nothing more."""
    th, after = await left_to_next(store, tenant)
    last = kernel.RunSummary(kernel.Phase.RUNNING, turn=1, steps=1, usage=after.usage)
    later = NOW + 3_600
    repair = Repair("run-1:0", "run-1", last, NOW, committer=th.owner)
    await store.repair_entry(tenant, [repair], limits=None, now=later)
    assert await charged(store, tenant) == (100, 0, [])
    await answered_turn(store, tenant, 1, prior_owner=th.owner)
    book = await store.read(tenant)
    assert book is not None
    assert (book.used_tokens, book.abandoned_tokens) == (100, 0)
