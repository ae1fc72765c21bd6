"""The pure tenant ledger entry (reserve before a model call, settle after): every branch of
``Book``.

Reservations are checked against ``used + reserved + hold ≤ limit`` for tokens and cost and
"wall-clock left" for time; settlement charges a run's cumulative usage once per newer turn;
close frees the slot and charges wall-clock seconds; the window rolls at fixed epoch-aligned
boundaries. A hypothesis property drives random interleavings through encode/decode (as the
store does) and checks that the limits are never overspent and that ``used`` is exact.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrun.ledger import (
    RESOURCES,
    Active,
    Book,
    BudgetRefusal,
    Hold,
    TenantLimits,
    codec,
    window_start,
)
from agentrun.ledger.entries import (
    BUDGET_EXHAUSTED,
    CONCURRENCY_LIMIT,
    TURN_COMMITTED,
    LedgerCorrupt,
)

DAY = 86_400.0
T0 = 19_675 * DAY
"""2023-11-14 00:00:00 UTC: the start of a 24h window."""
NOW = T0 + 3_600.0


def limits(**kwargs: object) -> TenantLimits:
    return TenantLimits(**kwargs)  # type: ignore[arg-type]


def book(**kwargs: object) -> Book:
    return Book.new("acme", limits(**kwargs), now=NOW)


def hold(
    run: str = "r1",
    turn: int = 0,
    tokens: int = 0,
    cost: str = "0",
    *,
    owner: str = "w1",
    expires: float = NOW + 60,
    namespace: str = "ns",
    name: str | None = None,
) -> Hold:
    return Hold(run, turn, tokens, Decimal(cost), expires, owner, namespace, name or f"name-{run}")


def reserve(b: Book, run: str, turn: int, tokens: int = 0, cost: str = "0", **kw: object):
    return b.reserve(f"{run}:{turn}", hold(run, turn, tokens, cost, **kw), now=NOW)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- window_start


def test_a_24h_window_starts_at_midnight_utc() -> None:
    now = dt.datetime(2024, 3, 5, 17, 42, 9, tzinfo=dt.UTC).timestamp()
    start = window_start(now, DAY)
    assert start == dt.datetime(2024, 3, 5, tzinfo=dt.UTC).timestamp()
    assert start <= now < start + DAY


def test_windows_are_aligned_to_the_epoch_not_to_now() -> None:
    assert window_start(T0, DAY) == T0
    assert window_start(T0 + DAY - 0.001, DAY) == T0
    assert window_start(T0 + DAY, DAY) == T0 + DAY
    assert window_start(7_262.5, 3_600) == 7_200
    # the epoch was a Thursday: a 168h window starts on Thursdays at 00:00 UTC
    week = window_start(dt.datetime(2024, 3, 5, 12, tzinfo=dt.UTC).timestamp(), 7 * DAY)
    started = dt.datetime.fromtimestamp(week, dt.UTC)
    assert (started.weekday(), started.hour, started.minute) == (3, 0, 0)


@pytest.mark.parametrize("window", [0, 0.0, -1.0])
def test_window_start_refuses_a_window_that_is_not_positive(window: float) -> None:
    with pytest.raises(ValueError, match="window must be positive"):
        window_start(NOW, window)


def test_a_new_book_is_empty_in_the_window_holding_now() -> None:
    b = book(tokens=10)
    assert (b.tenant, b.window, b.reset_time) == ("acme", T0, T0 + DAY)
    assert (b.used_tokens, b.used_cost, b.used_wall) == (0, Decimal(0), 0.0)
    assert (b.holds, b.active) == ({}, {})
    assert (b.reserved_tokens, b.reserved_cost) == (0, Decimal(0))
    assert b.exhausted(NOW) is None
    assert RESOURCES == ("tokens", "costUSD", "wallClockSeconds")


# --------------------------------------------------------------------------- reserve


def test_a_reservation_that_fits_is_held() -> None:
    b = book(tokens=1_000, cost_usd=Decimal("1.00"))
    assert reserve(b, "r1", 0, 300, "0.25") is None
    assert reserve(b, "r2", 0, 200, "0.50") is None
    assert set(b.holds) == {"r1:0", "r2:0"}
    assert b.reserved_tokens == 500
    assert b.reserved_cost == Decimal("0.75")


def test_without_limits_everything_fits() -> None:
    b = book()
    assert reserve(b, "r1", 0, 10**12, "1000000") is None
    assert b.exhausted(NOW) is None


def test_a_reservation_over_the_tokens_limit_is_refused_and_not_held() -> None:
    b = book(tokens=1_000, cost_usd=Decimal("100"))
    b.used_tokens = 600
    assert reserve(b, "r1", 0, 300) is None
    refusal = reserve(b, "r2", 0, 101, "0.01")
    assert isinstance(refusal, BudgetRefusal)
    assert (refusal.reason, refusal.resource) == (BUDGET_EXHAUSTED, "tokens")
    assert "acme" in refusal.message and "1000" in refusal.message
    assert "r2:0" not in b.holds
    assert b.reserved_tokens == 300


def test_the_last_call_exactly_reaching_the_token_limit_is_admitted_one_more_is_not() -> None:
    b = book(tokens=1_000)
    b.used_tokens = 900
    assert reserve(b, "r1", 0, 50) is None
    assert reserve(b, "r2", 0, 50) is None  # 900 + 50 + 50 == 1000
    assert b.used_tokens + b.reserved_tokens == 1_000
    refusal = reserve(b, "r3", 0, 1)
    assert refusal is not None and refusal.resource == "tokens"
    exhausted = b.exhausted(NOW)
    assert exhausted is not None
    assert (exhausted.reason, exhausted.resource) == (BUDGET_EXHAUSTED, "tokens")


def test_the_last_call_exactly_reaching_the_cost_limit_is_admitted_one_cent_more_is_not() -> None:
    b = book(cost_usd=Decimal("1.00"))
    b.used_cost = Decimal("0.70")
    assert reserve(b, "r1", 0, cost="0.30") is None  # exactly 1.00
    refusal = reserve(b, "r2", 0, cost="0.000001")
    assert refusal is not None
    assert (refusal.reason, refusal.resource) == (BUDGET_EXHAUSTED, "costUSD")


def test_case_c19_only_the_turns_that_fit_under_the_cost_cap_are_reserved() -> None:
    # tenant cap $5.00, $4.75 spent, four concurrent turns each priced about $0.09
    b = book(cost_usd=Decimal("5.00"))
    assert b.admit("run-a", "ns", "a", now=NOW) is None
    b.settle("run-a", turn=0, tokens=40_000, cost_usd=Decimal("4.75"), now=NOW)
    assert b.used_cost == Decimal("4.75")
    results = [reserve(b, f"run-{i}", 1, 3_000, "0.09") for i in range(4)]
    assert results[0] is None
    assert results[1] is None
    assert b.used_cost + b.reserved_cost == Decimal("4.93")
    for refusal in results[2:]:
        assert refusal is not None
        assert (refusal.reason, refusal.resource) == (BUDGET_EXHAUSTED, "costUSD")
        assert "5.00" in refusal.message
    assert set(b.holds) == {"run-0:1", "run-1:1"}


def test_case_c19_with_used_cost_set_directly() -> None:
    b = book(cost_usd=Decimal("5.00"))
    b.used_cost = Decimal("4.75")
    fits = [reserve(b, f"t{i}", 0, cost="0.09") is None for i in range(4)]
    assert fits == [True, True, False, False]
    assert b.used_cost + b.reserved_cost == Decimal("4.93")


def test_tokens_and_cost_limits_are_hit_separately() -> None:
    b = book(tokens=1_000, cost_usd=Decimal("1.00"))
    cheap_but_long = reserve(b, "r1", 0, 1_001, "0.01")
    assert cheap_but_long is not None and cheap_but_long.resource == "tokens"
    short_but_dear = reserve(b, "r2", 0, 10, "1.01")
    assert short_but_dear is not None and short_but_dear.resource == "costUSD"
    both = reserve(b, "r3", 0, 1_001, "1.01")
    assert both is not None and both.resource == "tokens"  # tokens are checked first
    assert b.holds == {}
    assert reserve(b, "r4", 0, 1_000, "1.00") is None


def test_a_reservation_is_refused_once_the_wall_clock_budget_is_used() -> None:
    b = book(wall_seconds=100.0)
    assert b.admit("r1", "ns", "n", now=NOW) is None
    assert b.reserve("r1:0", hold(), now=NOW + 99) is None
    refusal = b.reserve("r1:1", hold(turn=1), now=NOW + 100)
    assert refusal is not None
    assert (refusal.reason, refusal.resource) == (BUDGET_EXHAUSTED, "wallClockSeconds")
    assert "r1:1" not in b.holds


def test_replacing_a_hold_under_the_same_key_does_not_double_count() -> None:
    b = book(tokens=1_000, cost_usd=Decimal("1.00"))
    assert reserve(b, "r1", 3, 600, "0.60", owner="first") is None
    # the turn is redelivered to another worker, which reserves again under the same key
    assert reserve(b, "r1", 3, 700, "0.70", owner="second") is None
    assert list(b.holds) == ["r1:3"]
    assert b.holds["r1:3"].owner == "second"
    assert (b.reserved_tokens, b.reserved_cost) == (700, Decimal("0.70"))


@pytest.mark.parametrize(
    ("tokens", "cost", "resource"), [(1_001, "0.10", "tokens"), (10, "1.01", "costUSD")]
)
def test_a_refused_replacement_keeps_the_previous_hold(
    tokens: int, cost: str, resource: str
) -> None:
    b = book(tokens=1_000, cost_usd=Decimal("1.00"))
    assert reserve(b, "r1", 3, 600, "0.60", owner="first") is None
    previous = b.holds["r1:3"]
    refusal = reserve(b, "r1", 3, tokens, cost, owner="second")
    assert refusal is not None and refusal.resource == resource
    assert b.holds == {"r1:3": previous}
    assert b.holds["r1:3"].owner == "first"
    assert b.reserved_tokens == 600


def test_a_replacement_refused_for_wall_clock_keeps_the_previous_hold() -> None:
    b = book(wall_seconds=100.0)
    b.admit("r1", "ns", "n", now=NOW)
    assert b.reserve("r1:0", hold(owner="first"), now=NOW + 10) is None
    assert b.reserve("r1:0", hold(owner="second"), now=NOW + 200) is not None
    assert b.holds["r1:0"].owner == "first"


# --------------------------------------------------------------------------- release / refresh


def test_only_the_owner_releases_a_hold() -> None:
    b = book()
    reserve(b, "r1", 0, 10, owner="mine")
    assert b.release("r1:0", owner="theirs") is False
    assert "r1:0" in b.holds
    assert b.release("r1:0", owner="mine") is True
    assert b.holds == {}
    assert b.release("r1:0", owner="mine") is False


def test_release_without_owner_drops_any_hold_and_never_charges() -> None:
    b = book(tokens=100)
    reserve(b, "r1", 0, 100, owner="mine")
    assert b.release("r1:0") is True
    assert b.release("nope:0") is False
    assert (b.used_tokens, b.reserved_tokens) == (0, 0)


def test_only_the_owner_refreshes_a_hold_and_expiry_never_shortens() -> None:
    b = book()
    reserve(b, "r1", 0, 10, owner="mine", expires=NOW + 60)
    assert b.refresh("r1:0", owner="theirs", expires=NOW + 600) is False
    assert b.holds["r1:0"].expires == NOW + 60
    assert b.refresh("r1:0", owner="mine", expires=NOW + 120) is True
    assert b.holds["r1:0"].expires == NOW + 120
    assert b.refresh("r1:0", owner="mine", expires=NOW + 30) is True
    assert b.holds["r1:0"].expires == NOW + 120
    assert b.refresh("gone:0", owner="mine", expires=NOW + 999) is False


def test_expired_lists_holds_past_their_expiry() -> None:
    b = book()
    reserve(b, "r1", 0, expires=NOW + 10)
    reserve(b, "r2", 0, expires=NOW + 20)
    assert b.expired(NOW + 9) == []
    assert [key for key, _ in b.expired(NOW + 10)] == ["r1:0"]
    assert sorted(key for key, _ in b.expired(NOW + 30)) == ["r1:0", "r2:0"]


# --------------------------------------------------------------------------- settle


def admitted(*runs: str, **limit_kwargs: object) -> Book:
    b = book(**limit_kwargs)
    for run in runs:
        assert b.admit(run, "ns", run, now=NOW) is None
    return b


def test_settle_charges_cumulative_deltas_and_drops_the_hold() -> None:
    b = admitted("r1")
    reserve(b, "r1", 0, 500, "0.50")
    assert b.settle("r1", turn=0, tokens=100, cost_usd=Decimal("0.01"), now=NOW, key="r1:0") == (
        100,
        Decimal("0.01"),
    )
    assert b.holds == {}
    reserve(b, "r1", 1, 500, "0.50")
    assert b.settle("r1", turn=1, tokens=250, cost_usd=Decimal("0.035"), now=NOW, key="r1:1") == (
        150,
        Decimal("0.025"),
    )
    assert (b.used_tokens, b.used_cost) == (250, Decimal("0.035"))
    assert b.holds == {}
    run = b.active["r1"]
    assert (run.turn, run.tokens, run.cost_usd) == (1, 250, Decimal("0.035"))


def test_settling_twice_charges_once() -> None:
    b = admitted("r1")
    reserve(b, "r1", 0, 500)
    first = b.settle("r1", turn=0, tokens=120, cost_usd=Decimal("0.2"), now=NOW, key="r1:0")
    second = b.settle("r1", turn=0, tokens=120, cost_usd=Decimal("0.2"), now=NOW, key="r1:0")
    assert first == (120, Decimal("0.2"))
    assert second == (0, Decimal(0))
    assert (b.used_tokens, b.used_cost) == (120, Decimal("0.2"))


def test_settlement_is_order_free() -> None:
    b = admitted("r1")
    reserve(b, "r1", 2, 100)
    reserve(b, "r1", 3, 100)
    # turn 3's settlement (cumulative, so it covers turn 2) lands before turn 2's
    assert b.settle("r1", turn=3, tokens=300, cost_usd=Decimal("0.3"), now=NOW, key="r1:3") == (
        300,
        Decimal("0.3"),
    )
    assert b.settle("r1", turn=2, tokens=200, cost_usd=Decimal("0.2"), now=NOW, key="r1:2") == (
        0,
        Decimal(0),
    )
    assert (b.used_tokens, b.used_cost) == (300, Decimal("0.3"))
    assert b.holds == {}  # the late settlement still dropped its hold
    assert b.active["r1"].turn == 3


def test_settle_without_a_key_keeps_holds() -> None:
    b = admitted("r1")
    reserve(b, "r1", 0, 100)
    b.settle("r1", turn=0, tokens=10, cost_usd=Decimal(0), now=NOW)
    assert "r1:0" in b.holds


def test_settle_for_an_unknown_or_closed_run_charges_nothing_but_drops_the_hold() -> None:
    b = admitted("r1")
    reserve(b, "ghost", 4, 100, "0.1")
    assert b.settle("ghost", turn=4, tokens=99, cost_usd=Decimal("1"), now=NOW, key="ghost:4") == (
        0,
        Decimal(0),
    )
    assert b.holds == {}
    b.close("r1", turn=0, tokens=10, cost_usd=Decimal("0.01"), end=NOW, now=NOW)
    reserve(b, "r1", 1, 100)
    assert b.settle("r1", turn=1, tokens=50, cost_usd=Decimal("0.05"), now=NOW, key="r1:1") == (
        0,
        Decimal(0),
    )
    assert b.holds == {}
    assert (b.used_tokens, b.used_cost) == (10, Decimal("0.01"))


# --------------------------------------------------------------------------- close


def test_close_charges_final_totals_and_wall_seconds_frees_the_slot_and_drops_holds() -> None:
    b = admitted("r1", "r2", max_concurrent_runs=2)
    b.settle("r1", turn=0, tokens=100, cost_usd=Decimal("0.10"), now=NOW + 1)
    reserve(b, "r1", 1, 500)
    reserve(b, "r1", 2, 500)  # a stray hold of a later turn
    reserve(b, "r2", 0, 70)
    assert b.admit("r3", "ns", "r3", now=NOW).reason == CONCURRENCY_LIMIT  # type: ignore[union-attr]
    closed = b.close("r1", turn=1, tokens=180, cost_usd=Decimal("0.18"), end=NOW + 45, now=NOW + 50)
    assert closed is True
    assert (b.used_tokens, b.used_cost) == (180, Decimal("0.18"))
    assert b.used_wall == 45.0
    assert set(b.holds) == {"r2:0"}
    assert set(b.active) == {"r2"}
    assert b.admit("r3", "ns", "r3", now=NOW + 50) is None
    # a second close: nothing more charged, False
    again = b.close("r1", turn=2, tokens=999, cost_usd=Decimal("9"), end=NOW + 99, now=NOW + 99)
    assert again is False
    assert (b.used_tokens, b.used_cost, b.used_wall) == (180, Decimal("0.18"), 45.0)


def test_close_charges_wall_time_up_to_now_at_most_and_never_negative() -> None:
    b = admitted("r1", "r2")
    b.close("r1", turn=-1, tokens=0, cost_usd=Decimal(0), end=NOW + 500, now=NOW + 20)
    assert b.used_wall == 20.0
    b.close("r2", turn=-1, tokens=0, cost_usd=Decimal(0), end=NOW - 5, now=NOW + 30)
    assert b.used_wall == 20.0


def test_close_of_a_run_never_admitted_returns_false_but_drops_its_holds() -> None:
    b = book()
    reserve(b, "r9", 0, 10)
    assert b.close("r9", turn=0, tokens=5, cost_usd=Decimal(0), end=NOW, now=NOW) is False
    assert b.holds == {}
    assert b.used_tokens == 0


# --------------------------------------------------------------------------- admit / exhausted


def test_admit_is_idempotent() -> None:
    b = book(max_concurrent_runs=1)
    assert b.admit("r1", "ns", "one", now=NOW) is None
    assert b.admit("r1", "ns", "one", now=NOW + 30) is None  # at the cap, but already active
    assert list(b.active) == ["r1"]
    assert b.active["r1"] == Active("ns", "one", NOW)


def test_admit_refuses_at_max_concurrent_runs() -> None:
    b = book(max_concurrent_runs=2)
    assert b.admit("r1", "ns", "a", now=NOW) is None
    assert b.admit("r2", "ns", "b", now=NOW) is None
    refusal = b.admit("r3", "ns", "c", now=NOW)
    assert refusal is not None
    assert (refusal.reason, refusal.resource) == (CONCURRENCY_LIMIT, None)
    assert "2" in refusal.message
    assert "r3" not in b.active


@pytest.mark.parametrize(
    ("kwargs", "setup", "resource"),
    [
        ({"tokens": 100}, {"used_tokens": 100}, "tokens"),
        ({"cost_usd": Decimal("5.00")}, {"used_cost": Decimal("5.00")}, "costUSD"),
        ({"wall_seconds": 60.0}, {"used_wall": 60.0}, "wallClockSeconds"),
        ({"tokens": 0}, {}, "tokens"),
    ],
)
def test_admit_refuses_when_the_budget_is_exhausted(
    kwargs: dict[str, object], setup: dict[str, object], resource: str
) -> None:
    b = book(**kwargs)
    for attr, value in setup.items():
        setattr(b, attr, value)
    refusal = b.admit("r1", "ns", "a", now=NOW)
    assert refusal is not None
    assert (refusal.reason, refusal.resource) == (BUDGET_EXHAUSTED, resource)
    assert b.active == {}
    assert b.exhausted(NOW) == refusal


def test_reservations_count_toward_exhaustion() -> None:
    b = book(tokens=100, cost_usd=Decimal("1"))
    reserve(b, "r1", 0, 99, "0.99")
    assert b.exhausted(NOW) is None
    reserve(b, "r2", 0, 0, "0.01")
    refusal = b.exhausted(NOW)
    assert refusal is not None and refusal.resource == "costUSD"
    reserve(b, "r3", 0, 1)
    assert b.exhausted(NOW).resource == "tokens"  # type: ignore[union-attr]


def test_wall_clock_of_active_runs_is_charged_live() -> None:
    b = admitted("r1", "r2", wall_seconds=100.0)
    b.used_wall = 10.0
    assert b.wall_used(NOW) == 10.0
    assert b.wall_used(NOW + 30) == 70.0
    assert b.wall_used(NOW - 5) == 10.0  # a clock behind `since` never subtracts
    assert b.exhausted(NOW + 44) is None
    refusal = b.exhausted(NOW + 45)
    assert refusal is not None and refusal.resource == "wallClockSeconds"
    assert b.admit("r3", "ns", "r3", now=NOW + 45) == refusal


# --------------------------------------------------------------------------- roll


def test_roll_at_the_window_boundary_resets_used_but_not_holds_or_run_charges() -> None:
    b = admitted("r1", wall_seconds=10_000.0, tokens=1_000)
    b.settle("r1", turn=0, tokens=400, cost_usd=Decimal("0.4"), now=NOW)
    reserve(b, "r1", 1, 300)
    b.used_wall = 77.0
    assert b.roll(T0 + DAY - 0.001) is False
    assert b.used_tokens == 400
    assert b.roll(T0 + DAY) is True
    assert b.window == T0 + DAY
    assert b.reset_time == T0 + 2 * DAY
    assert (b.used_tokens, b.used_cost, b.used_wall) == (0, Decimal(0), 0.0)
    assert set(b.holds) == {"r1:1"}
    run = b.active["r1"]
    assert (run.turn, run.tokens, run.cost_usd) == (0, 400, Decimal("0.4"))
    assert run.since == T0 + DAY
    assert b.wall_used(T0 + DAY + 5) == 5.0
    assert b.roll(T0 + DAY + 10) is False
    # the next settlement in the new window charges only what is new
    b.settle("r1", turn=1, tokens=450, cost_usd=Decimal("0.45"), now=T0 + DAY + 10, key="r1:1")
    assert (b.used_tokens, b.used_cost) == (50, Decimal("0.05"))


def test_roll_keeps_since_of_a_run_admitted_after_the_window_start() -> None:
    b = book()
    b.admit("r1", "ns", "a", now=NOW)
    b.roll(T0 + 3 * DAY + 1)  # several windows later
    assert b.window == T0 + 3 * DAY
    assert b.active["r1"].since == T0 + 3 * DAY


def test_operations_roll_the_window_first() -> None:
    b = book(tokens=100)
    b.used_tokens = 100
    assert b.admit("r1", "ns", "a", now=NOW) is not None
    assert b.reserve("r1:0", hold(tokens=100), now=T0 + DAY + 1) is None  # rolled: fits again
    assert b.window == T0 + DAY
    assert b.admit("r1", "ns", "a", now=T0 + DAY + 1) is not None  # reserved = limit now
    b.used_tokens = 0
    b.take_hold("r1:0")
    assert b.admit("r1", "ns", "a", now=T0 + 2 * DAY + 1) is None
    assert b.window == T0 + 2 * DAY


# --------------------------------------------------------------------------- encode / decode


def full_book() -> Book:
    b = Book.new(
        "acme",
        TenantLimits(
            tokens=1_000_000,
            cost_usd=Decimal("5.00"),
            wall_seconds=3_600.5,
            window_seconds=DAY,
            max_concurrent_runs=3,
        ),
        now=NOW,
    )
    b.admit("r1", "ns1", "one", now=NOW + 0.125)
    b.admit("r2", "ns2", "two", now=NOW + 7)
    b.settle("r1", turn=4, tokens=12_345, cost_usd=Decimal("4.750000000001"), now=NOW)
    b.used_wall = 12.345
    # a hold's run names are its run's (the entry stores them once, with the active run)
    reserve(
        b,
        "r1",
        5,
        777,
        "0.000000123456789",
        owner="w-1",
        expires=NOW + 60.5,
        namespace="ns1",
        name="one",
    )
    reserve(b, "r2", 0, 1, "0.09", owner="w-2", namespace="ns2", name="two")
    return b


def test_encode_decode_round_trips_exactly() -> None:
    b = full_book()
    back = codec.decode_book(codec.encode_book(b))
    assert back == b
    assert codec.encode_book(back) == codec.encode_book(b)
    assert back.used_cost == Decimal("4.750000000001")
    assert str(back.limits.cost_usd) == "5.00"
    assert back.holds["r1:5"].cost_usd == Decimal("0.000000123456789")
    assert back.holds["r1:5"] == b.holds["r1:5"]
    assert back.active["r1"].turn == 4


def test_times_round_trip_to_the_writers_exact_values() -> None:
    b = full_book()
    b.active["r2"].since = NOW + 7.123456789
    b.holds["r1:5"].expires = NOW + 60.0004567
    back = codec.decode_book(codec.encode_book(b))
    assert back.active["r2"].since == NOW + 7.123456789
    assert back.holds["r1:5"].expires == NOW + 60.0004567


def test_encode_keeps_decimals_as_strings_never_floats() -> None:
    raw = json.loads(codec.encode_book(full_book()))
    assert raw["used"]["costUSD"] == "4.750000000001"
    assert raw["limits"]["costUSD"] == "5.00"
    run = raw["runs"]["r1"]
    tiny = run["holds"]["r1:5"][2]  # [turn, tokens, cost, ...]; exact, maybe as 1.2E-7
    assert isinstance(tiny, str) and Decimal(tiny) == Decimal("0.000000123456789")
    assert run["active"][5] == "4.750000000001"  # [ns, name, since, turn, tokens, cost]
    assert Decimal(raw["reserved"]["costUSD"]) == full_book().reserved_cost


def test_an_unanswered_hold_is_stored_as_five_fields_and_an_answered_one_as_seven() -> None:
    """A run's entry is rewritten on every change of it: a hold whose call has not answered
    carries no spent fields (``[turn, tokens, cost, expires, owner]``)."""
    b = full_book()
    b.holds["r2:0"].spent_tokens, b.holds["r2:0"].spent_cost = 40, Decimal("0.01")
    b.holds["r2:0"].recorded = True
    raw = json.loads(codec.encode_book(b))
    assert len(raw["runs"]["r1"]["holds"]["r1:5"]) == 5  # [turn, tokens, cost, expires, owner]
    assert raw["runs"]["r2"]["holds"]["r2:0"][5:] == [40, "0.01"]
    assert codec.decode_book(codec.encode_book(b)) == b


def test_a_legacy_hold_whose_run_is_not_active_decodes_without_run_names() -> None:
    """The one-value book of earlier releases stores a run's namespace and name once, with its
    active entry: a hold of a run no longer active is read without them."""
    legacy = {
        "v": 2,
        "tenant": "t",
        "limits": {
            "tokens": None,
            "costUSD": None,
            "wallClockSeconds": None,
            "windowSeconds": 86400.0,
            "maxConcurrentRuns": None,
        },
        "window": NOW - 60,
        "used": {
            "tokens": 0,
            "costUSD": "0",
            "wallClockSeconds": 0.0,
            "abandonedTokens": 0,
            "abandonedCostUSD": "0",
        },
        "holds": {"r2:0": ["r2", 0, 1, "0", NOW + 60, "w2"]},
        "active": {},
    }
    back = codec.decode_one_value(json.dumps(legacy).encode()).holds["r2:0"]
    assert (back.namespace, back.name) == ("", "")
    assert back.run_uid == "r2" and back.tokens == 1


def test_the_used_wall_clock_time_is_stored_to_the_millisecond() -> None:
    b = full_book()
    b.used_wall = 12.3456789
    assert json.loads(codec.encode_book(b))["used"]["wallClockSeconds"] == 12.346
    assert codec.decode_book(codec.encode_book(b)).used_wall == 12.346


def test_a_malformed_entry_is_refused_as_corrupt_naming_the_field() -> None:
    with pytest.raises(LedgerCorrupt, match=r"(?s)^malformed ledger totals: .*\bwindow\b"):
        codec.decode_book(b'{"v": 3, "tenant": "t", "window": "abc"}')


def test_an_unlimited_empty_book_round_trips() -> None:
    b = book()
    assert codec.decode_book(codec.encode_book(b)) == b


@pytest.mark.parametrize(
    "garbage",
    [
        b"not json",
        b"",
        b"{}",
        b'{"tenant": "t"}',
        b'{"window": 0}',
        b'{"tenant": "t", "window": 0, "used": {"costUSD": "abc"}}',
        b'{"tenant": "t", "window": 0, "holds": {"k": {"run": "r"}}}',
        b'{"tenant": "t", "window": 0, "active": {"k": []}}',
        b'{"tenant": "t", "window": "abc"}',
        b'{"tenant": "t", "window": 0, "limits": {"costUSD": "x"}}',
        b"\xff\xfe",
    ],
)
def test_decode_raises_value_error_on_garbage(garbage: bytes) -> None:
    with pytest.raises(ValueError):
        codec.decode_book(garbage)


@pytest.mark.parametrize(
    "garbage",
    [
        b"[]",
        b"null",
        b"42",
        b'"book"',
        b'{"tenant": "t", "window": 0, "used": 5}',
        b'{"tenant": "t", "window": 0, "holds": [1]}',
        b'{"tenant": "t", "window": 0, "active": "x"}',
    ],
)
def test_decode_raises_value_error_on_json_of_the_wrong_shape(garbage: bytes) -> None:
    # Book.decode documents ``ValueError`` on a malformed entry; JSON that is not an object
    # (or whose parts are not objects) must not escape as AttributeError.
    with pytest.raises(ValueError):
        codec.decode_book(garbage)


# --------------------------------------------------------------------------- property


RUNS = ("run-0", "run-1", "run-2")
TOKEN_LIMIT = 1_000
COST_LIMIT = Decimal("1.00")
FRACTIONS = st.integers(min_value=0, max_value=4)
"""Quarters of a hold a settled call actually used."""

ops = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), st.sampled_from(RUNS)),
        st.tuples(
            st.just("reserve"),
            st.sampled_from(RUNS),
            st.integers(min_value=0, max_value=450),
            st.integers(min_value=0, max_value=45),
        ),
        st.tuples(st.just("settle"), st.sampled_from(RUNS), FRACTIONS),
        st.tuples(st.just("resettle"), st.sampled_from(RUNS)),
        st.tuples(st.just("release"), st.sampled_from(RUNS), st.booleans()),
        st.tuples(st.just("refresh"), st.sampled_from(RUNS)),
        st.tuples(st.just("close"), st.sampled_from(RUNS), FRACTIONS),
    ),
    max_size=60,
)


@dataclasses.dataclass
class RunModel:
    """What the test knows of one run: its own cumulative usage and its in-flight hold."""

    admitted: bool = False
    closed: bool = False
    turn: int = 0
    tokens: int = 0
    cost: Decimal = Decimal(0)
    hold: Hold | None = None
    settled: tuple[int, int, Decimal] | None = None


def _used_by(run: RunModel, quarters: int) -> tuple[int, Decimal]:
    assert run.hold is not None
    return run.hold.tokens * quarters // 4, run.hold.cost_usd * quarters / 4


def _do_reserve(b: Book, uid: str, run: RunModel, tokens: int, cents: int, now: float) -> None:
    cost = Decimal(cents) / 100
    new = Hold(uid, run.turn, tokens, cost, now + 60, f"{uid}-owner-{run.turn}", "ns", uid)
    fits = (
        b.used_tokens + b.reserved_tokens + tokens <= TOKEN_LIMIT
        and b.used_cost + b.reserved_cost + cost <= COST_LIMIT
    )
    refusal = b.reserve(f"{uid}:{run.turn}", new, now=now)
    assert (refusal is None) == fits
    if refusal is None:
        run.hold = new


def _do_settle(b: Book, uid: str, run: RunModel, quarters: int, now: float) -> None:
    assert run.hold is not None
    tokens, cost = _used_by(run, quarters)
    run.tokens += tokens
    run.cost += cost
    charged = b.settle(
        uid, turn=run.turn, tokens=run.tokens, cost_usd=run.cost, now=now, key=f"{uid}:{run.turn}"
    )
    assert charged == (tokens, cost)
    run.settled = (run.turn, run.tokens, run.cost)
    run.turn += 1
    run.hold = None


def _do_close(b: Book, uid: str, run: RunModel, quarters: int, now: float) -> None:
    turn = run.turn - 1
    if run.hold is not None:
        tokens, cost = _used_by(run, quarters)
        run.tokens += tokens
        run.cost += cost
        turn = run.turn
    assert b.close(uid, turn=turn, tokens=run.tokens, cost_usd=run.cost, end=now, now=now)
    assert b.close(uid, turn=turn, tokens=run.tokens, cost_usd=run.cost, end=now, now=now) is False
    run.closed, run.hold = True, None


def _step(b: Book, op: tuple, models: dict[str, RunModel], now: float) -> None:  # type: ignore[type-arg]
    kind, uid = op[0], op[1]
    run = models[uid]
    if kind == "admit" and not run.closed:
        run.admitted = run.admitted or b.admit(uid, "ns", uid, now=now) is None
        return
    if not run.admitted or run.closed:
        return
    key = f"{uid}:{run.turn}"
    if kind == "reserve" and run.hold is None:
        _do_reserve(b, uid, run, op[2], op[3], now)
    elif kind == "settle" and run.hold is not None:
        _do_settle(b, uid, run, op[2], now)
    elif kind == "resettle" and run.settled is not None:
        turn, tokens, cost = run.settled
        assert b.settle(uid, turn=turn, tokens=tokens, cost_usd=cost, now=now) == (0, Decimal(0))
    elif kind == "release" and run.hold is not None:
        owner = run.hold.owner if op[2] else "someone-else"
        assert b.release(key, owner=owner) is op[2]
        if op[2]:
            run.hold = None
    elif kind == "refresh" and run.hold is not None:
        assert b.refresh(key, owner=run.hold.owner, expires=now + 120)
    elif kind == "close":
        _do_close(b, uid, run, op[2], now)


def _check(b: Book, models: dict[str, RunModel]) -> None:
    assert b.used_tokens + b.reserved_tokens <= TOKEN_LIMIT
    assert b.used_cost + b.reserved_cost <= COST_LIMIT
    assert b.used_tokens == sum(m.tokens for m in models.values())
    assert b.used_cost == sum((m.cost for m in models.values()), Decimal(0))
    assert set(b.holds) == {f"{uid}:{m.turn}" for uid, m in models.items() if m.hold is not None}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=ops)
def test_random_interleavings_never_overspend_and_charge_exactly(script: list[tuple]) -> None:  # type: ignore[type-arg]
    b = Book.new("acme", TenantLimits(tokens=TOKEN_LIMIT, cost_usd=COST_LIMIT), now=NOW)
    models = {uid: RunModel() for uid in RUNS}
    for step, op in enumerate(script):
        # every change goes through encode/decode, as the store applies it
        b = codec.decode_book(codec.encode_book(b))
        _step(b, op, models, NOW + step)
        _check(b, models)
    end = NOW + len(script) + 1
    for uid, run in models.items():
        if run.admitted and not run.closed:
            _do_close(b, uid, run, 4, end)
    _check(b, models)
    assert b.holds == {}
    assert b.active == {}
    assert b.window == T0  # no roll happened


def test_catch_up_settles_the_previous_turn_and_frees_its_hold_before_the_next_reserve() -> None:
    """A worker reserving turn 2 must not be refused for turn 1's hold when turn 1's worker
    has committed but not yet settled (the race between two workers on consecutive turns)."""
    book = Book.new("t", TenantLimits(tokens=2_000), now=0.0)
    assert book.admit("r", "ns", "r", now=0.0) is None
    first = Hold("r", 1, 1_100, Decimal(0), 60.0, "w1", "ns", "r")
    assert book.reserve("r:1", first, now=1.0) is None
    second = Hold("r", 2, 1_100, Decimal(0), 60.0, "w2", "ns", "r")
    assert book.reserve("r:2", second, now=2.0) is not None  # 1100 + 1100 > 2000
    book.catch_up("r", turn=1, tokens=120, cost_usd=Decimal(0), now=2.0)
    assert "r:1" not in book.holds and book.used_tokens == 120
    assert book.reserve("r:2", second, now=2.0) is None
    # turn 1's worker settles late: nothing more is charged
    book.settle("r", turn=1, tokens=120, cost_usd=Decimal(0), now=3.0, key="r:1")
    assert book.used_tokens == 120 and "r:2" in book.holds


def test_admission_asks_for_the_first_calls_worst_case() -> None:
    book = Book.new("t", TenantLimits(tokens=2_000), now=0.0)
    book.used_tokens = 1_000
    refusal = book.admit("r", "ns", "r", now=0.0, need_tokens=1_253)
    assert refusal is not None and refusal.resource == "tokens"
    assert "first call needs up to 1253" in refusal.message
    assert book.admit("r", "ns", "r", now=0.0, need_tokens=1_000) is None  # exactly fits


def test_runs_admitted_together_cannot_be_promised_the_same_budget() -> None:
    """Admission holds each run's first call until its worker reserves it: six runs needing
    3000 each under a 10000 limit — three are admitted, and each admitted run's first call
    fits when it comes (the breaker's SIGSTOPped-workers case)."""
    book = Book.new("t", TenantLimits(tokens=10_000), now=0.0)
    admitted = [
        uid
        for uid in ("s1", "s2", "s3", "s4", "s5", "s6")
        if book.admit(uid, "ns", uid, now=0.0, need_tokens=3_000) is None
    ]
    assert admitted == ["s1", "s2", "s3"]
    for uid in admitted:  # each first call: catch up (drops its admission hold), then reserve
        book.catch_up(uid, turn=-1, tokens=0, cost_usd=Decimal(0), now=1.0)
        hold = Hold(uid, 0, 3_000, Decimal(0), 60.0, f"w-{uid}", "ns", uid)
        assert book.reserve(f"{uid}:0", hold, now=1.0) is None
    assert book.reserved_tokens == 9_000 and not any(k.endswith(":admission") for k in book.holds)
    assert book.close("s1", turn=0, tokens=120, cost_usd=Decimal(0), end=2.0, now=2.0)
    assert "s1:admission" not in book.holds


def test_an_abandoned_call_is_charged_once_and_only_by_its_holder() -> None:
    """A call answered, then its turn was cancelled: the provider bills it, so the tenant is
    charged (and told apart as abandoned); a worker whose hold was taken over charges nothing."""
    book = Book.new("t", TenantLimits(tokens=10_000), now=0.0)
    assert book.admit("r", "ns", "r", now=0.0) is None
    assert (
        book.reserve("r:0", Hold("r", 0, 1_100, Decimal(0), 60.0, "w1", "ns", "r"), now=0.0) is None
    )
    assert not book.abandon("r:0", owner="w2", tokens=120, cost_usd=Decimal("0.001"), now=1.0)
    assert book.abandon("r:0", owner="w1", tokens=120, cost_usd=Decimal("0.001"), now=1.0)
    assert not book.abandon("r:0", owner="w1", tokens=120, cost_usd=Decimal("0.001"), now=1.0)
    assert (book.used_tokens, book.abandoned_tokens, book.reserved_tokens) == (120, 120, 0)
    assert book.abandoned_cost == Decimal("0.001") == book.used_cost
    assert codec.decode_book(codec.encode_book(book)).abandoned_tokens == 120
    book.roll(86_400.0 * 2)
    assert (book.used_tokens, book.abandoned_tokens) == (0, 0)


CALLS = {"a": (120, Decimal("0.001")), "b": (155, Decimal("0.002"))}
"""What each delivery's model call of the turn uses: (tokens, USD)."""

# One turn (turn 0 of run "r") delivered twice and run by both deliveries at once, step by
# step: "<who> reserve|spend|settle|commit|leave", or "next" / "close" (the committer read
# from the turn's event). ``spend-unacknowledged``: its usage is recorded, but its worker
# heard a timeout. ``settle``: commits and settles; ``commit``: commits, then its
# worker dies before settling; ``leave``: its commit lost, it leaves uncommitted; a delivery
# with no ``leave`` or ``settle`` died after its last step. ``next``: the run's next turn
# reserves; ``close``: the run ends.
TURN_RUN_TWICE = {
    "the winner settles while the loser's call is in flight": (
        "a reserve",
        "b reserve",
        "a spend",
        "a settle",
        "b spend",
        "b leave",
    ),
    "the winner settles after the loser's call answered": (
        "a reserve",
        "b reserve",
        "a spend",
        "b spend",
        "a settle",
        "b leave",
    ),
    "the loser leaves before the winner settles": (
        "a reserve",
        "b reserve",
        "b spend",
        "a spend",
        "a leave",
        "b settle",
    ),
    "the first delivery answered before the redelivery took its hold, and lost": (
        "a reserve",
        "a spend",
        "b reserve",
        "b spend",
        "b settle",
        "a leave",
    ),
    "the first delivery answered before the redelivery took its hold, and won": (
        "a reserve",
        "a spend",
        "b reserve",
        "a settle",
        "b spend",
        "b leave",
    ),
    "the winner dies between its commit and its settle; the next turn resolves it": (
        "a reserve",
        "a spend",
        "b reserve",
        "a commit",
        "b spend",
        "b leave",
        "next",
    ),
    "the winner dies before settling and the loser after its call; the close resolves": (
        "a reserve",
        "a spend",
        "b reserve",
        "b spend",
        "a commit",
        "close",
    ),
    "the loser's usage write timed out but landed; it charges nothing more as it leaves": (
        "a reserve",
        "b reserve",
        "b spend-unacknowledged",
        "a spend",
        "a settle",
        "b leave",
    ),
    "the loser dies after its model call": (
        "a reserve",
        "b reserve",
        "b spend",
        "a spend",
        "a settle",
    ),
}


@pytest.mark.parametrize("prompt", [0, 100], ids=["no-prompt-bound", "prompt-bound"])
@pytest.mark.parametrize("steps", TURN_RUN_TWICE.values(), ids=TURN_RUN_TWICE.keys())
def test_every_model_call_of_a_turn_run_twice_is_charged_exactly_once(
    steps: tuple[str, ...], prompt: int
) -> None:
    """The committed call through the run's usage, the losing call as abandoned, whoever
    settles, leaves or dies first: ``set_aside`` on a takeover, ``resolve_turn`` with the
    committer its event names, ``abandon`` of a call whose usage never reached a hold. With
    each hold carrying its call's prompt bound (below what either call used), a hold dropped
    before its call's usage reached it is charged that bound and its delivery the rest as it
    leaves: the same totals."""
    book = Book.new("t", TenantLimits(tokens=100_000), now=0.0)
    assert book.admit("r", "ns", "r", now=0.0) is None
    recorded = dict.fromkeys(CALLS, False)
    winner = next(s.split()[0] for s in steps if s.endswith(("settle", "commit")))
    bound = {"prompt_tokens": prompt, "prompt_cost": Decimal(prompt) / 200_000}
    for step in steps:
        who, _, action = step.partition(" ")
        tokens, cost = CALLS.get(who, CALLS[winner])
        if action == "reserve":
            held = Hold("r", 0, 1_000, Decimal(0), 60.0, who, **bound)  # type: ignore[arg-type]
            assert book.reserve("r:0", held, now=1.0) is None
        elif action.startswith("spend"):
            landed = book.record_spend("r:0", owner=who, tokens=tokens, cost_usd=cost)
            recorded[who] = landed and action == "spend"  # else its worker heard a timeout
        elif action == "settle":
            book.resolve_turn("r", 0, committer=who)
            book.settle("r", turn=0, tokens=tokens, cost_usd=cost, now=2.0)
        elif action == "leave":
            unrecorded = not recorded[who]
            book.abandon(
                "r:0", owner=who, tokens=tokens, cost_usd=cost, now=2.0, unrecorded=unrecorded
            )
        elif who == "next":
            book.resolve_turn("r", 0, committer=winner)
            book.catch_up("r", turn=0, tokens=tokens, cost_usd=cost, now=3.0)
        elif who == "close":
            book.resolve_turn("r", 0, committer=winner)
            book.close("r", turn=0, tokens=tokens, cost_usd=cost, end=3.0, now=3.0)
        book = codec.decode_book(codec.encode_book(book))  # as the store applies each change
    loser = "b" if winner == "a" else "a"
    assert book.holds == {}
    assert (book.used_tokens, book.abandoned_tokens) == (275, CALLS[loser][0])
    assert (book.used_cost, book.abandoned_cost) == (Decimal("0.003"), CALLS[loser][1])


def test_a_run_stopped_after_its_committer_died_unsettled_charges_that_call_once() -> None:
    """Turn 0 committed by ``a`` (its call answered, its usage on its hold), ``a`` died before
    settling, then the run ended by a ``stop`` event, which names no committer: the close's
    ``resolve_turn`` with an empty committer drops nothing and charges nothing, so ``a``'s call
    is charged once, through the run's usage, by the close."""
    book = Book.new("t", TenantLimits(tokens=100_000), now=0.0)
    assert book.admit("r", "ns", "r", now=0.0) is None
    assert book.reserve("r:0", Hold("r", 0, 1_000, Decimal(0), 60.0, "a"), now=1.0) is None
    assert book.record_spend("r:0", owner="a", tokens=110, cost_usd=Decimal("0.001"))
    assert book.resolve_turn("r", 0, committer="") == 0
    assert (book.used_tokens, list(book.holds)) == (0, ["r:0"])
    assert book.close("r", turn=0, tokens=110, cost_usd=Decimal("0.001"), end=3.0, now=3.0)
    assert (book.used_tokens, book.used_cost) == (110, Decimal("0.001"))
    assert (book.abandoned_tokens, book.holds) == (0, {})


def test_used_never_goes_down_even_when_a_settlement_reports_less_than_was_charged() -> None:
    """``used`` only grows within a window (the reservation's refusal rule relies on it): a
    newer turn's totals below what the run was charged (which no committed history produces)
    charge nothing and lower nothing, so the next settlement charges only what is new."""
    b = book(tokens=100_000)
    assert b.admit("r1", "ns", "r1", now=NOW) is None
    assert b.settle("r1", turn=1, tokens=100, cost_usd=Decimal("0.010"), now=NOW) == (
        100,
        Decimal("0.010"),
    )
    assert b.settle("r1", turn=2, tokens=80, cost_usd=Decimal("0.008"), now=NOW) == (
        0,
        Decimal(0),
    )
    assert (b.used_tokens, b.used_cost) == (100, Decimal("0.010"))
    assert (b.active["r1"].tokens, b.active["r1"].cost_usd) == (100, Decimal("0.010"))
    assert b.settle("r1", turn=3, tokens=120, cost_usd=Decimal("0.012"), now=NOW) == (
        20,
        Decimal("0.002"),
    )
    assert (b.used_tokens, b.used_cost) == (120, Decimal("0.012"))


def answered(run: str, turn: int, owner: str, tokens: int, cost: str) -> Hold:
    """A hold whose call answered, using ``tokens`` / ``cost``."""
    made = hold(run, turn, 1_000, "0.01", owner=owner)
    made.spent_tokens, made.spent_cost, made.recorded = tokens, Decimal(cost), True
    return made


def spent_before(b: Book) -> None:
    """What the window had charged already: 500 tokens, 0.005 USD, 50 / 0.0005 abandoned."""
    b.used_tokens, b.used_cost = 500, Decimal("0.005")
    b.abandoned_tokens, b.abandoned_cost = 50, Decimal("0.0005")


def test_abandoned_calls_add_to_what_the_window_had_charged() -> None:
    """Whoever charges an abandoned call — the sweep dropping its hold, or its own delivery
    leaving — adds it to ``used`` and ``abandoned``, never replaces them."""
    b = book(tokens=100_000)
    spent_before(b)
    b.put_hold("r1:0", answered("r1", 0, "w1", 100, "0.001"))
    assert b.drop_hold("r1:0", committed_turn=-1)
    assert (b.used_tokens, b.used_cost) == (600, Decimal("0.006"))
    assert (b.abandoned_tokens, b.abandoned_cost) == (150, Decimal("0.0015"))
    b.put_hold("r2:0", hold("r2", 0, 1_000, "0.01", owner="w2"))
    assert b.abandon("r2:0", owner="w2", tokens=10, cost_usd=Decimal("0.0001"), now=NOW)
    assert (b.used_tokens, b.used_cost) == (610, Decimal("0.0061"))
    assert (b.abandoned_tokens, b.abandoned_cost) == (160, Decimal("0.0016"))


def test_a_delivery_leaving_charges_its_call_set_aside_by_a_takeover_once() -> None:
    """Its hold was moved aside (``r1:0/dead``) when another delivery took the turn: leaving,
    it charges its call and drops that hold, even with its usage recorded on it."""
    b = book(tokens=100_000)
    b.put_hold("r1:0", hold("r1", 0, 1_000, "0.01", owner="next"))
    b.put_hold("r1:0/dead", answered("r1", 0, "dead", 100, "0.001"))
    assert b.abandon("r1:0", owner="dead", tokens=100, cost_usd=Decimal("0.001"), now=NOW)
    assert list(b.holds) == ["r1:0"]
    assert (b.used_tokens, b.abandoned_tokens) == (100, 100)
    assert not b.abandon("r1:0", owner="dead", tokens=100, cost_usd=Decimal("0.001"), now=NOW)
    assert (b.used_tokens, b.abandoned_tokens) == (100, 100)


def test_a_call_its_delivery_abandoned_is_taken_back_when_its_turn_committed_after_all() -> None:
    """A delivery whose commit landed but whose answer it never got (cancelled at its drain's
    end while the append was in flight, or the append gave up after a try that landed) leaves
    its turn uncommitted as far as it knows, charging its answered call as abandoned
    (``abandon``). The turn's event names it as the committer: the next turn's reservation
    (``resolve_turn`` by that owner, then ``catch_up`` of the run's usage, which holds the
    call) must take that charge back, so the call is charged once, as the run's."""
    b = admitted("r1", tokens=100_000)
    b.put_hold("r1:0", answered("r1", 0, "w1", 110, "0.00035"))
    assert b.abandon("r1:0", owner="w1", tokens=110, cost_usd=Decimal("0.00035"), now=NOW)
    assert (b.used_tokens, b.abandoned_tokens) == (110, 110)
    b.resolve_turn("r1", 0, committer="w1")  # the next turn's reservation (_settle_before)
    b.catch_up("r1", turn=0, tokens=110, cost_usd=Decimal("0.00035"), now=NOW)
    assert (b.used_tokens, b.used_cost) == (110, Decimal("0.00035"))
    assert (b.abandoned_tokens, b.abandoned_cost) == (0, Decimal(0))
    b.resolve_turn("r1", 0, committer="w1")  # resolved again (the next turn's settlement)
    assert (b.used_tokens, b.abandoned_tokens, b.credited_tokens) == (110, 0, 110)


def test_a_call_abandoned_by_a_delivery_that_lost_the_commit_stays_charged() -> None:
    """The same charge stays when another delivery committed the turn: its call was billed
    and is in no run's usage."""
    b = admitted("r1", tokens=100_000)
    b.put_hold("r1:0", answered("r1", 0, "w1", 110, "0.00035"))
    assert b.abandon("r1:0", owner="w1", tokens=110, cost_usd=Decimal("0.00035"), now=NOW)
    b.resolve_turn("r1", 0, committer="w2")
    b.catch_up("r1", turn=0, tokens=110, cost_usd=Decimal("0.00035"), now=NOW)
    assert (b.used_tokens, b.abandoned_tokens) == (220, 110)


def test_resolving_or_catching_up_a_turn_touches_only_that_run_s_holds() -> None:
    b = book(tokens=100_000)
    for run in ("r1", "r2"):
        assert b.admit(run, "ns", run, now=NOW) is None
    b.put_hold("r1:0/a", answered("r1", 0, "a", 100, "0.001"))
    b.put_hold("r1:0/b", answered("r1", 0, "b", 120, "0.0012"))
    b.put_hold("r1:0", answered("r1", 0, "c", 90, "0.0009"))
    b.put_hold("r2:0", answered("r2", 0, "a", 70, "0.0007"))
    assert b.resolve_turn("r1", 0, committer="c") == 2  # a's and b's calls lost the commit
    assert list(b.holds) == ["r2:0"]
    assert (b.used_tokens, b.abandoned_tokens) == (220, 220)
    b.put_hold("r1:1", hold("r1", 1, 1_000, "0.01", owner="c"))
    b.catch_up("r1", turn=1, tokens=400, cost_usd=Decimal("0.004"), now=NOW)
    assert list(b.holds) == ["r2:0"]  # r2's turn 0 is not r1's to drop


def test_a_progress_record_keeps_the_hold_at_its_worst_case_and_an_answer_shrinks_it() -> None:
    """While a response streams, what it delivered so far is recorded (charged if its worker
    dies) but the hold keeps the call's worst case: the rest of its allowance may still come.
    Its answer then shrinks the hold to exactly what it used; a delivery past the worst case
    (a provider counting more than it was sent) is held for all of it."""
    book = Book.new("t", TenantLimits(tokens=100_000), now=0.0)
    assert book.admit("r", "ns", "r", now=0.0) is None
    assert book.reserve("r:0", Hold("r", 0, 1_000, Decimal("0.01"), 60.0, "a"), now=1.0) is None
    assert book.record_spend(
        "r:0", owner="a", tokens=300, cost_usd=Decimal("0.003"), answered=False
    )
    hold = book.holds["r:0"]
    assert (hold.tokens, hold.cost_usd, hold.spent_tokens, hold.recorded) == (
        1_000,
        Decimal("0.01"),
        300,
        True,
    )
    assert (book.reserved_tokens, book.reserved_cost) == (1_000, Decimal("0.01"))
    assert book.record_spend(
        "r:0", owner="a", tokens=1_200, cost_usd=Decimal("0.02"), answered=False
    )
    assert (book.reserved_tokens, book.holds["r:0"].tokens) == (1_200, 1_200)
    assert book.record_spend("r:0", owner="a", tokens=700, cost_usd=Decimal("0.007"))
    assert (book.reserved_tokens, book.holds["r:0"].tokens) == (700, 700)
    assert not book.record_spend("r:0", owner="b", tokens=1, cost_usd=Decimal(0), answered=False)


def test_a_slot_s_start_tells_a_run_s_lives_apart_and_moves_to_a_new_window() -> None:
    """``slot_since``: when the run's slot's charge starts in this window — its admission, or
    the window's start for a slot older than the window — and ``None`` for a run holding no
    slot; a rerun (freed, then admitted again later) starts later, which is what tells the
    sweep's repair of the first life from the new one."""
    b = book(max_concurrent_runs=2)
    assert b.slot_since("r1") is None
    assert b.admit("r1", "ns", "n", now=NOW) is None
    assert b.slot_since("r1") == NOW
    b.close("r1", turn=-1, tokens=0, cost_usd=Decimal(0), end=NOW + 5, now=NOW + 5)
    assert b.slot_since("r1") is None
    b.forget_end("r1")
    assert b.admit("r1", "ns", "n", now=NOW + 9) is None
    assert b.slot_since("r1") == NOW + 9
    b.roll(T0 + DAY + 60)
    assert b.slot_since("r1") == T0 + DAY
    assert b.since_of(b.active["r1"]) == T0 + DAY


def test_a_slot_names_the_life_it_was_admitted_for_once() -> None:
    """``name_life``: a slot just admitted (or one an earlier release took) is named the
    run's life; a slot already named keeps its life (an admission done again is the same
    life's); a run holding no slot, or a life not known, names nothing."""
    b = book(max_concurrent_runs=2)
    b.name_life("r1", 3)  # no slot: nothing to name
    assert b.active_of("r1") is None
    assert b.admit("r1", "ns", "n", now=NOW) is None
    assert b.active["r1"].life is None
    b.name_life("r1", None)
    assert b.active["r1"].life is None
    b.name_life("r1", 1)
    assert b.active["r1"].life == 1
    b.name_life("r1", 2)
    assert b.active["r1"].life == 1


NO_SLOT = "no slot"

LIVES = {
    "no-slot": (NO_SLOT, 0, False),
    "slot-of-a-later-life": (2, 1, True),
    "slot-of-the-same-life": (1, 1, False),
    "slot-of-an-earlier-life": (0, 1, False),
    "slot-life-not-known": (None, 1, False),
    "caller-life-not-known": (2, None, False),
}


@pytest.mark.parametrize(("slot", "named", "later"), LIVES.values(), ids=LIVES.keys())
def test_only_a_slot_of_a_known_later_life_is_a_rerun_s(
    slot: int | str | None, named: int | None, later: bool
) -> None:
    """``later_life``: what a run's earlier life does by its uid (its close, its release, a
    stale delivery) must leave a rerun's slot alone, and a stale delivery is refused
    ``TurnCommitted`` (``earlier_life``); a slot or a caller that names no life is taken for
    the same life (what the ledger did before it kept lives)."""
    b = book()
    if slot != NO_SLOT:
        assert b.admit("r1", "ns", "n", now=NOW) is None
        b.name_life("r1", slot if isinstance(slot, int) else None)
    assert b.later_life("r1", named) is later
    stale = b.earlier_life("r1", named)
    if later:
        assert stale == BudgetRefusal(
            TURN_COMMITTED,
            None,
            f"run r1 runs again as a later life than {named}: this delivery is stale",
        )
    else:
        assert stale is None
