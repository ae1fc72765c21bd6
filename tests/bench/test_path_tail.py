"""``bench_path.py``'s arithmetic over the probe's marks: each step's percentiles, and which
step slowed the slowest turns."""

from __future__ import annotations

import bench_path
import pytest

STEPS = (
    ("delivery", "stored", "received"),
    ("reservation", "received", "reserved"),
    ("model", "reserved", "arrival"),
)


def turn(at: float, *, delivery: float = 0.5, reservation: float = 0.6) -> dict[str, float]:
    """One turn's marks (epoch seconds) with its steps' durations in milliseconds (the model's
    step 3 ms, always the longest in time: the slowing is measured against each step's own
    median, not in time)."""
    received = at + delivery / 1000
    reserved = received + reservation / 1000
    return {
        "committed": at,
        "stored": at,
        "received": received,
        "reserved": reserved,
        "arrival": reserved + 0.003,
    }


def test_each_step_has_its_p50_p90_p99_over_the_turns_that_reached_both_marks() -> None:
    marks = {seq: turn(seq, delivery=float(seq)) for seq in range(1, 101)}
    marks[101] = {"committed": 101.0, "stored": 101.0}  # never delivered: not a sample
    rows = bench_path.step_figures(marks, STEPS)
    assert rows["delivery"]["samples"] == 100
    assert rows["delivery"]["p50_ms"] == pytest.approx(50.5)
    assert rows["delivery"]["p99_ms"] == pytest.approx(99.01)
    assert rows["reservation"]["p90_ms"] == pytest.approx(0.6)


def test_the_slowest_turns_name_the_step_that_slowed_each_most() -> None:
    marks = {seq: turn(seq) for seq in range(20)}
    marks[20] = turn(20, delivery=4.0)  # 3.5 ms above the delivery's median
    marks[21] = turn(21, reservation=2.5, delivery=1.0)  # 1.9 above, against 0.5 (model: 0)
    marks[22] = {"committed": 22.0, "stored": 22.0}  # no whole path: not a candidate
    slow = bench_path.slowest_turns(marks, STEPS, part=0.1)  # 22 paths: the slowest 2
    assert slow["turns"] == 2
    assert slow["slowed_most"] == {"delivery": 1, "reservation": 1}
    assert slow["steps_ms"]["delivery"] == pytest.approx(2.5)  # the median of 4.0 and 1.0
    assert slow["path_ms"] == pytest.approx((7.6 + 6.5) / 2)


def test_no_whole_path_gives_no_slowest_turns() -> None:
    assert bench_path.slowest_turns({1: {"committed": 1.0}}, STEPS, part=0.05) == {}
