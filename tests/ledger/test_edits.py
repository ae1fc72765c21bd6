"""Editing an AgentTenant keeps what its budget means (``Book.set_limits``): a new window
length applies from the end of the current window (whose use stays charged until it ends),
later windows have the new length, aligned to the epoch (the first one may be shorter);
changing limits never changes ``used``. The entry carries its window's end through its JSON,
reads entries written without it, and the rollback floor holds the end too."""

from __future__ import annotations

import json
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun.ledger import Book, TenantLimits, UsageFloor, codec

HOUR = 3_600.0
DAY = 24 * HOUR
T0 = 19_675 * DAY
"""2023-11-14 00:00:00 UTC: the start of a 24h window."""


def charged(*, window_seconds: float, at: float, tokens: int = 500, limit: int = 1_000) -> Book:
    """A book made at ``at`` that has used ``tokens`` (cost 0.5, wall 30 s) of ``limit``."""
    b = Book.new("acme", TenantLimits(tokens=limit, window_seconds=window_seconds), now=at)
    b.used_tokens, b.used_cost, b.used_wall = tokens, Decimal("0.5"), 30.0
    return b


def used(b: Book) -> tuple[int, Decimal, float]:
    return b.used_tokens, b.used_cost, b.used_wall


# --------------------------------------------------------------------------- the window length


def test_shortening_keeps_the_current_window_and_its_use_until_it_ends() -> None:
    b = charged(window_seconds=DAY, at=T0 + 10 * HOUR)
    b.set_limits(TenantLimits(tokens=1_000, window_seconds=HOUR), now=T0 + 10 * HOUR + 30)
    assert (b.window, b.reset_time) == (T0, T0 + DAY)
    assert used(b) == (500, Decimal("0.5"), 30.0)
    assert b.roll(T0 + DAY - 1) is False  # 1h windows would have rolled 13 times by now
    assert b.used_tokens == 500
    assert b.roll(T0 + DAY) is True
    assert (b.window, b.reset_time, b.used_tokens) == (T0 + DAY, T0 + DAY + HOUR, 0)
    b.used_tokens = 7
    assert b.roll(T0 + DAY + HOUR + 5) is True  # from now on: 1h windows, aligned
    assert (b.window, b.reset_time, b.used_tokens) == (T0 + DAY + HOUR, T0 + DAY + 2 * HOUR, 0)


def test_lengthening_keeps_the_current_end_then_a_shorter_window_aligns_to_the_new_length() -> None:
    b = charged(window_seconds=HOUR, at=T0 + 10 * HOUR + 1_800)
    b.set_limits(TenantLimits(tokens=1_000, window_seconds=DAY), now=T0 + 10 * HOUR + 1_900)
    assert (b.window, b.reset_time, b.used_tokens) == (T0 + 10 * HOUR, T0 + 11 * HOUR, 500)
    assert b.roll(T0 + 11 * HOUR - 0.5) is False
    assert b.roll(T0 + 11 * HOUR) is True
    # the first 24h window runs 11:00 → 00:00 (13 h), so the next starts at midnight UTC
    assert (b.window, b.reset_time, b.used_tokens) == (T0 + 11 * HOUR, T0 + DAY, 0)
    b.used_tokens = 9
    assert b.roll(T0 + 20 * HOUR) is False
    assert b.used_tokens == 9
    assert b.roll(T0 + DAY) is True
    assert (b.window, b.reset_time) == (T0 + DAY, T0 + 2 * DAY)


def test_a_length_that_does_not_divide_the_old_one_aligns_after_a_short_first_window() -> None:
    b = charged(window_seconds=DAY, at=T0 + 10 * HOUR)
    b.set_limits(TenantLimits(tokens=1_000, window_seconds=7 * HOUR), now=T0 + 10 * HOUR)
    assert b.reset_time == T0 + DAY
    assert b.roll(T0 + DAY + 1) is True
    first_aligned = (int((T0 + DAY) // (7 * HOUR)) + 1) * 7 * HOUR
    assert (b.window, b.reset_time) == (T0 + DAY, first_aligned)
    assert 0 < b.reset_time - b.window < 7 * HOUR
    b.roll(first_aligned)
    assert (b.window, b.reset_time) == (first_aligned, first_aligned + 7 * HOUR)
    assert b.window % (7 * HOUR) == 0


def test_a_window_that_ended_before_the_edit_rolls_under_the_old_length_first() -> None:
    b = charged(window_seconds=HOUR, at=T0 + 10 * HOUR)
    b.set_limits(TenantLimits(tokens=1_000, window_seconds=DAY), now=T0 + 12 * HOUR + 60)
    # nothing touched the book since 11:00; the window holding the edit is 12:00–13:00
    assert (b.window, b.reset_time, b.used_tokens) == (T0 + 12 * HOUR, T0 + 13 * HOUR, 0)


def test_a_roll_long_after_the_end_starts_the_aligned_window_holding_now() -> None:
    b = charged(window_seconds=DAY, at=T0 + HOUR)
    b.set_limits(TenantLimits(tokens=1_000, window_seconds=HOUR), now=T0 + HOUR)
    assert b.roll(T0 + DAY + 5 * HOUR + 10) is True
    assert (b.window, b.reset_time) == (T0 + DAY + 5 * HOUR, T0 + DAY + 6 * HOUR)


def test_an_active_run_is_charged_wall_clock_from_the_start_of_the_first_shorter_window() -> None:
    b = charged(window_seconds=HOUR, at=T0 + 10 * HOUR)
    b.admit("r1", "ns", "r1", now=T0 + 10 * HOUR + 100)
    b.set_limits(TenantLimits(tokens=1_000, window_seconds=DAY), now=T0 + 10 * HOUR + 200)
    b.roll(T0 + 11 * HOUR + 60)
    assert b.active["r1"].since == T0 + 11 * HOUR
    assert b.wall_used(T0 + 11 * HOUR + 60) == 60.0


def test_editing_back_before_the_end_changes_nothing_that_was_charged() -> None:
    b = charged(window_seconds=DAY, at=T0 + HOUR)
    b.set_limits(TenantLimits(tokens=1_000, window_seconds=HOUR), now=T0 + 2 * HOUR)
    b.set_limits(TenantLimits(tokens=1_000, window_seconds=DAY), now=T0 + 3 * HOUR)
    assert (b.window, b.reset_time, b.used_tokens) == (T0, T0 + DAY, 500)
    b.roll(T0 + DAY)
    assert (b.window, b.reset_time) == (T0 + DAY, T0 + 2 * DAY)


# --------------------------------------------------------------------------- the limits


def test_lowering_a_limit_below_used_exhausts_the_tenant_and_keeps_used() -> None:
    b = charged(window_seconds=DAY, at=T0 + HOUR)
    b.set_limits(TenantLimits(tokens=400, window_seconds=DAY), now=T0 + 2 * HOUR)
    assert used(b) == (500, Decimal("0.5"), 30.0)
    refusal = b.exhausted(T0 + 2 * HOUR)
    assert refusal is not None and refusal.resource == "tokens"
    assert b.admit("r1", "ns", "r1", now=T0 + 2 * HOUR) == refusal


def test_raising_a_limit_frees_room_at_once() -> None:
    b = charged(window_seconds=DAY, at=T0 + HOUR, tokens=1_000)
    assert b.exhausted(T0 + HOUR) is not None
    b.set_limits(TenantLimits(tokens=1_500, window_seconds=DAY), now=T0 + 2 * HOUR)
    assert b.exhausted(T0 + 2 * HOUR) is None
    assert b.admit("r1", "ns", "r1", now=T0 + 2 * HOUR, need_tokens=500) is None
    assert b.admit("r2", "ns", "r2", now=T0 + 2 * HOUR, need_tokens=1) is not None
    assert (b.used_tokens, b.reset_time) == (1_000, T0 + DAY)


def test_limits_of_every_resource_leave_used_and_the_window_alone() -> None:
    b = charged(window_seconds=DAY, at=T0 + HOUR)
    edited = TenantLimits(
        tokens=None, cost_usd=Decimal("0.1"), wall_seconds=5.0, max_concurrent_runs=1
    )
    b.set_limits(edited, now=T0 + 2 * HOUR)
    assert (b.limits, used(b), b.window, b.reset_time) == (
        edited,
        (500, Decimal("0.5"), 30.0),
        T0,
        T0 + DAY,
    )


# --------------------------------------------------------------------------- the JSON


def test_the_end_of_an_edited_window_survives_encode_and_decode() -> None:
    b = charged(window_seconds=DAY, at=T0 + HOUR)
    b.set_limits(TenantLimits(tokens=1_000, window_seconds=HOUR), now=T0 + 2 * HOUR)
    again = codec.decode_book(codec.encode_book(b))
    assert (again.window, again.reset_time, again.limits.window_seconds) == (T0, T0 + DAY, HOUR)
    assert again == b


def test_an_entry_written_without_an_end_ends_one_length_after_its_start() -> None:
    b = charged(window_seconds=HOUR, at=T0 + 5 * HOUR)
    raw = json.loads(codec.encode_book(b))
    del raw["end"]
    old = codec.decode_book(json.dumps(raw).encode())
    assert (old.window, old.reset_time) == (T0 + 5 * HOUR, T0 + 6 * HOUR)


def test_an_entry_whose_end_is_not_after_its_start_ends_one_length_after_it() -> None:
    b = charged(window_seconds=HOUR, at=T0 + 5 * HOUR)
    raw = json.loads(codec.encode_book(b))
    raw["end"] = raw["window"]
    assert codec.decode_book(json.dumps(raw).encode()).reset_time == T0 + 6 * HOUR


# --------------------------------------------------------------------------- the floor


def edited_book() -> Book:
    """Used 500 in the 24h window from T0, edited to 1h windows: it ends at T0 + 24h."""
    b = charged(window_seconds=DAY, at=T0 + HOUR)
    b.set_limits(TenantLimits(tokens=1_000, window_seconds=HOUR), now=T0 + 2 * HOUR)
    return b


FLOOR = UsageFloor(T0, 500, Decimal("0.5"), 30.0, end=T0 + DAY)


def test_an_edited_window_and_the_short_first_window_after_it_are_no_rollback() -> None:
    b = edited_book()
    assert not b.undercuts(FLOOR, now=T0 + 3 * HOUR)  # its start is not aligned to 1h's: fine
    b.roll(T0 + DAY + 60)
    assert not b.undercuts(FLOOR, now=T0 + DAY + 60)
    lengthened = charged(window_seconds=HOUR, at=T0 + 10 * HOUR)
    lengthened.set_limits(TenantLimits(window_seconds=DAY), now=T0 + 10 * HOUR)
    floor = UsageFloor(T0 + 10 * HOUR, 500, Decimal("0.5"), 30.0, end=T0 + 11 * HOUR)
    lengthened.roll(T0 + 11 * HOUR + 1)  # 11:00 → 00:00, not aligned to 24h
    assert not lengthened.undercuts(floor, now=T0 + 11 * HOUR + 1)


def test_a_window_begun_before_the_floors_window_ended_is_a_rollback_and_is_undone() -> None:
    b = edited_book()
    b.window, b.end, b.used_tokens = T0 + 3 * HOUR, T0 + 4 * HOUR, 0  # a forged early roll
    assert b.undercuts(FLOOR, now=T0 + 3 * HOUR + 1)
    b.restore(FLOOR, now=T0 + 3 * HOUR + 1)
    assert (b.window, b.reset_time, used(b)) == (T0, T0 + DAY, (500, Decimal("0.5"), 30.0))
    assert not b.undercuts(FLOOR, now=T0 + 3 * HOUR + 1)


def test_an_end_moved_within_the_floors_window_is_a_rollback_and_is_put_back() -> None:
    b = edited_book()
    b.end = T0 + 3 * HOUR  # the next roll would start a new window at 03:00
    assert b.undercuts(FLOOR, now=T0 + 2 * HOUR)
    b.restore(FLOOR, now=T0 + 2 * HOUR)
    assert (b.window, b.reset_time, b.used_tokens) == (T0, T0 + DAY, 500)


def test_a_rollback_found_after_the_floors_window_ended_rolls_on_from_it() -> None:
    b = edited_book()
    b.window, b.end = T0 - DAY, T0  # moved back
    assert b.undercuts(FLOOR, now=T0 + DAY + 10)
    b.restore(FLOOR, now=T0 + DAY + 10)
    assert (b.window, b.reset_time, b.used_tokens) == (T0 + DAY, T0 + DAY + HOUR, 0)


def test_a_floor_keeps_the_first_end_it_saw_for_its_window() -> None:
    floor = UsageFloor(T0, 1, end=T0 + DAY)
    assert floor.raised(T0, 2, Decimal(0), 0.0, end=T0 + HOUR).end == T0 + DAY
    assert UsageFloor(T0).raised(T0, 2, Decimal(0), 0.0, end=T0 + HOUR).end == T0 + HOUR
    assert floor.raised(T0 + DAY, 0, Decimal(0), 0.0, end=T0 + 2 * DAY).end == T0 + 2 * DAY


# --------------------------------------------------------------------------- the rule, at random

lengths = st.sampled_from([1.0, 60.0, 7 * 60.0, HOUR, 7 * HOUR, DAY, 7 * DAY])


@settings(max_examples=300, deadline=None)
@given(
    first=lengths,
    steps=st.lists(
        st.tuples(st.floats(0, 3 * DAY), st.one_of(st.none(), lengths), st.integers(0, 50)),
        max_size=25,
    ),
)
def test_edits_never_zero_or_move_a_window_and_later_windows_align(
    first: float, steps: list[tuple[float, float | None, int]]
) -> None:
    now = T0 + 1_234.5
    b = Book.new("acme", TenantLimits(window_seconds=first), now=now)
    for wait, length, spend in steps:
        now += wait
        before, rolled_with = (b.window, b.end, b.used_tokens), b.limits.window_seconds
        if length is not None:
            b.set_limits(TenantLimits(window_seconds=length), now=now)
        else:
            b.roll(now)
        assert b.window <= now < b.end
        if now < before[1]:  # the window had not ended: nothing moves, nothing is erased
            assert (b.window, b.end, b.used_tokens) == before
        else:  # a new window (the length in force rolls it, then an edit takes effect):
            # from the old end at the earliest, ending on a boundary of that length
            assert b.window >= before[1] and b.used_tokens == 0
            assert b.end % rolled_with == 0
            assert b.window == before[1] or b.window % rolled_with == 0
            assert b.end - b.window <= rolled_with
        b.used_tokens += spend
        assert codec.decode_book(codec.encode_book(b)) == b


def test_a_floor_of_whole_seconds_from_the_status_is_no_rollback_of_a_sub_second_window() -> None:
    b = Book.new("acme", TenantLimits(window_seconds=1.5), now=T0 + 0.75)  # 1.5 s windows
    b.roll(T0 + 2.0)
    assert (b.window, b.end) == (T0 + 1.5, T0 + 3.0)
    truncated = UsageFloor(T0 + 1.0, 0, Decimal(0), 0.0, end=T0 + 3.0)  # 1.5 s shown as 1 s
    assert not b.undercuts(truncated, now=T0 + 2.0)
    older = UsageFloor(T0, 0, Decimal(0), 0.0, end=T0 + 1.0)  # the window before, truncated
    assert not b.undercuts(older, now=T0 + 2.0)
    b.used_tokens = 5
    b.restore(UsageFloor(T0 + 1.0, 9, Decimal(0), 0.0, end=T0 + 3.0), now=T0 + 2.0)
    assert (b.window, b.end, b.used_tokens) == (T0 + 1.5, T0 + 3.0, 9)
