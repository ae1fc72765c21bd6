"""The ledger's boundaries and bookkeeping, each stated once: a limit reached exactly still
fits, refusals name their resource and say why, a call asking again is not its own rival,
waiters expire and refresh at their bounds, admission holds the first call as itself, a call
charged as abandoned at what it had recorded is charged the rest once its delivery leaves.
Written from the survivors of ``make mutate`` in ``book``, ``reserve``, ``deliveries``,
``entries`` and ``state`` (tests/README.md); pure, ``now`` passed in."""

from __future__ import annotations

import dataclasses
from decimal import Decimal

import pytest

from agentrun import kernel
from agentrun.ledger import (
    Book,
    BudgetWait,
    CallNeed,
    Granted,
    Hold,
    deliveries,
    window_start,
)
from agentrun.ledger.entries import (
    ADMISSION_HOLD_TTL,
    BUDGET_EXHAUSTED,
    BUDGET_HELD,
    CHARGED_MEMORY,
    TURN_COMMITTED,
    WAITER_TTL,
    TenantLimits,
    Waiter,
    short_of,
)

NOW = 19_675 * 86_400.0 + 3_600.0
FREE = kernel.Pricing()
PRICED = kernel.Pricing(Decimal("0"), Decimal("0"), Decimal("10"))
"""Only output costs: 10 USD per 1M output tokens."""


def book(**limits: object) -> Book:
    return Book.new("acme", TenantLimits(**limits), now=NOW)  # type: ignore[arg-type]


def hold(run: str, turn: int = 0, owner: str = "w1", tokens: int = 0) -> Hold:
    return Hold(run, turn, tokens, Decimal(0), NOW + 60, owner, "ns", run)


def fixed(tokens: int, pricing: kernel.Pricing = FREE) -> CallNeed:
    """A call of ``tokens`` (100 prompt, the rest output) that does not shrink."""
    return CallNeed(100, tokens - 100, pricing, min_output_tokens=tokens - 100)


def ask(b: Book, run: str, need: CallNeed, *, owner: str = "w1", turn: int = 0) -> object:
    return b.reserve_call(f"{run}:{turn}", need, hold(run, turn, owner), now=NOW)


# --- entries --------------------------------------------------------------------------------


def test_a_need_that_exactly_reaches_the_limit_fits_and_the_message_says_what_it_needs() -> None:
    assert short_of("tokens", used=60, reserved=30, need=10, limit=100) is None
    over = short_of("tokens", used=60, reserved=30, need=11, limit=100)
    assert over is not None and (over.reason, over.resource) == (BUDGET_EXHAUSTED, "tokens")
    assert over.message == (
        "tokens: 60 used and 30 reserved of 100 this window; a first call needs up to 11"
    )
    full = short_of("tokens", used=70, reserved=30, need=0, limit=100)
    assert full is not None
    assert full.message == "tokens: 70 used and 30 reserved of 100 this window"
    assert short_of("tokens", used=70, reserved=29, need=0, limit=100) is None


def test_a_one_second_window_is_a_window() -> None:
    assert window_start(10.5, 1) == 10.0
    with pytest.raises(ValueError):
        window_start(10.5, 0)


# --- book -----------------------------------------------------------------------------------


def test_exhausted_weighs_the_need_it_is_given() -> None:
    b = book(tokens=1_000, cost_usd=Decimal("1"))
    b.used_tokens, b.used_cost = 900, Decimal("0.9")
    assert b.exhausted(NOW) is None
    tokens = b.exhausted(NOW, need_tokens=101)
    assert tokens is not None and tokens.resource == "tokens"
    cost = b.exhausted(NOW, need_cost=Decimal("0.11"))
    assert cost is not None and cost.resource == "costUSD"


def test_the_wall_clock_refusal_says_how_much_was_used() -> None:
    b = book(wall_seconds=100.0)
    b.used_wall = 100.0
    refusal = b.exhausted(NOW)
    assert refusal is not None and refusal.resource == "wallClockSeconds"
    assert refusal.message == "wallClockSeconds: 100 of 100 used this window"


def test_a_new_window_forgets_what_was_abandoned_and_the_calls_charged_until_now() -> None:
    b = book(tokens=1_000, window_seconds=3_600)
    b.abandoned_tokens, b.abandoned_cost = 5, Decimal("0.5")
    b.load_memo("r1:0/a", NOW + 3_600.0)
    b.load_memo("r1:1/a", NOW + 3_601.0)
    assert b.roll(NOW + 3_600.0)
    assert (b.abandoned_tokens, b.abandoned_cost) == (0, Decimal(0))
    assert b.charged == {"r1:1/a": NOW + 3_601.0}  # remembered until, not through, its time


def test_admission_holds_the_first_call_as_its_own_hold_until_a_worker_reserves_it() -> None:
    b = book(tokens=10_000)
    assert b.admit("r1", "team", "first", now=NOW, need_tokens=500, need_cost=Decimal(0)) is None
    assert b.holds == {
        "r1:admission": Hold(
            "r1", -1, 500, Decimal(0), NOW + ADMISSION_HOLD_TTL, "admission", "team", "first"
        )
    }


def test_a_delivery_whose_hold_was_set_aside_can_still_refresh_it() -> None:
    """Once something of its call is recorded there (set aside with nothing recorded, its
    refresh finds it gone: ``test_dead_holds``)."""
    b = book()
    b.put_hold("r1:0", hold("r1", owner="next"))
    aside = dataclasses.replace(hold("r1", owner="dead"), spent_tokens=5, recorded=True)
    b.put_hold("r1:0/dead", aside)
    assert b.refresh("r1:0", owner="dead", expires=NOW + 600)
    assert (b.holds["r1:0/dead"].expires, b.holds["r1:0"].expires) == (NOW + 600, NOW + 60)
    assert not b.refresh("r1:0", owner="gone", expires=NOW + 600)


def test_a_turn_is_charged_once_whatever_a_second_settlement_of_it_reports() -> None:
    b = book()
    assert b.admit("r1", "ns", "r1", now=NOW) is None
    assert b.settle("r1", turn=0, tokens=100, cost_usd=Decimal("0.01"), now=NOW) == (
        100,
        Decimal("0.01"),
    )
    assert b.settle("r1", turn=0, tokens=150, cost_usd=Decimal("0.02"), now=NOW) == (0, Decimal(0))
    assert b.used_tokens == 100


def test_set_aside_says_whether_it_moved_a_hold() -> None:
    b = book()
    b.put_hold("r1:0", hold("r1", owner="a"))
    assert not b.reserve("r1:0", hold("r1", owner="b"), now=NOW)  # unanswered: replaced
    answered = hold("r1", owner="b")
    answered.spent_tokens, answered.recorded = 10, True
    b.put_hold("r1:0", answered)
    assert deliveries.set_aside(b, "r1:0", owner="c")
    assert not deliveries.set_aside(b, "r1:0", owner="c")  # nothing of another's left
    assert list(b.holds) == ["r1:0/b"]


# --- reserve ----------------------------------------------------------------------------------


def test_a_hold_over_the_cost_limit_is_refused_naming_the_tenant() -> None:
    b = book(cost_usd=Decimal("1"))
    refused = b.reserve("r1:0", Hold("r1", 0, 0, Decimal("1.5"), NOW + 60, "w1"), now=NOW)
    assert refused is not None and refused.resource == "costUSD"
    assert refused.message == (
        "tenant 'acme' costUSD: 0 used + 0 reserved + 1.5 for this call exceeds 1"
    )


def test_out_of_wall_clock_time_with_a_run_active_a_call_is_refused_saying_so() -> None:
    b = book(wall_seconds=100.0)
    assert b.admit("r1", "ns", "r1", now=NOW - 100) is None  # active for 100 s
    refused = b.reserve("r1:0", hold("r1"), now=NOW)
    assert refused is not None and refused.resource == "wallClockSeconds"
    assert refused.message == "tenant 'acme' wallClockSeconds: 100 of 100 used"
    answer = ask(b, "r1", fixed(1_000))
    assert isinstance(answer, type(refused)) and answer.resource == "wallClockSeconds"
    assert answer.message == "tenant 'acme' wallClockSeconds: 100 of 100 used"
    assert b.holds == {} and b.waiting == {}
    admission = b.admit("r2", "ns", "r2", now=NOW, need_tokens=10)
    assert admission is not None and admission.resource == "wallClockSeconds"
    assert admission.message == "tenant 'acme' wallClockSeconds: 100 of 100 used"


def test_a_stale_call_that_waited_leaves_the_queue_of_waiters() -> None:
    b = book(tokens=10_000)
    assert b.admit("r1", "ns", "r1", now=NOW) is None
    b.put_waiter("r1:0", Waiter(NOW - 1, 100, Decimal(0), NOW + WAITER_TTL))
    b.settle("r1", turn=0, tokens=10, cost_usd=Decimal(0), now=NOW)
    assert getattr(ask(b, "r1", fixed(1_000)), "reason", None) == TURN_COMMITTED
    assert b.waiting == {}
    b.put_waiter("r1:0", Waiter(NOW - 1, 100, Decimal(0), NOW + WAITER_TTL))
    assert getattr(b.reserve("r1:0", hold("r1"), now=NOW), "reason", None) == TURN_COMMITTED
    assert b.waiting == {}


def test_a_delivery_asking_again_is_not_its_own_rival_and_keeps_its_hold_while_it_waits() -> None:
    b = book(tokens=6_000)
    first = ask(b, "r1", fixed(5_000))
    assert isinstance(first, Granted) and first.tokens == 5_000
    assert b.record_spend("r1:0", owner="w1", tokens=10, cost_usd=Decimal(0))
    again = ask(b, "r1", fixed(5_000))  # its own 5 000 held are not in its way
    assert isinstance(again, Granted)
    assert list(b.holds) == ["r1:0"]  # and its own answered hold was not set aside
    assert b.record_spend("r1:0", owner="w1", tokens=10, cost_usd=Decimal(0))
    assert b.reserve("r1:0", hold("r1", owner="w1", tokens=5_000), now=NOW) is None
    assert list(b.holds) == ["r1:0"]
    b.put_hold("r2:0", hold("r2", owner="w2", tokens=1_000))
    bigger = ask(b, "r1", fixed(5_500))  # fits used, not next to r2's hold: waits
    assert isinstance(bigger, BudgetWait)
    assert b.holds["r1:0"].tokens == 5_000 and b.holds["r1:0"].owner == "w1"


def test_a_delivery_asking_again_before_its_call_answered_is_not_its_own_rival() -> None:
    b = book(tokens=6_000)
    assert isinstance(ask(b, "r1", fixed(5_000)), Granted)
    again = ask(b, "r1", fixed(5_000))  # 5 000 held by itself + 5 000 > 6 000, were it a rival
    assert isinstance(again, Granted) and again.tokens == 5_000 and not again.contested
    assert (b.reserved_tokens, b.holds["r1:0"].tokens, b.waiting) == (5_000, 5_000, {})


def test_a_takeover_that_must_wait_drops_the_unanswered_hold_it_took_over() -> None:
    b = book(tokens=6_000)
    b.put_hold("r1:0", hold("r1", owner="dead", tokens=3_000))
    b.put_hold("r2:0", hold("r2", owner="w2", tokens=2_000))
    answer = ask(b, "r1", fixed(5_000), owner="next")
    assert isinstance(answer, BudgetWait)
    assert list(b.holds) == ["r2:0"] and list(b.waiting) == ["r1:0"]


def test_a_floor_that_exactly_reaches_the_limit_is_granted_not_refused() -> None:
    b = book(tokens=1_000)
    b.used_tokens = 900
    exact = ask(b, "r1", CallNeed(50, 500, FREE, min_output_tokens=50))
    assert isinstance(exact, Granted) and exact.output_tokens == 50
    refused = ask(b, "r2", CallNeed(50, 500, FREE, min_output_tokens=51))
    assert getattr(refused, "resource", None) == "tokens"
    assert refused.message == (  # type: ignore[attr-defined]
        "tenant 'acme' tokens: 900 used + 101 for this call exceeds 1000: 100 left this "
        "window, less than a call holds its worst case (its prompt's bound plus at least 51 "
        "output tokens)"
    )


@pytest.mark.parametrize(
    ("tokens", "cost", "said"),
    [(1_001, None, "1000: 0 left this window"), (None, "1", "1: 0 USD left this window")],
    ids=["tokens", "cost"],
)
def test_a_window_used_past_its_limit_says_nothing_is_left(
    tokens: int | None, cost: str | None, said: str
) -> None:
    """Use past the limit (an overrun, or a limit lowered): ``0 left``, never a negative."""
    b = book(tokens=1_000 if tokens else None, cost_usd=Decimal(cost) if cost else None)
    b.used_tokens, b.used_cost = 1_001, Decimal("1.5")
    priced = kernel.Pricing(input_per_million=Decimal("1"), output_per_million=Decimal("2"))
    refused = ask(b, "r1", CallNeed(10, 20, priced, min_output_tokens=1))
    assert said in refused.message  # type: ignore[union-attr]


def test_a_call_over_the_cost_left_is_refused_saying_what_it_holds_and_what_is_left() -> None:
    """The run's message says why it ended while its AgentTenant shows ``BudgetExhausted``
    False (``WithinBudget``: some is left, less than this call's smallest worst case)."""
    b = book(cost_usd=Decimal("1"))
    b.used_cost = Decimal("0.9995")
    priced = kernel.Pricing(input_per_million=Decimal("1"), output_per_million=Decimal("2"))
    refused = ask(b, "r1", CallNeed(400, 500, priced, min_output_tokens=100))
    assert getattr(refused, "resource", None) == "costUSD"
    assert refused.message == (  # type: ignore[attr-defined]
        "tenant 'acme' costUSD: 0.9995 used + 0.0006 for this call exceeds 1: 0.0005 USD "
        "left this window, less than a call holds its worst case (its prompt's bound plus at "
        "least 100 output tokens)"
    )


def test_a_waiter_that_can_no_longer_fit_is_refused_and_leaves_the_queue() -> None:
    b = book(tokens=10_000)
    b.put_hold("r2:0", hold("r2", owner="w2", tokens=6_000))
    assert isinstance(ask(b, "r1", fixed(5_000)), BudgetWait)
    b.used_tokens = 6_000  # r2's call settled, bigger than held
    assert getattr(ask(b, "r1", fixed(5_000)), "reason", None) == BUDGET_EXHAUSTED
    assert b.waiting == {}


def test_an_older_waiter_s_need_is_kept_free_next_to_the_holds() -> None:
    b = book(tokens=10_000)
    b.put_hold("r3:0", hold("r3", owner="w3", tokens=3_000))
    b.put_waiter("r2:0", Waiter(NOW - 5, 2_000, Decimal(0), NOW + WAITER_TTL))
    answer = ask(b, "r1", fixed(5_500))  # 3 000 held + 2 000 waited for + 5 500 > 10 000
    assert isinstance(answer, BudgetWait)
    assert isinstance(ask(b, "r4", fixed(5_000)), Granted)  # exactly 10 000


def test_the_oldest_waiter_is_not_held_back_by_itself() -> None:
    b = book(tokens=10_000)
    b.put_hold("r3:0", hold("r3", owner="w3", tokens=6_000))
    b.put_waiter("r1:0", Waiter(NOW - 5, 4_000, Decimal(0), NOW + WAITER_TTL))
    b.put_waiter("r2:0", Waiter(NOW - 5, 4_000, Decimal(0), NOW + WAITER_TTL))
    assert isinstance(ask(b, "r1", fixed(4_000)), Granted)  # first of two waiting as long


def test_a_waiter_expires_at_its_time_and_is_refreshed_below_half_its_ttl() -> None:
    b = book(tokens=10_000)
    b.put_hold("r3:0", hold("r3", owner="w3", tokens=8_000))
    b.put_waiter("r2:0", Waiter(NOW - 5, 9_000, Decimal(0), NOW))  # expires now: gone
    b.put_waiter("r1:0", Waiter(NOW - 1, 5_000, Decimal(0), NOW + WAITER_TTL / 2))
    assert isinstance(ask(b, "r1", fixed(5_000)), BudgetWait)
    assert list(b.waiting) == ["r1:0"]
    assert b.waiting["r1:0"].expires == NOW + WAITER_TTL / 2  # half left: not yet refreshed
    b.waiting["r1:0"].expires = NOW + WAITER_TTL * 0.4
    assert isinstance(ask(b, "r1", fixed(5_000)), BudgetWait)
    # refreshed, it keeps its place in the queue and what it needs
    assert b.waiting["r1:0"] == Waiter(NOW - 1, 5_000, Decimal(0), NOW + WAITER_TTL)


def test_output_priced_below_a_dollar_or_free_is_capped_only_by_what_it_costs() -> None:
    cheap = book(cost_usd=Decimal("0.0005"))
    granted = ask(
        cheap,
        "r1",
        CallNeed(
            0, 4_096, kernel.Pricing(Decimal(0), Decimal(0), Decimal("0.5")), min_output_tokens=16
        ),
    )
    assert isinstance(granted, Granted) and granted.output_tokens == 1_000
    free = book(cost_usd=Decimal("0.0005"))
    granted = ask(free, "r1", CallNeed(0, 4_096, FREE, min_output_tokens=16))
    assert isinstance(granted, Granted) and granted.output_tokens == 4_096


def test_the_output_allowance_counts_every_token_held_by_others() -> None:
    b = book(tokens=10_000, cost_usd=Decimal("1"))
    b.put_hold("r2:0", Hold("r2", 0, 3_000, Decimal("0.5"), NOW + 60, "w2"))
    granted = ask(b, "r1", CallNeed(1_000, 10_000, FREE, min_output_tokens=16))
    assert isinstance(granted, Granted) and granted.output_tokens == 6_000


def test_a_call_whose_prompt_alone_uses_the_last_dollar_is_granted_with_its_floor_of_zero() -> None:
    b = book(cost_usd=Decimal("0.001"))
    need = CallNeed(100, 0, kernel.Pricing(Decimal("10"), Decimal("0"), Decimal("10")))
    granted = ask(b, "r1", need)
    assert isinstance(granted, Granted) and (granted.output_tokens, granted.cost_usd) == (
        0,
        Decimal("0.001"),
    )


# --- admission --------------------------------------------------------------------------------


def test_admission_refused_for_cost_names_it_and_held_admission_says_what_is_held() -> None:
    b = book(cost_usd=Decimal("1"))
    b.used_cost = Decimal("0.9")
    over = b.admit("r1", "ns", "r1", now=NOW, need_cost=Decimal("0.2"))
    assert over is not None and (over.reason, over.resource) == (BUDGET_EXHAUSTED, "costUSD")
    b.put_hold("r2:0", Hold("r2", 0, 0, Decimal("0.05"), NOW + 60, "w2"))
    b.put_waiter("r3:0", Waiter(NOW - 1, 0, Decimal("0.03"), NOW + WAITER_TTL))
    exact = b.admit("r4", "ns", "r4", now=NOW, need_cost=Decimal("0.02"))
    assert exact is None  # 0.9 + 0.05 + 0.03 + 0.02 = 1: fits
    held = b.admit("r5", "ns", "r5", now=NOW, need_cost=Decimal("0.01"))
    assert held is not None and (held.reason, held.resource) == (BUDGET_HELD, "costUSD")
    assert held.message == (
        "costUSD: 0 tokens / 0.9 USD used and 0 / 0.10 held by calls in flight or waiting; "
        "a first call needs up to 0 / 0.01"
    )


def test_admission_keeps_room_for_the_oldest_waiter_s_tokens() -> None:
    b = book(tokens=10_000)
    b.put_hold("r2:0", hold("r2", owner="w2", tokens=3_000))
    b.put_waiter("r3:0", Waiter(NOW - 1, 2_000, Decimal(0), NOW + WAITER_TTL))
    held = b.admit("r1", "ns", "r1", now=NOW, need_tokens=5_001)
    assert held is not None and (held.reason, held.resource) == (BUDGET_HELD, "tokens")
    assert b.admit("r1", "ns", "r1", now=NOW, need_tokens=5_000) is None


def test_a_call_refused_for_wall_clock_time_leaves_the_queue_and_keeps_what_it_held() -> None:
    b = book(tokens=10_000, wall_seconds=100.0)
    assert b.admit("r1", "ns", "r1", now=NOW - 50) is None
    b.put_hold("r1:0", hold("r1", owner="w1", tokens=2_000))
    b.put_waiter("r1:0", Waiter(NOW + 49, 4_000, Decimal(0), NOW + 50 + WAITER_TTL))
    refused = b.reserve_call("r1:0", fixed(4_000), hold("r1", owner="w1"), now=NOW + 50)
    assert getattr(refused, "resource", None) == "wallClockSeconds"
    assert b.waiting == {}
    assert b.holds["r1:0"].tokens == 2_000 and b.holds["r1:0"].owner == "w1"


def test_a_refusal_names_the_resource_its_floor_overruns() -> None:
    """Tokens exactly at their limit fit: the refusal names the cost that does not."""
    b = book(tokens=1_000, cost_usd=Decimal("0.001"))
    b.used_tokens = 900
    need = CallNeed(50, 50, PRICED, min_output_tokens=50)  # 100 tokens, 0.0005 USD
    b.used_cost = Decimal("0.0006")
    refused = ask(b, "r1", need)
    assert getattr(refused, "resource", None) == "costUSD"


# --- a call charged as abandoned --------------------------------------------------------------


def spent(b: Book) -> tuple[int, Decimal, int, Decimal]:
    """What the tenant was charged: used tokens and USD, then the abandoned part of each."""
    return b.used_tokens, b.used_cost, b.abandoned_tokens, b.abandoned_cost


REST = {
    "tokens and cost": ((100, "0.001"), (3_400, "0.034"), (3_300, "0.033")),
    "tokens only (a free model)": ((100, "0"), (3_400, "0"), (3_300, "0")),
    "cost only": ((100, "0.001"), (100, "0.004"), (0, "0.003")),
}
"""What a slow worker's call had recorded when the sweep charged it, what it used in all, and
the rest its delivery's abandon charges: (tokens, USD) each."""


@pytest.mark.parametrize(("recorded", "used", "rest"), REST.values(), ids=REST.keys())
def test_a_call_the_sweep_charged_at_its_progress_is_charged_the_rest_when_its_delivery_leaves(
    recorded: tuple[int, str], used: tuple[int, str], rest: tuple[int, str]
) -> None:
    """A slow worker's hold expired while its response streamed: the sweep charged its call as
    abandoned at what it had recorded. Its delivery, giving the turn up, abandons the call with
    all it used: only the rest is charged — to used and abandoned, added to what the window had
    — and the charge remembered is the whole call's. Leaving again charges nothing more."""
    b = book(tokens=100_000)
    assert b.admit("r1", "ns", "r1", now=NOW) is None
    b.used_tokens, b.used_cost = 500, Decimal("0.005")
    b.abandoned_tokens, b.abandoned_cost = 50, Decimal("0.0005")
    assert isinstance(ask(b, "r1", fixed(5_000)), Granted)
    tokens, cost = recorded
    assert b.record_spend("r1:0", owner="w1", tokens=tokens, cost_usd=Decimal(cost), answered=False)
    assert b.drop_hold("r1:0", committed_turn=-1)  # the sweep: its hold expired
    swept = (500 + tokens, Decimal("0.005") + Decimal(cost), 50 + tokens)
    assert spent(b)[:3] == swept
    assert b.abandon("r1:0", owner="w1", tokens=used[0], cost_usd=Decimal(used[1]), now=NOW + 61)
    more_tokens, more_cost = rest[0], Decimal(rest[1])
    assert spent(b) == (
        swept[0] + more_tokens,
        swept[1] + more_cost,
        swept[2] + more_tokens,
        Decimal("0.0005") + Decimal(cost) + more_cost,
    )
    assert b.runs["r1"].spent["r1:0/w1"] == (used[0], Decimal(used[1]))
    after = spent(b)
    for again in (used, recorded):
        assert not b.abandon(
            "r1:0", owner="w1", tokens=again[0], cost_usd=Decimal(again[1]), now=NOW + 62
        )
    assert spent(b) == after
    assert b.runs["r1"].spent["r1:0/w1"] == (used[0], Decimal(used[1]))


def test_a_call_whose_charge_was_taken_back_is_charged_nothing_when_its_delivery_leaves() -> None:
    """The sweep charged a slow worker's call, whose commit then landed though its worker never
    heard it: the next turn's reservation resolves the turn by it, taking the charge back (the
    call is the run's). The delivery, leaving its turn as uncommitted, charges nothing."""
    b = book(tokens=100_000)
    assert b.admit("r1", "ns", "r1", now=NOW) is None
    assert isinstance(ask(b, "r1", fixed(5_000)), Granted)
    assert b.record_spend("r1:0", owner="w1", tokens=100, cost_usd=Decimal("0.001"))
    assert b.drop_hold("r1:0", committed_turn=-1)
    b.resolve_turn("r1", 0, committer="w1")
    b.catch_up("r1", turn=0, tokens=100, cost_usd=Decimal("0.001"), now=NOW + 61)
    assert spent(b) == (100, Decimal("0.001"), 0, Decimal(0))
    assert b.remembers_charged("r1:0/w1")
    assert not b.abandon("r1:0", owner="w1", tokens=3_400, cost_usd=Decimal("0.034"), now=NOW + 62)
    assert spent(b) == (100, Decimal("0.001"), 0, Decimal(0))
    assert "r1:0/w1" not in b.runs["r1"].spent


def test_a_delivery_whose_hold_was_set_aside_records_its_progress_there_and_pays_its_call() -> None:
    """The turn was redelivered while the first delivery's response streamed: the second sets
    its answered hold aside (the reservation is contested), the first records its progress on
    the hold set aside, the second commits (the first's call charged at what it had recorded
    then), and the first, its commit lost, leaves charging the rest of its call."""
    b = book(tokens=100_000)
    assert b.admit("r1", "ns", "r1", now=NOW) is None
    assert isinstance(ask(b, "r1", fixed(5_000), owner="w1"), Granted)
    assert b.record_spend("r1:0", owner="w1", tokens=100, cost_usd=Decimal(0), answered=False)
    second = ask(b, "r1", fixed(5_000), owner="w2")
    assert isinstance(second, Granted) and second.contested
    assert not getattr(ask(b, "r1", fixed(5_000), owner="w2"), "contested", True)  # again: none
    assert b.holds["r1:0/w1"].tokens == 100 and b.reserved_tokens == 5_100
    assert b.record_spend("r1:0", owner="w1", tokens=300, cost_usd=Decimal(0), answered=False)
    aside = b.holds["r1:0/w1"]
    assert (aside.tokens, aside.spent_tokens, aside.owner) == (300, 300, "w1")
    assert (b.reserved_tokens, b.holds["r1:0"].spent_tokens) == (5_300, 0)
    assert b.record_spend("r1:0", owner="w2", tokens=200, cost_usd=Decimal(0))
    assert b.resolve_turn("r1", 0, committer="w2") == 1
    b.settle("r1", turn=0, tokens=200, cost_usd=Decimal(0), now=NOW + 1)
    assert (b.used_tokens, b.abandoned_tokens, b.reserved_tokens) == (500, 300, 0)
    assert b.abandon("r1:0", owner="w1", tokens=3_000, cost_usd=Decimal(0), now=NOW + 2)
    assert (b.used_tokens, b.abandoned_tokens) == (3_200, 3_000)


def test_an_abandoned_call_is_remembered_as_charged_past_its_hold_s_expiry() -> None:
    """Remembered ``CHARGED_MEMORY`` past the later of when it was charged and its hold's
    expiry (past when it was charged if it had no hold): so its delivery leaving again while
    its hold could still be alive charges it once; a later charge never shortens that."""
    b = book(tokens=100_000)
    b.put_hold("r1:0", Hold("r1", 0, 1_000, Decimal(0), NOW + 600, "w1"))
    assert b.abandon("r1:0", owner="w1", tokens=100, cost_usd=Decimal(0), now=NOW)
    assert b.charged == {"r1:0/w1": NOW + 600 + CHARGED_MEMORY}
    late = NOW + CHARGED_MEMORY + 300
    assert not b.abandon(
        "r1:0", owner="w1", tokens=100, cost_usd=Decimal(0), now=late, unrecorded=True
    )
    assert (b.used_tokens, b.abandoned_tokens) == (100, 100)
    assert b.abandon("r2:0", owner="w1", tokens=10, cost_usd=Decimal(0), now=NOW, unrecorded=True)
    assert b.charged["r2:0/w1"] == NOW + CHARGED_MEMORY
    retried = Hold("r1", 0, 1_000, Decimal(0), NOW + 60, "w1")  # its worker called again
    retried.spent_tokens, retried.recorded = 20, True
    b.put_hold("r1:0", retried)
    assert b.drop_hold("r1:0", committed_turn=-1)  # and that call's hold was swept
    assert b.charged["r1:0/w1"] == NOW + 600 + CHARGED_MEMORY
    assert (b.used_tokens, b.abandoned_tokens) == (130, 130)
