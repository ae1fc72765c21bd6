"""The event throttle: one event per occasion per interval, a token bucket over all."""

from __future__ import annotations

from agentrun.operator.platform.events import Throttle


def test_the_same_occasion_is_posted_once_per_interval() -> None:
    throttle = Throttle(repeat_after=60.0, rate=100.0, burst=100)
    assert throttle.allow(("run", "Queued"), 0.0)
    assert not throttle.allow(("run", "Queued"), 59.9)
    assert throttle.allow(("run", "Admitted"), 59.9)
    assert throttle.allow(("run", "Queued"), 60.0)


def test_a_burst_of_distinct_occasions_is_cut_at_the_bucket_and_refills_at_the_rate() -> None:
    throttle = Throttle(repeat_after=60.0, rate=2.0, burst=5)
    allowed = [throttle.allow(("run", n), 10.0) for n in range(8)]
    assert allowed == [True] * 5 + [False] * 3
    assert throttle.allow(("run", 100), 10.5)  # half a second: one token back
    assert not throttle.allow(("run", 101), 10.5)
    assert [throttle.allow(("run", 200 + n), 20.0) for n in range(6)] == [True] * 5 + [False]


def test_a_refused_occasion_is_not_remembered_as_posted() -> None:
    throttle = Throttle(repeat_after=60.0, rate=1.0, burst=1)
    assert throttle.allow("a", 0.0)
    assert not throttle.allow("b", 0.0)  # no token
    assert throttle.allow("b", 1.0)  # not held back by the interval: it was never posted


def test_memory_is_bounded() -> None:
    throttle = Throttle(repeat_after=60.0, rate=1000.0, burst=1000, memory=3)
    for key in "abcd":
        assert throttle.allow(key, 0.0)
    assert throttle.allow("a", 1.0)  # forgotten, the oldest of four
    assert not throttle.allow("d", 1.0)
