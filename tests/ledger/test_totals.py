"""A tenant's totals as sums over its runs' entries (``BookState``): ``totals_mismatch`` names
every total that disagrees with the entries, ``recount`` makes them agree (a ledger made anew
over the run entries a lost totals value left behind), ``seed`` starts a book made anew from
what the operator saw, and ``forgettable`` names the runs whose every memory has expired.
Pure; the store's use of them is tested on a real nats-server (``test_rebuild_seed.py``,
``test_layout.py``)."""

from __future__ import annotations

from decimal import Decimal

from agentrun.ledger import Active, Book, Hold, TenantLimits, codec
from agentrun.ledger.entries import (
    FIRST_WAITERS,
    MAX_ACTIVE_RUNS,
    RunEntry,
    Seed,
    UsageFloor,
    Waiter,
    run_of,
)
from agentrun.ledger.state import CLOCK_SKEW

HOUR = 3_600.0
T0 = 1_700_000_000.0 - 1_700_000_000.0 % HOUR
LIMITS = TenantLimits(tokens=10_000, window_seconds=HOUR)


def consistent() -> Book:
    """Two active runs (one admitted in an earlier window) with holds, and waiting calls."""
    b = Book(tenant="acme", limits=LIMITS, window=T0)
    b.start_run("r1", Active("ns", "one", T0 + 30.0))
    b.start_run("r2", Active("ns", "two", T0 - 500.0))  # charged from the window's start
    b.put_hold("r1:0", Hold("r1", 0, 300, Decimal("0.03"), T0 + 90.0, "w1"))
    b.put_hold("r2:4", Hold("r2", 4, 200, Decimal("0.02"), T0 + 90.0, "w2"))
    for i in range(FIRST_WAITERS + 2):
        b.put_waiter(f"q{i}:0", Waiter(T0 + 100.0 - i, 10, Decimal("0.001"), T0 + 200.0))
    return b


def test_totals_kept_by_the_operations_match_their_entries() -> None:
    b = consistent()
    assert b.totals_mismatch() == []
    assert (b.reserved_tokens, b.reserved_cost, b.active_runs, b.since_offsets) == (
        500, Decimal("0.05"), 2, 30.0
    )  # fmt: skip


def test_each_total_that_disagrees_with_the_entries_is_named_with_both_values() -> None:
    b = consistent()
    b.reserved_tokens += 1
    b.reserved_cost = Decimal("0.07")
    b.active_runs = 3
    b.since_offsets = 31.0
    b.first_waiters["ghost:0"] = Waiter(T0, 1, Decimal(0), T0 + 1.0)
    assert b.totals_mismatch() == [
        "reserved_tokens: totals 501, entries 500",
        "reserved_cost: totals 0.07, entries 0.05",
        "active_runs: totals 3, entries 2",
        "since_offsets: totals 31.0, entries 30.0",
        "first_waiters not in their runs' entries: ['ghost:0']",
    ]


def test_offsets_within_float_noise_are_not_a_mismatch() -> None:
    b = consistent()
    b.since_offsets += 1e-7
    assert b.totals_mismatch() == []
    b.since_offsets += 1e-5
    assert len(b.totals_mismatch()) == 1
    b.since_offsets -= 1e-5 - 1.5e-6  # the noise allowed grows with the runs: 1e-6 each
    assert b.totals_mismatch() == []
    one = Book(tenant="acme", limits=LIMITS, window=T0)
    one.start_run("r", Active("ns", "r", T0 + 3.0))
    one.since_offsets += 1.5e-6
    assert len(one.totals_mismatch()) == 1


def test_recount_sets_every_total_to_the_sums_over_the_entries_and_the_oldest_waiters() -> None:
    b = consistent()
    lost = Book(tenant="acme", limits=LIMITS, window=T0)  # totals gone, entries left
    for uid, entry in b.runs.items():
        lost.load(uid, entry)
    assert lost.totals_mismatch() != []
    lost.recount()
    assert lost.totals_mismatch() == []
    assert (lost.reserved_tokens, lost.reserved_cost) == (500, Decimal("0.05"))
    assert (lost.active_runs, lost.since_offsets) == (2, 30.0)
    oldest = [f"q{i}:0" for i in range(FIRST_WAITERS + 1, 1, -1)]
    assert list(lost.first_waiters) == oldest and lost.first_waiters == b.first_waiters
    idle = Book(tenant="acme", limits=LIMITS, window=T0, reserved_cost=Decimal("0.5"))
    idle.recount()
    assert b'"reserved":{"tokens":0,"costUSD":"0"}' in codec.encode_book(idle)


def test_a_seed_of_this_window_raises_used_and_takes_its_runs_slots() -> None:
    b = Book(tenant="acme", limits=LIMITS, window=T0)
    b.used_tokens, b.used_cost, b.used_wall = 100, Decimal("0.5"), 50.0
    b.start_run("kept", Active("ns", "kept", T0 + 5.0, 3, 70, Decimal("0.07")))
    floor = UsageFloor(T0, tokens=400, cost_usd=Decimal("0.2"), wall_seconds=80.0)
    b.seed(
        Seed(floor, {
            "kept": Active("ns", "kept", T0 + 1.0, -1, 10, Decimal("0.01")),
            "old": Active("ns", "old", T0 - 900.0, -1, 250, Decimal("0.25")),
        })
    )  # fmt: skip
    assert (b.used_tokens, b.used_cost, b.used_wall) == (400, Decimal("0.5"), 80.0)
    assert b.active_of("kept") == Active("ns", "kept", T0 + 5.0, 3, 70, Decimal("0.07"))
    assert b.active_of("old") == Active("ns", "old", T0, -1, 250, Decimal("0.25"))
    assert (b.active_runs, b.since_offsets) == (2, 5.0)
    assert b.totals_mismatch() == []


def test_a_seed_of_another_window_changes_nothing() -> None:
    b = Book(tenant="acme", limits=LIMITS, window=T0)
    b.seed(Seed(UsageFloor(T0 - HOUR, tokens=400), {"r": Active("ns", "r", T0 - 10.0)}))
    assert (b.used_tokens, b.active_runs, b.runs) == (0, 0, {})


def test_only_runs_holding_nothing_but_expired_memories_are_forgettable() -> None:
    now = T0 + 1_000.0
    b = Book(tenant="acme", limits=LIMITS, window=T0)
    b.load("ended-past", RunEntry(ended=now - 1.0))
    b.load("ended-now", RunEntry(ended=now))
    b.load("charged-now", RunEntry(charged={"charged-now:1/w": now}))
    b.load("ended-later", RunEntry(ended=now + 1.0))
    b.load("charged-past", RunEntry(charged={"charged-past:1/w": now - 5.0}))
    b.load("charged-one-later", RunEntry(charged={"c:1/w": now - 5.0, "c:2/w": now + 5.0}))
    b.load("ended-and-charged", RunEntry(ended=now - 9.0, charged={"e:1/w": now - 1.0}))
    b.load("nothing", RunEntry())
    b.start_run("active", Active("ns", "active", T0))
    b.load("holding", RunEntry(ended=now - 1.0))
    b.put_hold("holding:2", Hold("holding", 2, 1, Decimal(0), now + 60.0, "w"))
    b.load("waiting", RunEntry(ended=now - 1.0))
    b.put_waiter("waiting:3", Waiter(now - 2.0, 1, Decimal(0), now + 8.0))
    assert sorted(b.forgettable(now)) == [
        "charged-now", "charged-past", "ended-and-charged", "ended-now", "ended-past"
    ]  # fmt: skip


# ------------------------------------------------- charged as abandoned, and taken back


def test_an_answered_call_charged_as_abandoned_is_remembered_and_taken_back_once() -> None:
    b = Book(tenant="acme", limits=LIMITS, window=T0)
    b.used_tokens, b.used_cost = 1_000, Decimal("1")
    b.credited_tokens, b.credited_cost = 3, Decimal("0.003")  # taken back earlier
    b.start_run("r", Active("ns", "r", T0))
    answered = Hold("r", 3, 500, Decimal("0.5"), T0 + 60.0, "w1", spent_tokens=120,
                    spent_cost=Decimal("0.12"), recorded=True)  # fmt: skip
    b.charge_dropped(answered)
    memo = "r:3/w1"
    assert b.runs["r"].charged == {memo: T0 + 60.0 + 3_600.0}
    assert b.runs["r"].spent == {memo: (120, Decimal("0.12"))}
    assert (b.used_tokens, b.used_cost) == (1_120, Decimal("1.12"))
    assert (b.abandoned_tokens, b.abandoned_cost) == (120, Decimal("0.12"))
    assert b.uncharge(memo) is True
    assert (b.used_tokens, b.used_cost) == (1_000, Decimal("1.00"))
    assert (b.abandoned_tokens, b.abandoned_cost) == (0, Decimal("0.00"))
    assert (b.credited_tokens, b.credited_cost) == (123, Decimal("0.123"))
    assert b.runs["r"].spent == {} and memo in b.runs["r"].charged  # still remembered charged
    assert b.uncharge(memo) is False and b.used_tokens == 1_000  # once


def test_nothing_is_taken_back_for_an_ended_run_an_unknown_call_or_an_unanswered_one() -> None:
    b = Book(tenant="acme", limits=LIMITS, window=T0)
    b.start_run("r", Active("ns", "r", T0))
    b.charge_dropped(Hold("r", 1, 500, Decimal("0.5"), T0 + 60.0, "w1"))  # never answered
    assert b.runs["r"].spent == {} and b.used_tokens == 0
    assert b.uncharge("r:1/w1") is False
    b.charge_dropped(Hold("r", 2, 9, Decimal(0), T0, "w1", spent_tokens=7, recorded=True))
    assert b.runs["r"].spent == {"r:2/w1": (7, Decimal(0))}  # tokens alone are a spend
    assert b.uncharge("r:2/w2") is False and b.uncharge("other:2/w1") is False
    b.close("r", turn=-1, tokens=0, cost_usd=Decimal(0), end=T0 + 5.0, now=T0 + 5.0)
    assert b.uncharge("r:2/w1") is False  # the run ended: its usage will not be charged again
    assert (b.used_tokens, b.abandoned_tokens, b.credited_tokens) == (7, 7, 0)


# ------------------------------------------------------------------- the rollback floor


def floored() -> Book:
    """An hour window from T0 that used 100 tokens, $1, 10 s, with 5 tokens / $0.5 taken back
    (so its floor figures are 105 tokens and $1.5)."""
    b = Book(tenant="acme", limits=LIMITS, window=T0)
    b.used_tokens, b.used_cost, b.used_wall = 100, Decimal("1"), 10.0
    b.credited_tokens, b.credited_cost = 5, Decimal("0.5")
    return b


SAME = UsageFloor(T0, 105, Decimal("1.5"), 10.0, T0 + HOUR)
"""The floor ``floored`` meets exactly."""


def test_an_entry_at_its_floor_does_not_undercut_it_and_one_below_in_any_figure_does() -> None:
    now = T0 + 100.0
    assert not floored().undercuts(SAME, now=now)
    assert not floored().undercuts(UsageFloor(T0, 105, Decimal("1.5"), 10.0, 0.0), now=now)
    assert not floored().undercuts(UsageFloor(T0 + 0.5, 105, end=T0 + HOUR + 0.5), now=now)
    for more in ({"tokens": 106}, {"cost_usd": Decimal("1.51")}, {"wall_seconds": 10.5}):
        floor = UsageFloor(**{"window": T0, "tokens": 0, "end": T0 + HOUR, **more})  # type: ignore[arg-type]
        assert floored().undercuts(floor, now=now), more


def test_an_entry_whose_window_has_not_begun_or_has_no_length_or_moved_its_end_undercuts() -> None:
    assert floored().undercuts(SAME, now=T0 - CLOCK_SKEW - 1.0)
    assert not floored().undercuts(SAME, now=T0 - CLOCK_SKEW)  # a writer's clock a little ahead
    assert not floored().undercuts(SAME, now=T0)
    broken = floored()
    broken.end = broken.window
    assert broken.undercuts(UsageFloor(T0), now=T0 + 1.0)  # whatever the floor says
    assert floored().undercuts(UsageFloor(T0, 0, end=T0 + HOUR + 1.0), now=T0 + 1.0)


def test_an_entry_of_another_window_undercuts_only_if_it_began_before_the_floors_ended() -> None:
    now = T0 + 100.0
    big = {"tokens": 10_000, "cost_usd": Decimal(9), "wall_seconds": 999.0}
    # the floor's window ended as this one began: a new window, whatever the floor used
    assert not floored().undercuts(UsageFloor(T0 - HOUR, end=T0, **big), now=now)  # type: ignore[arg-type]
    assert not floored().undercuts(UsageFloor(T0 - 1.0, end=T0 + 0.5, **big), now=now)  # type: ignore[arg-type]
    # it ended a second or more after this one began, or this one is the older: rolled back
    assert floored().undercuts(UsageFloor(T0 - 10.0, end=T0 + 1.0), now=now)
    assert floored().undercuts(UsageFloor(T0 + 1.0, end=T0 + HOUR), now=now)


def test_a_restore_to_another_window_takes_the_floors_window_and_use_and_clears_credits() -> None:
    b = floored()
    b.restore(UsageFloor(T0 - 1.0, 40, Decimal("0.4"), 4.0), now=T0 + 100.0)
    assert (b.window, b.end) == (T0 - 1.0, T0 - 1.0 + HOUR)  # no end known: window + length
    assert (b.used_tokens, b.used_cost, b.used_wall) == (40, Decimal("0.4"), 4.0)
    assert (b.credited_tokens, b.credited_cost) == (0, Decimal(0))


def test_a_restore_within_the_window_raises_use_past_credits_and_puts_a_moved_end_back() -> None:
    b = floored()
    b.restore(UsageFloor(T0, 110, Decimal("2"), 12.0, T0 + HOUR + 1.0), now=T0 + 100.0)
    assert (b.used_tokens, b.used_cost, b.used_wall) == (105, Decimal("1.5"), 12.0)
    assert b.end == T0 + HOUR + 1.0 and (b.credited_tokens, b.credited_cost) == (5, Decimal("0.5"))
    kept = floored()
    kept.restore(UsageFloor(T0, 1, Decimal(0), 0.0, T0 + HOUR + 0.5), now=T0 + 100.0)
    assert kept.end == T0 + HOUR  # within the second: not moved
    assert (kept.used_tokens, kept.used_cost, kept.used_wall) == (100, Decimal("1"), 10.0)


# ------------------------------------------------------------------ runs and their parts


def test_a_keys_run_is_what_comes_before_its_first_colon() -> None:
    assert run_of("r1:3") == "r1" and run_of("r1:3/worker:7") == "r1" and run_of("r1") == "r1"


def test_loading_unloading_and_restarting_a_run_keep_the_totals_right() -> None:
    b = Book(tenant="acme", limits=LIMITS, window=T0)
    b.start_run("r", Active("ns", "r", T0 + 10.0))
    b.start_run("r", Active("ns", "r", T0 + 20.0))  # taken again: one slot, the new one
    assert (b.active_runs, b.since_offsets, b.active_of("r")) == (
        1, 20.0, Active("ns", "r", T0 + 20.0)
    )  # fmt: skip
    assert b.holds_of("r") == [] and b.holds_of("unknown") == []
    b.unload("r")
    b.unload("never-loaded")
    assert b.runs == {} and b.active_runs == 1  # unloading is not ending


def test_a_run_forgotten_as_ended_is_no_longer_ended() -> None:
    b = Book(tenant="acme", limits=LIMITS, window=T0)
    b.load_end("r", T0 + 500.0)
    assert b.has_ended("r") and not b.has_ended("other")
    b.forget_end("r")
    b.forget_end("never-loaded")
    assert not b.has_ended("r") and b.runs["r"].ended == 0.0


def test_a_ledger_split_out_is_no_longer_one_value() -> None:
    b = Book.new("acme", LIMITS, now=T0, one_value=True)
    b.split_out()
    assert b.one_value is False


def test_a_one_value_ledger_holds_at_most_max_active_runs_and_a_split_one_has_no_cap() -> None:
    one = Book.new("acme", TenantLimits(window_seconds=HOUR), now=T0, one_value=True)
    for i in range(MAX_ACTIVE_RUNS - 1):
        one.start_run(f"r{i}", Active("ns", f"r{i}", T0))
    assert one.admit("last", "ns", "last", now=T0 + 1.0) is None
    refused = one.admit("over", "ns", "over", now=T0 + 1.0)
    assert refused is not None and refused.reason == "ConcurrencyLimit"
    assert refused.message == (
        f"{MAX_ACTIVE_RUNS} runs are active, the most one tenant's ledger entry holds"
    )
    one.split_out()
    assert one.admit("over", "ns", "over", now=T0 + 1.0) is None


def test_waiting_calls_stop_wherever_they_are_recorded_and_expire_at_their_expiry() -> None:
    b = Book(tenant="acme", limits=LIMITS, window=T0)
    b.put_waiter("r:0", Waiter(T0, 1, Decimal(0), T0 + 10.0))
    b.put_waiter("s:0", Waiter(T0 + 1.0, 1, Decimal(0), T0 + 20.0))
    b.unload("s")  # its entry not loaded: only the totals know it waits
    assert b.stop_waiting("s:0") is True and "s:0" not in b.first_waiters
    assert b.stop_waiting("s:0") is False
    b.drop_expired_waiters(T0 + 10.0)
    assert b.first_waiters == {} and b.waiting == {}


def test_a_roll_forgets_expired_memories_with_their_spend_and_zeroes_the_windows_use() -> None:
    b = floored()
    b.abandoned_tokens, b.abandoned_cost = 7, Decimal("0.07")
    b.load("r", RunEntry(charged={"r:1/w": T0 + 50.0, "r:2/w": T0 + 9_000.0}, ended=T0 + 60.0))
    b.runs["r"].spent = {"r:1/w": (10, Decimal("0.1")), "r:2/w": (20, Decimal("0.2"))}
    assert b.roll(T0 + 100.0) is False  # within the window: only the expired memories go
    assert b.runs["r"].charged == {"r:2/w": T0 + 9_000.0}
    assert b.runs["r"].spent == {"r:2/w": (20, Decimal("0.2"))} and b.runs["r"].ended == 0.0
    assert b.used_tokens == 100
    assert b.roll(T0 + HOUR) is True
    assert (b.window, b.end) == (T0 + HOUR, T0 + 2 * HOUR)
    assert (b.used_tokens, b.used_cost, b.used_wall) == (0, Decimal(0), 0.0)
    assert (b.abandoned_tokens, b.abandoned_cost) == (0, Decimal(0))
    assert (b.credited_tokens, b.credited_cost) == (0, Decimal(0))


def test_a_floor_keeps_the_highest_use_seen_in_its_window_and_starts_over_in_a_later_one() -> None:
    floor = UsageFloor(T0, 100, Decimal("1"), 10.0)
    assert floor.raised(T0, 90, Decimal("2"), 5.0) == UsageFloor(T0, 100, Decimal("2"), 10.0)
    assert floor.raised(T0, 90, Decimal("0"), 5.0, end=T0 + HOUR).end == T0 + HOUR
    known = UsageFloor(T0, end=T0 + HOUR)
    assert known.raised(T0, 1, Decimal(0), 0.0, end=T0 + 2 * HOUR).end == T0 + HOUR  # first known
    assert floor.raised(T0 - HOUR, 999, Decimal(9), 99.0) is floor  # an older window: ignored
    later = floor.raised(T0 + HOUR, 3, Decimal("0.03"), 0.5)
    assert later == UsageFloor(T0 + HOUR, 3, Decimal("0.03"), 0.5, 0.0)


def test_offsets_off_by_exactly_the_noise_allowed_are_no_mismatch() -> None:
    b = Book(tenant="acme", limits=LIMITS, window=T0)
    b.since_offsets = 1e-6  # no run active: the sum over the entries is exactly 0
    assert b.totals_mismatch() == []
