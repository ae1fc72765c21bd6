"""A tenant's admission queue in memory (``agentrun.ledger.queue.TenantQueue``): runs come out
oldest first by their AgentRun's creation time, runs created in the same instant in the order
they arrived, a run queued again keeps its place, and every position is 1-based. Pure (the
stored queue is tested on a real nats-server in ``tests/reconcile/admission``)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun.ledger.queue import QueuedRun, TenantQueue


def run(uid: str, at: float) -> QueuedRun:
    return QueuedRun(uid, "ns", f"name-{uid}", at)


def test_an_empty_queue_has_no_head_no_runs_and_no_positions() -> None:
    queue = TenantQueue()
    assert (len(queue), queue.head(), queue.runs(), list(queue)) == (0, None, [], [])
    assert (queue.position("a"), queue.get("a"), queue.remove("a")) == (None, None, None)
    assert "a" not in queue


def test_runs_come_out_by_creation_time_then_by_arrival() -> None:
    queue = TenantQueue()
    assert queue.add(run("late", 30.0), arrival=1) == 1
    assert queue.add(run("early", 10.0), arrival=2) == 1  # created first: ahead of "late"
    assert queue.add(run("tie-second", 20.0), arrival=4) == 2
    assert queue.add(run("tie-first", 20.0), arrival=3) == 2  # same instant, arrived earlier
    assert [r.uid for r in queue.runs()] == ["early", "tie-first", "tie-second", "late"]
    assert [r.uid for r in queue] == ["early", "tie-first", "tie-second", "late"]
    assert [queue.position(u) for u in ("early", "tie-first", "tie-second", "late")] == [1, 2, 3, 4]
    assert queue.head() == run("early", 10.0) and len(queue) == 4


def test_a_run_queued_again_keeps_its_place_and_its_first_record() -> None:
    queue = TenantQueue()
    queue.add(run("a", 10.0), arrival=1)
    queue.add(run("b", 20.0), arrival=2)
    assert queue.add(run("b", 5.0), arrival=9) == 2  # not moved ahead by a new time
    assert queue.get("b") == run("b", 20.0) and len(queue) == 2


def test_removing_a_run_moves_those_behind_it_up_and_returns_it() -> None:
    queue = TenantQueue()
    for arrival, (uid, at) in enumerate((("a", 1.0), ("b", 2.0), ("c", 3.0)), start=1):
        queue.add(run(uid, at), arrival=arrival)
    assert queue.remove("a") == run("a", 1.0)
    assert "a" not in queue and "b" in queue
    assert (queue.head(), queue.position("c"), queue.position("a")) == (run("b", 2.0), 2, None)
    assert queue.remove("a") is None
    assert queue.remove("b") == run("b", 2.0) and queue.remove("c") == run("c", 3.0)
    assert queue.head() is None and len(queue) == 0


QUEUE_OPS = st.lists(
    st.tuples(
        st.sampled_from(["add", "remove"]),
        st.sampled_from(["r0", "r1", "r2", "r3", "r4"]),
        st.sampled_from([10.0, 20.0, 30.0]),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(QUEUE_OPS)
def test_any_order_of_adds_and_removes_keeps_the_order_and_the_index_of_runs_in_step(
    ops: list[tuple[str, str, float]],
) -> None:
    """Whatever the order of adds (queued again, or anew after a removal) and removes, the
    queue's order and its index by uid agree with each other and with the rule: by creation
    time, then by arrival, a run queued again keeping its first place and record."""
    queue, model = TenantQueue(), {}
    for arrival, (op, uid, at) in enumerate(ops):
        if op == "add":
            position = queue.add(run(uid, at), arrival=arrival)
            model.setdefault(uid, (at, arrival))
            assert position == sorted(model, key=model.__getitem__).index(uid) + 1
        else:
            removed = queue.remove(uid)
            first = model.pop(uid, None)
            assert removed == (None if first is None else run(uid, first[0]))
        order = sorted(model, key=model.__getitem__)
        assert [r.uid for r in queue] == order and len(queue) == len(order)
        assert [queue.position(uid) for uid in order] == list(range(1, len(order) + 1))
        assert queue.head() == (run(order[0], model[order[0]][0]) if order else None)
        assert all((uid in queue) == (uid in model) for uid in ("r0", "r1", "r2", "r3", "r4"))
