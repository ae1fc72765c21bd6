"""Fair shares of the worker slots: ready turns are published while the work queue is short,
the tenant with the fewest turns in flight first, within each tenant's ``maxConcurrentTurns``;
a quiet queue publishes at once, and a failed publication keeps its place."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest

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


async def until(check: object, *, timeout: float = 5.0) -> None:
    assert callable(check)
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.005)
