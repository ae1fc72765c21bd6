"""A call that does not fit only because of other runs' in-flight holds waits (oldest first)
instead of ending its run; a run ends ``tenant_budget_exhausted`` only when what is committed
plus its own smallest worst case exceeds the limit; the last calls of a window shrink their
output allowance to what is left; the usage of an answered call is recorded on its hold and
charged once, whoever drops the hold. Every branch of ``Book.reserve_call``, ``record_spend``,
``drop_hold`` and the admission check, pure (``now`` passed in)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from agentrun import kernel
from agentrun.ledger import Book, BudgetRefusal, BudgetWait, CallNeed, Granted, Hold, codec
from agentrun.ledger.entries import (
    BUDGET_EXHAUSTED,
    BUDGET_HELD,
    TURN_COMMITTED,
    WAITER_TTL,
    TenantLimits,
)

NOW = 19_675 * 86_400.0 + 3_600.0
PRICING = kernel.Pricing(Decimal("2.50"), Decimal("1.25"), Decimal("10"))
"""The demo's mock pricing: USD per 1M input / cached input / output tokens."""


def book(**limits: object) -> Book:
    return Book.new("acme", TenantLimits(**limits), now=NOW)  # type: ignore[arg-type]


def need(prompt: int = 1_000, output: int = 4_096, floor: int = 256) -> CallNeed:
    return CallNeed(prompt, output, PRICING, min_output_tokens=floor)


FIXED = CallNeed(1_000, 4_096, PRICING, min_output_tokens=4_096)
"""A call that does not shrink: its worst case is 5 096 tokens, 0.04346 USD."""


def template(run: str, turn: int = 0, owner: str = "w1") -> Hold:
    return Hold(run, turn, 0, Decimal(0), NOW + 60, owner, "ns", run)


def ask(b: Book, run: str, n: CallNeed, *, turn: int = 0, owner: str = "w1", now: float = NOW):
    return b.reserve_call(f"{run}:{turn}", n, template(run, turn, owner), now=now)


# --------------------------------------------------------------------------- held, shrunk


def test_a_call_that_fits_is_held_with_its_whole_allowance() -> None:
    b = book(cost_usd=Decimal("1"))
    granted = ask(b, "r1", need())
    assert granted == Granted(4_096, 5_096, Decimal("0.04346"))
    assert b.holds["r1:0"].tokens == 5_096 and b.holds["r1:0"].cost_usd == Decimal("0.04346")
    assert b.waiting == {}


def test_a_held_call_is_a_copy_of_its_template_with_the_amounts_set() -> None:
    b = book(cost_usd=Decimal("1"))
    asked = template("r1", turn=3, owner="w7")
    assert ask(b, "r1", need(), turn=3, owner="w7") == Granted(4_096, 5_096, Decimal("0.04346"))
    b.reserve_call("r1:3", need(), asked, now=NOW)  # asked again with this very template
    held = b.holds["r1:3"]
    assert held is not asked and (asked.tokens, asked.cost_usd) == (0, Decimal(0))
    assert held == Hold(  # with the call's prompt bound and its price: what a drop charges
        "r1", 3, 5_096, Decimal("0.04346"), NOW + 60, "w7", "ns", "r1", 0, Decimal(0),
        1_000, Decimal("0.0025"),
    )  # fmt: skip
    spent = Hold("r1", 3, 9, Decimal(9), NOW + 5, "w7", "ns", "r1", 120, Decimal("0.001"), 80)
    assert spent.holding(7, Decimal(1)) == Hold(
        "r1", 3, 7, Decimal(1), NOW + 5, "w7", "ns", "r1", 120, Decimal("0.001"), 80
    )
    assert spent.holding(7, Decimal(1), prompt=(5, Decimal(2))) == Hold(
        "r1", 3, 7, Decimal(1), NOW + 5, "w7", "ns", "r1", 120, Decimal("0.001"), 5, Decimal(2)
    )


def test_the_last_call_of_a_window_shrinks_its_allowance_to_what_is_left() -> None:
    b = book(cost_usd=Decimal("0.25"))
    b.used_cost = Decimal("0.24")  # 0.01 left: the prompt costs 0.0025, 750 output tokens fit
    granted = ask(b, "r1", need())
    assert isinstance(granted, Granted) and granted.output_tokens == 750
    assert b.used_cost + b.reserved_cost == Decimal("0.25")  # exactly to the limit, not over


def test_a_token_limit_shrinks_the_allowance_too() -> None:
    b = book(tokens=2_000)
    granted = ask(b, "r1", need(prompt=1_000))
    assert isinstance(granted, Granted) and granted.output_tokens == 1_000
    assert b.used_tokens + b.reserved_tokens == 2_000


def test_no_shrinking_when_the_call_sets_no_floor() -> None:
    b = book(tokens=2_000)
    assert isinstance(ask(b, "r1", need(prompt=1_000, floor=0)), BudgetRefusal)


# --------------------------------------------------------------------------- refused


@pytest.mark.parametrize(
    ("limits", "resource"),
    [({"tokens": 1_200}, "tokens"), ({"cost_usd": Decimal("0.005")}, "costUSD")],
    ids=["tokens", "cost"],
)
def test_a_call_whose_smallest_worst_case_exceeds_what_is_left_of_the_committed_use_is_refused(
    limits: dict[str, object], resource: str
) -> None:
    b = book(**limits)
    refusal = ask(b, "r1", need(prompt=1_000, floor=256))
    assert isinstance(refusal, BudgetRefusal)
    assert (refusal.reason, refusal.resource) == (BUDGET_EXHAUSTED, resource)
    assert "used +" in refusal.message and b.holds == {} and b.waiting == {}


def test_a_wall_clock_budget_used_up_refuses_instead_of_waiting() -> None:
    b = book(wall_seconds=10.0)
    b.used_wall = 10.0
    ask_other = ask(b, "r0", need(), owner="w0")  # room for tokens and cost: no limits on them
    assert isinstance(ask_other, BudgetRefusal) and ask_other.resource == "wallClockSeconds"


def test_a_refused_call_gives_back_its_owners_earlier_hold_unchanged() -> None:
    b = book(tokens=10_000)
    assert isinstance(ask(b, "r1", need(prompt=1_000, output=1_000)), Granted)
    b.used_tokens = 9_000
    assert isinstance(ask(b, "r1", need(prompt=1_000, output=1_000)), BudgetRefusal)
    assert b.holds["r1:0"].tokens == 2_000


# --------------------------------------------------------------------------- waiting


def test_a_call_that_fits_only_without_other_runs_holds_waits_and_is_held_once_they_settle() -> (
    None
):
    b = book(cost_usd=Decimal("0.09"))
    assert isinstance(ask(b, "r1", FIXED), Granted)  # 0.04346
    assert isinstance(ask(b, "r2", FIXED), Granted)  # 0.08692
    waited = ask(b, "r3", FIXED)  # 0.00308 left next to the holds; 0.09 of committed use
    assert isinstance(waited, BudgetWait)
    assert "held by calls in flight" in waited.message
    assert set(b.waiting) == {"r3:0"}
    b.settle("r1", turn=0, tokens=100, cost_usd=Decimal("0.001"), now=NOW, key="r1:0")
    granted = ask(b, "r3", FIXED, now=NOW + 1)
    assert isinstance(granted, Granted) and b.waiting == {}
    assert b.used_cost + b.reserved_cost <= Decimal("0.09")


def test_waiters_are_served_oldest_first_and_a_newcomer_does_not_take_their_room() -> None:
    b = book(cost_usd=Decimal("0.09"))
    ask(b, "r1", FIXED)
    ask(b, "r2", FIXED)
    assert isinstance(ask(b, "old", FIXED, now=NOW), BudgetWait)
    b.settle("r1", turn=0, tokens=0, cost_usd=Decimal(0), now=NOW, key="r1:0")
    # room for one call now: the older waiter's, which a newcomer must not take
    newcomer = ask(b, "new", FIXED, now=NOW + 1)
    assert isinstance(newcomer, BudgetWait)
    assert isinstance(ask(b, "old", FIXED, now=NOW + 2), Granted)
    assert set(b.waiting) == {"new:0"}


def test_a_newcomer_waits_behind_an_older_waiter_it_would_crowd_out_then_goes() -> None:
    b = book(cost_usd=Decimal("0.20"))
    for run in ("r1", "r2", "r3"):
        ask(b, run, FIXED)  # 0.13038 held
    big = CallNeed(40_000, 4_096, PRICING, min_output_tokens=4_096)  # 0.14096
    assert isinstance(ask(b, "big", big), BudgetWait)
    small = CallNeed(10, 100, PRICING, min_output_tokens=100)  # 0.001025
    assert isinstance(ask(b, "small", small), BudgetWait)  # 0.13038 + 0.14096 leave nothing
    for run in ("r1", "r2"):
        b.settle(run, turn=0, tokens=0, cost_usd=Decimal(0), now=NOW, key=f"{run}:0")
    # 0.04346 held + big's 0.14096 + small's 0.001025 ≤ 0.20: small no longer crowds big out
    assert isinstance(ask(b, "small", small, now=NOW + 1), Granted)
    assert isinstance(ask(b, "big", big, now=NOW + 2), Granted)


def test_a_waiter_whose_worker_died_stops_holding_the_others_back() -> None:
    b = book(cost_usd=Decimal("0.09"))
    ask(b, "r1", FIXED)
    ask(b, "r2", FIXED)
    assert isinstance(ask(b, "dead", FIXED), BudgetWait)
    b.settle("r1", turn=0, tokens=0, cost_usd=Decimal(0), now=NOW, key="r1:0")
    later = NOW + WAITER_TTL + 1
    assert isinstance(ask(b, "alive", FIXED, now=later), Granted)
    assert "dead:0" not in b.waiting


def test_a_waiter_that_asks_again_keeps_its_place_and_its_expiry_is_pushed_out() -> None:
    b = book(cost_usd=Decimal("0.05"))
    ask(b, "r1", FIXED)
    ask(b, "w", FIXED, now=NOW)
    first = b.waiting["w:0"]
    ask(b, "w", FIXED, now=NOW + WAITER_TTL * 0.75)
    assert b.waiting["w:0"].since == first.since == NOW
    assert b.waiting["w:0"].expires == NOW + WAITER_TTL * 1.75
    ask(b, "w", FIXED, now=NOW + WAITER_TTL * 0.8)  # not yet half expired: unchanged
    assert b.waiting["w:0"].expires == NOW + WAITER_TTL * 1.75


def test_a_given_up_waiter_leaves_and_a_closed_run_takes_its_waiter_with_it() -> None:
    b = book(cost_usd=Decimal("0.05"))
    b.admit("w", "ns", "w", now=NOW)
    ask(b, "r1", FIXED)
    ask(b, "w", FIXED)
    ask(b, "v", FIXED)
    assert b.stop_waiting("v:0") and not b.stop_waiting("v:0")
    b.close("w", turn=-1, tokens=0, cost_usd=Decimal(0), end=NOW, now=NOW)
    assert b.waiting == {}


# --------------------------------------------------------------------------- admission


def test_admission_waits_for_holds_and_fails_only_on_what_is_committed() -> None:
    b = book(cost_usd=Decimal("0.10"))
    first = Decimal("0.06")
    assert b.admit("a", "ns", "a", now=NOW, need_cost=first) is None
    held = b.admit("b", "ns", "b", now=NOW, need_cost=first)
    assert isinstance(held, BudgetRefusal) and held.reason == BUDGET_HELD
    b.used_cost = Decimal("0.05")
    spent = b.admit("c", "ns", "c", now=NOW, need_cost=first)
    assert isinstance(spent, BudgetRefusal) and spent.reason == BUDGET_EXHAUSTED


def test_admission_leaves_room_for_the_oldest_waiting_call_of_a_running_run() -> None:
    b = book(cost_usd=Decimal("0.09"))
    ask(b, "r1", FIXED)
    ask(b, "r2", FIXED)
    assert isinstance(ask(b, "r3", FIXED), BudgetWait)
    b.settle("r1", turn=0, tokens=0, cost_usd=Decimal(0), now=NOW, key="r1:0")
    refusal = b.admit("new", "ns", "new", now=NOW, need_cost=Decimal("0.04"))
    assert isinstance(refusal, BudgetRefusal) and refusal.reason == BUDGET_HELD


@pytest.mark.parametrize(
    ("limits", "resource"),
    [({"tokens": 100}, "tokens"), ({"wall_seconds": 1.0}, "wallClockSeconds")],
    ids=["tokens", "wall"],
)
def test_admission_fails_on_committed_tokens_and_used_up_wall_clock(
    limits: dict[str, object], resource: str
) -> None:
    b = book(**limits)
    b.used_wall = 5.0
    refusal = b.admit("a", "ns", "a", now=NOW, need_tokens=200, need_cost=Decimal("0.001"))
    assert isinstance(refusal, BudgetRefusal)
    assert (refusal.reason, refusal.resource) == (BUDGET_EXHAUSTED, resource)


def test_admission_held_on_tokens_names_tokens() -> None:
    b = book(tokens=1_000)
    b.put_hold("x:0", Hold("x", 0, 900, Decimal(0), NOW + 60, "w", "ns", "x"))
    refusal = b.admit("a", "ns", "a", now=NOW, need_tokens=200)
    assert isinstance(refusal, BudgetRefusal)
    assert (refusal.reason, refusal.resource) == (BUDGET_HELD, "tokens")


# --------------------------------------------------------------------------- durable spend


def test_an_answered_call_is_recorded_on_its_hold_for_its_owner_only() -> None:
    b = book()
    ask(b, "r1", need())
    assert not b.record_spend("r1:0", owner="other", tokens=5, cost_usd=Decimal(1))
    assert not b.record_spend("gone:0", owner="w1", tokens=5, cost_usd=Decimal(1))
    assert b.record_spend("r1:0", owner="w1", tokens=120, cost_usd=Decimal("0.0004"))
    assert b.holds["r1:0"].recorded and b.holds["r1:0"].spent_tokens == 120


def test_a_dead_workers_answered_call_is_charged_once_when_its_hold_is_dropped() -> None:
    b = book()
    ask(b, "r1", need(), turn=3)
    b.record_spend("r1:3", owner="w1", tokens=120, cost_usd=Decimal("0.0004"))
    assert b.drop_hold("r1:3", committed_turn=2)
    assert not b.drop_hold("r1:3", committed_turn=2)
    assert (b.used_tokens, b.abandoned_tokens, b.used_cost) == (120, 120, Decimal("0.0004"))


def test_a_committed_turns_answered_call_is_not_charged_again_when_its_hold_is_dropped() -> None:
    b = book()
    ask(b, "r1", need(), turn=3)
    b.record_spend("r1:3", owner="w1", tokens=120, cost_usd=Decimal("0.0004"))
    assert b.drop_hold("r1:3", committed_turn=3)  # its usage is in the run's own: settled
    assert (b.used_tokens, b.abandoned_tokens) == (0, 0)


REPLACING = {
    "the replaced delivery lost the commit": ("next", 50),
    "the replaced delivery had committed, then died before settling": ("dead", 0),
}


@pytest.mark.parametrize("via", ["reserve", "reserve_call"])
@pytest.mark.parametrize(("committer", "abandoned"), REPLACING.values(), ids=list(REPLACING.keys()))
def test_a_redelivery_replacing_an_answered_hold_sets_it_aside_until_the_turn_resolves(
    via: str, committer: str, abandoned: int
) -> None:
    """The replaced call is not charged when replaced (its delivery may be the one whose commit
    holds it); it waits aside, holding what it used, and is charged as abandoned only if the
    turn's event names another delivery as its committer."""
    b = book()
    ask(b, "r1", need(), owner="dead")
    b.record_spend("r1:0", owner="dead", tokens=50, cost_usd=Decimal("0.0002"))
    if via == "reserve":
        b.reserve("r1:0", template("r1", 0, "next"), now=NOW)
    else:
        ask(b, "r1", need(), owner="next")
    assert (b.used_tokens, b.abandoned_tokens) == (0, 0)
    assert b.holds["r1:0"].owner == "next" and not b.holds["r1:0"].recorded
    aside = b.holds["r1:0/dead"]
    assert (aside.owner, aside.tokens, aside.cost_usd) == ("dead", 50, Decimal("0.0002"))
    decoded = codec.decode_book(codec.encode_book(b)).holds["r1:0/dead"]
    assert (decoded.owner, decoded.spent_tokens, decoded.tokens) == ("dead", 50, 50)
    if committer == "dead":  # "next" reads that the run moved on, gives its hold back, no call
        assert b.release("r1:0", owner="next")
    assert b.resolve_turn("r1", 0, committer=committer) == (1 if abandoned else 0)
    assert (b.used_tokens, b.abandoned_tokens, b.holds) == (abandoned, abandoned, {})


def test_a_closed_run_charges_its_uncommitted_answered_hold() -> None:
    b = book()
    b.admit("r1", "ns", "r1", now=NOW)
    ask(b, "r1", need(), turn=1)
    b.record_spend("r1:1", owner="w1", tokens=70, cost_usd=Decimal("0.0003"))
    b.close("r1", turn=0, tokens=30, cost_usd=Decimal("0.0001"), end=NOW, now=NOW)
    assert (b.used_tokens, b.abandoned_tokens) == (100, 70)
    assert b.holds == {}


def test_the_entry_keeps_waiters_and_recorded_spends_through_encode_and_decode() -> None:
    b = book(cost_usd=Decimal("0.05"))
    ask(b, "r1", FIXED)
    assert isinstance(ask(b, "w", FIXED), BudgetWait)
    b.record_spend("r1:0", owner="w1", tokens=120, cost_usd=Decimal("0.0004"))
    again = codec.decode_book(codec.encode_book(b))
    assert again.holds["r1:0"].spent_tokens == 120
    assert again.holds["r1:0"].spent_cost == Decimal("0.0004")
    assert again.waiting == b.waiting
    assert codec.encode_book(again) == codec.encode_book(b)


@pytest.mark.parametrize("via", ["reserve", "reserve_call"])
def test_a_call_of_a_turn_the_book_settled_already_is_refused_as_stale(via: str) -> None:
    """Only a committed turn is settled, so a delivery asking for it built on the run from
    before that commit: its record cannot commit, and it makes no call."""
    b = book()
    b.admit("r1", "ns", "r1", now=NOW)
    b.settle("r1", turn=2, tokens=300, cost_usd=Decimal("0.001"), now=NOW)
    if via == "reserve":
        refusal = b.reserve("r1:2", template("r1", 2, "late"), now=NOW)
    else:
        refusal = ask(b, "r1", need(), turn=2, owner="late")
    assert isinstance(refusal, BudgetRefusal) and refusal.reason == TURN_COMMITTED
    assert "turn 2 of run r1 is committed already" in refusal.message
    assert (b.holds, b.waiting, b.used_tokens) == ({}, {}, 300)
    assert isinstance(ask(b, "r1", need(), turn=3), Granted)  # the next turn's call is held
