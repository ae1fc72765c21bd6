"""The event throttle: one event per occasion per interval, a token bucket over all."""

from __future__ import annotations

from agentrun.operator.platform.events import Throttle, standard_throttle


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


def test_a_namespace_that_floods_uses_up_its_own_share_not_another_namespaces() -> None:
    throttle = Throttle(
        repeat_after=60.0, rate=10.0, burst=100, namespace_rate=2.0, namespace_burst=25
    )
    flood = [throttle.allow(("a", n), 0.0, namespace="a") for n in range(200)]
    assert flood.count(True) == 25 and flood[:25] == [True] * 25
    assert all(throttle.allow(("b", n), 0.0, namespace="b") for n in range(25))
    assert throttle.allow(("cluster", 1), 0.0)  # cluster-scoped objects: a share of their own
    assert throttle.allow(("a", 1000), 0.5, namespace="a")  # half a second at 2/s: one back
    assert not throttle.allow(("a", 1001), 0.5, namespace="a")


def test_the_overall_bucket_still_bounds_many_namespaces_together() -> None:
    throttle = Throttle(
        repeat_after=60.0, rate=1.0, burst=10, namespace_rate=1.0, namespace_burst=4
    )
    allowed = [throttle.allow((ns, n), 0.0, namespace=ns) for ns in "abcd" for n in range(4)]
    assert allowed.count(True) == 10
    assert not throttle.allow(("e", 0), 0.0, namespace="e")  # its own bucket is full: not enough


def test_namespaces_remembered_are_bounded_and_a_forgotten_one_starts_full() -> None:
    throttle = Throttle(
        repeat_after=0.0, rate=1000.0, burst=1000, namespace_rate=0.0, namespace_burst=1, memory=2
    )
    assert throttle.allow("a1", 0.0, namespace="a")
    assert not throttle.allow("a2", 0.0, namespace="a")  # its one token is spent, no refill
    assert throttle.allow("b1", 0.0, namespace="b") and throttle.allow("c1", 0.0, namespace="c")
    assert throttle.allow("a3", 0.0, namespace="a")  # forgotten (the oldest of three): full


def test_the_operator_gives_a_namespace_a_share_below_the_whole() -> None:
    throttle = standard_throttle()
    assert throttle.namespace_burst < throttle.burst and throttle.namespace_rate < throttle.rate


def test_the_operator_s_throttle_is_once_a_minute_2_a_second_a_namespace_10_in_all() -> None:
    """The defaults the docs state (docs/architecture.md, "Kubernetes Events"), checked by what
    the throttle does, not by reading its fields: an occasion once a minute; a namespace 2 a
    second, 25 at once; all namespaces 10 a second, 100 at once."""
    throttle = standard_throttle()
    assert throttle.allow(("run", "Queued"), 0.0, namespace="a")
    assert not throttle.allow(("run", "Queued"), 59.9, namespace="a")
    assert throttle.allow(("run", "Queued"), 60.0, namespace="a")  # once a minute per occasion
    burst = [throttle.allow(("a", n), 60.0, namespace="a") for n in range(30)]
    assert burst == [True] * 24 + [False] * 6  # 25 at once (one went to the repeat above)
    assert [throttle.allow(("a2", n), 60.5, namespace="a") for n in range(2)] == [True, False]
    everyone = [throttle.allow((ns, n), 200.0, namespace=ns) for ns in "abcde" for n in range(25)]
    assert everyone == [True] * 100 + [False] * 25  # 100 at once over all namespaces
