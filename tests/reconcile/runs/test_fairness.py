"""Fair shares of the worker slots: ready turns are published while the work queue is short,
the tenant with the fewest turns in flight first, within each tenant's ``maxConcurrentTurns``;
a quiet queue publishes at once, and a failed publication keeps its place."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun.operator.runs.fairness import (
    POLL_SECONDS,
    REFRESH_SECONDS,
    Backlog,
    ReadyTurn,
    TurnGate,
    TurnQueue,
)
from agentrun.protocol import TurnRequest


def ready(tenant: str, run: str, *, turn: int = 0) -> ReadyTurn:
    return ReadyTurn(TurnRequest(run, "ns", run, turn, turn + 1), tenant, since=0.0)


def no_cap(tenant: str) -> int | None:
    return None


def drain(queue: TurnQueue, cap: Mapping[str, int] | None = None) -> list[str]:
    """Take every turn that may go, in order (their run names)."""
    order = []
    while (turn := queue.take(lambda t: (cap or {}).get(t))) is not None:
        order.append(turn.request.name)
    return order


def test_the_tenant_with_the_fewest_turns_in_flight_goes_first() -> None:
    queue = TurnQueue()
    for i in range(4):
        queue.put(ready("a", f"a{i}"))
    assert drain(queue)[:1] == ["a0"]  # alone: in the order its turns became ready
    for i in range(4, 8):
        queue.put(ready("a", f"a{i}"))
    queue.put(ready("b", "b0"))
    queue.put(ready("b", "b1"))
    # a has 4 in flight, b none: b goes first, then they alternate as their counts meet
    assert drain(queue) == ["b0", "b1", "a4", "a5", "a6", "a7"]


def test_ties_go_to_the_tenant_served_longest_ago() -> None:
    queue = TurnQueue()
    for name in ("a0", "a1", "a2"):
        queue.put(ready("a", name))
    for name in ("b0", "b1", "b2"):
        queue.put(ready("b", name))
    assert drain(queue) == ["a0", "b0", "a1", "b1", "a2", "b2"]


def test_a_tenant_at_its_cap_waits_until_one_of_its_turns_is_done() -> None:
    queue = TurnQueue()
    for i in range(4):
        queue.put(ready("a", f"a{i}"))
    queue.put(ready("b", "b0"))
    assert drain(queue, {"a": 2}) == ["a0", "b0", "a1"]
    assert queue.waiting == 2 and queue.in_flight("a") == 2
    queue.done("a0")
    assert drain(queue, {"a": 2}) == ["a2"]


def test_a_runs_newer_turn_replaces_its_waiting_one_and_ends_its_published_one() -> None:
    queue = TurnQueue()
    queue.put(ready("a", "r", turn=0))
    assert drain(queue) == ["r"] and queue.in_flight("a") == 1
    queue.put(ready("a", "r", turn=1))  # its turn 0 committed
    queue.put(ready("a", "r", turn=2))  # never two of one run
    assert queue.in_flight("a") == 0 and queue.waiting == 1
    taken = queue.take(no_cap)
    assert taken is not None and taken.request.turn == 2


def test_a_discarded_turn_is_not_published() -> None:
    queue = TurnQueue()
    queue.put(ready("a", "r"))
    queue.put(ready("a", "s"))
    queue.discard("r")
    assert drain(queue) == ["s"]


def test_the_backlog_leaves_room_for_the_limit_and_the_waiting_pulls() -> None:
    backlog = Backlog(limit=2)
    assert backlog.room() == 2 and not backlog.read_due(0.0, waiting=1)
    backlog.published += 2
    assert backlog.room() == 0 and backlog.read_due(0.0, waiting=1)  # never read: read now
    backlog.read(pending=0, pulls=3, at=10.0)  # all taken; three workers ask for more
    assert backlog.room() == 5
    backlog.published += 5
    assert backlog.room() == 0 and not backlog.read_due(10.0, waiting=1)  # too soon
    assert backlog.next_read(10.0) == pytest.approx(POLL_SECONDS)
    backlog.freed += 1  # a commit: its worker takes the next request
    assert backlog.room() == 1
    assert backlog.read_due(10.0 + POLL_SECONDS, waiting=0) is False  # room left: no read
    assert backlog.read_due(10.0 + REFRESH_SECONDS, waiting=1)  # turns wait: read anyway


class Source:
    """The work queue's backlog and the dispatcher's publishing, in memory."""

    def __init__(self) -> None:
        self.pending = 0
        self.pulls = 0
        self.reads = 0
        self.published: list[str] = []
        self.fail = 0
        """Publications to refuse (NATS away)."""
        self.moved_on: set[str] = set()

    async def turn_backlog(self) -> tuple[int, int]:
        self.reads += 1
        return self.pending, self.pulls

    async def publish_ready(self, turn: ReadyTurn) -> bool:
        if self.fail:
            self.fail -= 1
            raise ConnectionError("NATS away")
        if turn.request.name in self.moved_on:
            return False
        self.published.append(turn.request.name)
        self.pending += 1
        return True


class Caps:
    def __init__(self, **caps: int) -> None:
        self.caps = caps

    def max_concurrent_turns(self, tenant: str) -> int | None:
        return self.caps.get(tenant)


async def test_a_quiet_queue_publishes_at_once_without_reading_the_backlog() -> None:
    source = Source()
    gate = TurnGate(source, source, caps=Caps(), limit=2)
    await gate.offer(ready("a", "r0"))
    assert source.published == ["r0"] and source.reads == 0
    for turn in range(1, 20):  # a run's turns one after the other: each commit makes room
        source.pending = 0  # the worker took it
        gate.committed("r0")
        await gate.offer(ready("a", "r0", turn=turn))
    assert len(source.published) == 20 and source.reads == 0


async def test_a_flooding_tenant_is_held_in_the_operator_and_another_tenant_goes_next() -> None:
    source = Source()
    gate = TurnGate(source, source, caps=Caps(), limit=2)
    loop = asyncio.create_task(gate.run())
    try:
        for i in range(10):
            await gate.offer(ready("a", f"a{i}"))
        await until(lambda: len(source.published) == 2)
        await asyncio.sleep(3 * POLL_SECONDS)
        assert source.published == ["a0", "a1"] and source.reads >= 1  # full: it read, waits
        await gate.offer(ready("b", "b0"))
        source.pending -= 1  # a worker's slot freed and took a0
        gate.committed("a0")
        await until(lambda: len(source.published) == 3)
        assert source.published[-1] == "b0"  # b has nothing in flight: b before a's eight
    finally:
        gate.stop()
        await loop


async def test_a_tenant_at_its_cap_leaves_the_room_to_others() -> None:
    source = Source()
    source.pulls = 10  # idle workers: room is not the limit here
    gate = TurnGate(source, source, caps=Caps(a=1), limit=2)
    loop = asyncio.create_task(gate.run())
    try:
        for i in range(3):
            await gate.offer(ready("a", f"a{i}"))
        await gate.offer(ready("b", "b0"))
        await until(lambda: source.published == ["a0", "b0"])
        await asyncio.sleep(3 * POLL_SECONDS)
        assert source.published == ["a0", "b0"]  # a's others wait for a0
        gate.committed("a0")
        await until(lambda: source.published == ["a0", "b0", "a1"])
    finally:
        gate.stop()
        await loop


async def test_a_failed_publication_keeps_its_place_and_a_moved_on_run_is_dropped() -> None:
    source = Source()
    source.fail = 1
    gate = TurnGate(source, source, caps=Caps(), limit=5)
    await gate.offer(ready("a", "r"))  # NATS away: kept
    assert source.published == [] and gate.queue.waiting == 1
    source.moved_on.add("gone")
    loop = asyncio.create_task(gate.run())
    try:
        await gate.offer(ready("a", "gone"))
        await until(lambda: source.published == ["r"], timeout=REFRESH_SECONDS + 5)
        await until(lambda: gate.queue.waiting == 0)
        assert gate.queue.in_flight("a") == 1  # "gone" was never published: not in flight
    finally:
        gate.stop()
        await loop


async def test_a_turn_that_failed_to_publish_after_its_run_moved_on_leaves_the_newer_one() -> None:
    """Publishing turn 0 timed out although JetStream stored it: a worker committed it and the
    run's turn 1 became ready while the publication still waited. Turn 0 is not put back (the
    run waits on it no longer): turn 1 is published, once, and nothing of the run is left."""
    source = Source()
    holding, release = asyncio.Event(), asyncio.Event()
    publish = source.publish_ready

    async def slow_then_failing(turn: ReadyTurn) -> bool:
        if turn.request.turn == 0:
            holding.set()
            await release.wait()
            raise TimeoutError("nats: timeout")
        return await publish(turn)

    source.publish_ready = slow_then_failing  # type: ignore[method-assign]
    gate = TurnGate(source, source, caps=Caps(), limit=5)
    first = asyncio.create_task(gate.offer(ready("a", "r")))
    await holding.wait()
    gate.committed("r")  # the stored copy ran
    await gate.offer(ready("a", "r", turn=1))  # waits behind the publication in progress
    release.set()
    await first
    loop = asyncio.create_task(gate.run())
    try:
        await until(lambda: source.published == ["r"])
        await until(lambda: gate.queue.waiting == 0)
        assert gate.queue.in_flight("a") == 1
        gate.committed("r")
        assert not gate.queue.holds("r") and gate.queue.take(no_cap) is None
    finally:
        gate.stop()
        await loop


OPS = st.lists(
    st.tuples(
        st.sampled_from(["put", "take", "back", "unpublished", "discard", "done"]),
        st.sampled_from(["a", "b"]),
        st.sampled_from(["r0", "r1", "r2"]),
    ),
    max_size=40,
)


@settings(max_examples=400, deadline=None)
@given(OPS)
def test_any_order_of_events_leaves_each_run_at_most_one_turn_to_take(
    ops: list[tuple[str, str, str]],
) -> None:
    """Whatever the order of readiness, takes, failed and dropped publications, ends and
    commits: ``take`` never fails, ``waiting`` counts what can be taken, a run has at most one
    turn waiting, and a turn is put back only while its run still waits on it."""
    queue, taken, turns = TurnQueue(), [], {}
    for op, tenant, run in ops:
        if op == "put":
            turns[run] = turns.get(run, -1) + 1
            queue.put(ready(tenant, run, turn=turns[run]))
        elif op == "take" and (turn := queue.take(no_cap)) is not None:
            taken.append(turn)
        elif op in ("back", "unpublished") and taken:
            turn = taken.pop()
            queue.put_back(turn) if op == "back" else queue.unpublished(turn)
        elif op == "discard":
            queue.discard(run)
        elif op == "done":
            queue.done(run)
    waiting, left = queue.waiting, []
    while (turn := queue.take(no_cap)) is not None:
        left.append(turn)
    assert len(left) == waiting == len({t.uid for t in left}) and queue.waiting == 0
    assert all(t.request.turn == turns[t.uid] for t in left)  # each run's latest turn


async def until(check: object, *, timeout: float = 5.0) -> None:
    assert callable(check)
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.005)
