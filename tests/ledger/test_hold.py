"""A turn's ledger hold (reserve → settle, or released / abandoned when its block exits
uncommitted) against a real LedgerStore."""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from typing import Any

import pytest

from agentrun import kernel
from agentrun.ledger import (
    DEFAULT_HOLD_TTL,
    BudgetRefusal,
    BudgetWait,
    CallNeed,
    Granted,
    LedgerStore,
    QueuedRun,
    TenantLimits,
    TurnHold,
    TurnRef,
    worst_case,
)

from .conftest import NOW


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def admit(store: LedgerStore, tenant: str, uid: str, **limits: object) -> None:
    refusal = await store.admit_run(
        tenant,
        QueuedRun(uid, "ns", uid, NOW),
        limits=TenantLimits(**limits),  # type: ignore[arg-type]
        need=(0, Decimal(0)),
    )
    assert refusal is None


def budget(store: LedgerStore, tenant: str, uid: str, turn: int, clock: Clock) -> TurnHold:
    return store.turn_hold(TurnRef(tenant, uid, "ns", uid, turn), clock=clock)


def after_turn(turn: int, **usage: object) -> kernel.RunState:
    state = kernel.initial_state(goal="g")
    return dataclasses.replace(state, usage=kernel.Usage(**usage), turn=turn + 1)  # type: ignore[arg-type]


async def test_reserve_holds_the_worst_case(store: LedgerStore, tenant: str) -> None:
    await admit(store, tenant, "run-1", tokens=1_000)
    clock = Clock()
    tb = budget(store, tenant, "run-1", 0, clock)
    assert tb.key == "run-1:0"
    assert tb.held is False
    assert await tb.reserve(tokens=600, cost_usd=Decimal("0.06")) is None
    assert tb.held is True
    book = await store.read(tenant)
    assert book is not None
    hold = book.holds["run-1:0"]
    assert (hold.run_uid, hold.turn, hold.tokens, hold.cost_usd) == (
        "run-1",
        0,
        600,
        Decimal("0.06"),
    )
    assert hold.owner == tb.owner
    assert hold.expires == NOW + DEFAULT_HOLD_TTL
    assert (hold.namespace, hold.name) == ("ns", "run-1")


async def test_a_refused_reservation_is_not_held(store: LedgerStore, tenant: str) -> None:
    await admit(store, tenant, "run-1", cost_usd=Decimal("5.00"))
    clock = Clock()
    first = budget(store, tenant, "run-1", 0, clock)
    assert await first.reserve(tokens=10, cost_usd=Decimal("4.95")) is None
    second = budget(store, tenant, "run-2", 0, clock)
    refusal = await second.reserve(tokens=10, cost_usd=Decimal("0.09"))
    assert refusal is not None and refusal.resource == "costUSD"
    assert second.held is False
    book = await store.read(tenant)
    assert set(book.holds) == {"run-1:0"}  # type: ignore[union-attr]
    # releasing or refreshing a delivery that holds nothing touches nothing
    await second.release()
    await second.refresh()
    assert set((await store.read(tenant)).holds) == {"run-1:0"}  # type: ignore[union-attr]


async def test_refresh_extends_the_hold(store: LedgerStore, tenant: str) -> None:
    await admit(store, tenant, "run-1")
    clock = Clock()
    tb = budget(store, tenant, "run-1", 2, clock)
    await tb.reserve(tokens=5, cost_usd=Decimal(0))
    clock.now = NOW + 45
    await tb.refresh()
    hold = (await store.read(tenant)).holds["run-1:2"]  # type: ignore[union-attr]
    assert hold.expires == NOW + 45 + DEFAULT_HOLD_TTL
    assert tb.held is True


async def test_a_call_given_up_while_it_waits_leaves_the_waiting_calls(
    store: LedgerStore, tenant: str
) -> None:
    """The call fits what the tenant used but not next to another run's hold: it waits, and
    leaving the block before it is held takes it out of the book's waiting calls (the next
    waiter goes first instead of behind a call nobody makes)."""
    free = kernel.Pricing(Decimal(0), Decimal(0), Decimal(0))
    await admit(store, tenant, "run-1", tokens=10_000)
    await admit(store, tenant, "run-2", tokens=10_000)
    clock = Clock()
    holder = budget(store, tenant, "run-1", 0, clock)
    assert await holder.reserve_call(CallNeed(1_000, 5_000, free)) == Granted(
        5_000, 6_000, Decimal(0)
    )
    async with budget(store, tenant, "run-2", 0, clock) as waiter:
        assert isinstance(await waiter.reserve_call(CallNeed(1_000, 5_000, free)), BudgetWait)
        assert (waiter.held, waiter.waiting) == (False, True)
        book = await store.read(tenant)
        assert book is not None and set(book.waiting) == {"run-2:0"}
    assert waiter.waiting is False
    book = await store.read(tenant)
    assert book is not None and book.waiting == {} and set(book.holds) == {"run-1:0"}


async def test_settle_charges_the_cumulative_usage_and_drops_the_hold(
    store: LedgerStore, tenant: str
) -> None:
    await admit(store, tenant, "run-1", tokens=10_000)
    clock = Clock()
    turn0 = budget(store, tenant, "run-1", 0, clock)
    await turn0.reserve(tokens=2_000, cost_usd=Decimal("0.02"))
    await turn0.settle(after_turn(0, input_tokens=300, output_tokens=50, cost_usd=Decimal("0.004")))
    assert turn0.held is False
    book = await store.read(tenant)
    assert book is not None
    assert (book.used_tokens, book.used_cost, book.holds) == (350, Decimal("0.004"), {})

    turn1 = budget(store, tenant, "run-1", 1, clock)
    await turn1.reserve(tokens=2_000, cost_usd=Decimal("0.02"))
    after = after_turn(1, input_tokens=800, output_tokens=90, cost_usd=Decimal("0.0105"))
    await turn1.settle(after)
    await turn1.settle(after)  # idempotent
    book = await store.read(tenant)
    assert book is not None
    assert (book.used_tokens, book.used_cost, book.holds) == (890, Decimal("0.0105"), {})
    assert book.active["run-1"].turn == 1


async def test_release_drops_only_its_own_hold(store: LedgerStore, tenant: str) -> None:
    await admit(store, tenant, "run-1", tokens=1_000)
    clock = Clock()
    first = budget(store, tenant, "run-1", 3, clock)
    await first.reserve(tokens=100, cost_usd=Decimal(0))
    # the turn is redelivered: a second delivery takes the hold over under the same key
    second = budget(store, tenant, "run-1", 3, clock)
    assert second.owner != first.owner
    await second.reserve(tokens=120, cost_usd=Decimal(0))
    other = budget(store, tenant, "run-2", 0, clock)
    await other.reserve(tokens=10, cost_usd=Decimal(0))

    await first.release()  # not its hold any more: nothing dropped
    assert first.held is False
    book = await store.read(tenant)
    assert book is not None
    assert book.holds["run-1:3"].owner == second.owner
    assert set(book.holds) == {"run-1:3", "run-2:0"}

    await second.release()
    book = await store.read(tenant)
    assert set(book.holds) == {"run-2:0"}  # type: ignore[union-attr]
    assert book.used_tokens == 0  # type: ignore[union-attr]


async def test_a_turn_abandoned_after_its_model_call_is_charged_for_it(
    store: LedgerStore, tenant: str
) -> None:
    await admit(store, tenant, "run-1", tokens=1_000)
    async with budget(store, tenant, "run-1", 0, Clock()) as turn:
        await turn.reserve(tokens=500, cost_usd=Decimal("0.01"))
        await turn.spend(
            kernel.Usage(input_tokens=100, output_tokens=20, cost_usd=Decimal("0.0004"))
        )
    # the block exits before the commit (cancelled): the call is charged, the hold dropped
    assert turn.held is False
    book = await store.read(tenant)
    assert book is not None and book.holds == {}
    assert (book.used_tokens, book.abandoned_tokens) == (120, 120)
    assert book.used_cost == book.abandoned_cost == Decimal("0.0004")


async def test_a_turn_that_exits_before_its_model_answered_is_released_uncharged(
    store: LedgerStore, tenant: str
) -> None:
    await admit(store, tenant, "run-1", tokens=1_000)
    with pytest.raises(RuntimeError, match="worker stops"):
        async with budget(store, tenant, "run-1", 0, Clock()) as turn:
            await turn.reserve(tokens=500, cost_usd=Decimal("0.01"))
            raise RuntimeError("worker stops")
    assert turn.held is False
    book = await store.read(tenant)
    assert book is not None and book.holds == {} and book.used_tokens == 0


async def test_a_settled_turn_gives_nothing_back_on_exit(store: LedgerStore, tenant: str) -> None:
    await admit(store, tenant, "run-1", tokens=1_000)
    async with budget(store, tenant, "run-1", 0, Clock()) as turn:
        await turn.reserve(tokens=500, cost_usd=Decimal(0))
        await turn.spend(kernel.Usage(input_tokens=100, output_tokens=20))
        await turn.settle(after_turn(0, input_tokens=100, output_tokens=20))
    book = await store.read(tenant)
    assert book is not None and book.holds == {}
    assert (book.used_tokens, book.abandoned_tokens) == (120, 0)


class SettlementFails(LedgerStore):
    """The store as a turn's ``TurnLedger`` whose settlement cannot reach the ledger while
    ``down`` (every other operation works)."""

    down = False

    async def settle_turn(self, ref: TurnRef, **kwargs: Any) -> tuple[int, Decimal]:
        if self.down:
            raise ConnectionError("the ledger is unreachable")
        return await super().settle_turn(ref, **kwargs)


async def test_a_committed_turn_is_not_charged_as_abandoned(
    store: LedgerStore, tenant: str
) -> None:
    await admit(store, tenant, "run-1", tokens=1_000)
    flaky = SettlementFails(store.kv, clock=store.clock)
    turn = budget(flaky, tenant, "run-1", 0, Clock())
    await turn.reserve(tokens=500, cost_usd=Decimal(0))
    await turn.spend(kernel.Usage(input_tokens=100, output_tokens=20))
    flaky.down = True  # the turn committed, then its settlement failed
    with pytest.raises(ConnectionError):
        await turn.settle(after_turn(0, input_tokens=100, output_tokens=20))
    flaky.down = False
    async with turn:
        pass  # leaving the block must not charge the call a second time
    book = await store.read(tenant)
    assert book is not None and (book.used_tokens, book.abandoned_tokens) == (0, 0)
    assert book.holds == {}


async def test_a_turn_whose_commit_landed_unbeknown_to_its_delivery_is_charged_once(
    store: LedgerStore, tenant: str
) -> None:
    """The delivery's commit landed but its answer was lost (a worker cancelled at its drain's
    end while the append was in flight): its block exits uncommitted and charges the call as
    abandoned. The turn event names it, so the next turn's reservation, resolving that turn
    by it and settling the run's usage, must leave the call charged once, as the run's."""
    await admit(store, tenant, "run-1", tokens=100_000)
    async with budget(store, tenant, "run-1", 0, Clock()) as first:
        await first.reserve(tokens=500, cost_usd=Decimal(0))
        await first.spend(kernel.Usage(input_tokens=100, output_tokens=10))
        # commit_turn: the event (owner=first.owner) lands; the worker never learns it
    ref = TurnRef(tenant, "run-1", "ns", "run-1", 1)
    second = store.turn_hold(ref, clock=Clock(), prior_owner=first.owner)
    await second.reserve(
        tokens=500, cost_usd=Decimal(0), before=after_turn(0, input_tokens=100, output_tokens=10)
    )
    book = await store.read(tenant)
    assert book is not None
    assert (book.used_tokens, book.abandoned_tokens) == (110, 0)


def test_worst_case_prices_prompt_and_output_at_the_uncached_input_price() -> None:
    pricing = kernel.Pricing(
        input_per_million=Decimal("2.5"),
        cached_input_per_million=Decimal("1.25"),
        output_per_million=Decimal("10"),
    )
    tokens, cost = worst_case(prompt_tokens=3_000, output_tokens=500, pricing=pricing)
    assert tokens == 3_500
    assert cost == Decimal("0.0075") + Decimal("0.005")
    assert cost == pricing.cost(input_tokens=3_000, cached_input_tokens=0, output_tokens=500)
    assert cost > pricing.cost(input_tokens=3_000, cached_input_tokens=3_000, output_tokens=500)
    assert worst_case(prompt_tokens=0, output_tokens=0, pricing=pricing) == (0, Decimal(0))


async def test_a_turn_that_made_no_call_resolves_the_turn_before_when_it_settles(
    store: LedgerStore, tenant: str
) -> None:
    """Turn 0 was run twice: its committer died before settling and the other delivery after
    its call, both holds left answered. Turn 1 makes no model call (it reserves nothing), but
    its settlement resolves turn 0 by the committer turn 0's event names: only the other
    call is charged as abandoned, the committer's is in the run's usage."""
    await admit(store, tenant, "run-1", tokens=10_000)
    clock = Clock()
    winner, loser = (
        budget(store, tenant, "run-1", 0, clock),
        budget(store, tenant, "run-1", 0, clock),
    )
    await winner.reserve(tokens=1_000, cost_usd=Decimal(0))
    await winner.spend(kernel.Usage(input_tokens=100, output_tokens=20))
    await loser.reserve(tokens=1_000, cost_usd=Decimal(0))  # sets the winner's hold aside
    await loser.spend(kernel.Usage(input_tokens=130, output_tokens=25))
    book = await store.read(tenant)
    assert book is not None and len(book.holds) == 2 and book.used_tokens == 0

    ref = TurnRef(tenant, "run-1", "ns", "run-1", 1)
    async with store.turn_hold(ref, clock=clock, prior_owner=winner.owner) as resumed:
        await resumed.settle(after_turn(1, input_tokens=100, output_tokens=20))
    book = await store.read(tenant)
    assert book is not None and book.holds == {}
    assert (book.used_tokens, book.abandoned_tokens) == (120 + 155, 155)


class MovedOn:
    """A ``moved_on`` that answers ``answer`` and counts how often it was asked."""

    def __init__(self, answer: bool) -> None:
        self.answer = answer
        self.asked = 0

    async def __call__(self) -> bool:
        self.asked += 1
        return self.answer


@pytest.mark.parametrize("committed", [True, False])
async def test_a_reservation_that_sets_an_answered_hold_aside_asks_the_runs_events(
    store: LedgerStore, tenant: str, committed: bool
) -> None:
    """Another delivery's answered hold of the turn is set aside: that delivery may have
    committed the turn and died before settling it. If the run's events moved on, this
    delivery is stale: refused ``TurnCommitted``, its hold given back, the other's kept aside
    for the turn's resolution; if not, its call is held."""
    await admit(store, tenant, "run-1", tokens=10_000)
    clock = Clock()
    first = budget(store, tenant, "run-1", 0, clock)
    await first.reserve(tokens=500, cost_usd=Decimal(0))
    await first.spend(kernel.Usage(input_tokens=100))
    asked = MovedOn(committed)
    ref = TurnRef(tenant, "run-1", "ns", "run-1", 0)
    need = CallNeed(prompt_tokens=100, output_tokens=100, pricing=kernel.Pricing())
    async with store.turn_hold(ref, clock=clock, moved_on=asked) as second:
        answer = await second.reserve_call(need)
        assert asked.asked == 1
        if committed:
            assert isinstance(answer, BudgetRefusal) and answer.reason == "TurnCommitted"
            assert second.held is False
        else:
            assert isinstance(answer, Granted) and answer.contested
            assert second.held is True
        book = await store.read(tenant)
        assert book is not None
        owners = sorted(h.owner for h in book.holds.values())
        assert owners == sorted([first.owner] + ([] if committed else [second.owner]))


async def test_an_uncontested_reservation_never_asks_the_runs_events(
    store: LedgerStore, tenant: str
) -> None:
    """A first delivery, and one taking over a hold whose call never answered, are not
    contested: no read of the run's events."""
    await admit(store, tenant, "run-1", tokens=10_000)
    clock = Clock()
    first = budget(store, tenant, "run-1", 0, clock)
    await first.reserve(tokens=500, cost_usd=Decimal(0))  # never answered
    asked = MovedOn(True)
    ref = TurnRef(tenant, "run-1", "ns", "run-1", 0)
    need = CallNeed(prompt_tokens=100, output_tokens=100, pricing=kernel.Pricing())
    async with store.turn_hold(ref, clock=clock, moved_on=asked) as second:
        answer = await second.reserve_call(need)
    assert isinstance(answer, Granted) and not answer.contested
    assert asked.asked == 0
