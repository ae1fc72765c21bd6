"""The memory of the turns a worker runs at once (``worker.memory``): each turn reserves seven
times its run's stored event bytes plus 256 KiB from its tenant's share before it reads the
run; a tenant whose share is full waits behind its own turns, in the order they came, while
another tenant's turns go in at once; a stopping worker gives a waiting turn back at once.
Without it, 64 turns of runs of 6.7 MiB of events took 1.85 GiB of RSS on a worker whose limit
is 1 GiB."""

from __future__ import annotations

import asyncio

import pytest

from agentrun import metrics, protocol
from agentrun.protocol import TurnRequest
from agentrun.worker.consumer import ConsumerSettings, TurnConsumer
from agentrun.worker.memory import TurnMemory, turn_bytes

from .fakemsg import FakeMsg

MIB = 1_048_576


def test_a_turn_reserves_seven_times_its_runs_events_and_a_base() -> None:
    assert turn_bytes(0) == 262_144  # a run of an older operator's request: a light turn's
    assert turn_bytes(-5) == 262_144
    assert turn_bytes(8 * MIB) == 56 * MIB + 262_144  # a run at the default event cap


async def test_a_reservation_is_given_back_after_its_block_even_when_it_raises() -> None:
    turns = TurnMemory(10 * MIB, shares=2)
    async with turns.reserved("acme", MIB):
        assert turns.held == 7 * MIB + 262_144
    assert turns.held == 0
    with pytest.raises(RuntimeError):
        async with turns.reserved("acme", MIB):
            raise RuntimeError("the turn failed")
    assert turns.held == 0


class Held:
    """A reservation held in a task of its own until released."""

    def __init__(self, turns: TurnMemory, tenant: str, stored: int) -> None:
        self.turns, self.tenant, self.stored = turns, tenant, stored
        self.inside = asyncio.Event()
        self.release = asyncio.Event()
        self.task = asyncio.create_task(self._hold())

    async def _hold(self) -> None:
        async with self.turns.reserved(self.tenant, self.stored):
            self.inside.set()
            await self.release.wait()

    async def end(self) -> None:
        self.release.set()
        await asyncio.wait_for(self.task, 2.0)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_tenant_whose_share_is_full_waits_and_another_tenant_goes_in() -> None:
    """Shares of 40 MiB: one heavy turn (28.25 MiB) of ``heavy`` fills its share; its second
    waits within it, though the whole budget has room, and gets in once the first is done;
    ``light``'s turn goes in at once meanwhile."""
    turns = TurnMemory(80 * MIB, shares=2)
    first, second = Held(turns, "heavy", 4 * MIB), Held(turns, "heavy", 4 * MIB)
    await settle()
    assert first.inside.is_set() and not second.inside.is_set()
    other = Held(turns, "light", 4 * MIB)
    await asyncio.wait_for(other.inside.wait(), 2.0)  # another tenant's share
    assert turns.held == 2 * turn_bytes(4 * MIB)
    await first.end()
    await asyncio.wait_for(second.inside.wait(), 2.0)
    await second.end()
    await other.end()
    assert turns.held == 0


async def test_a_big_turn_is_not_passed_over_by_the_small_ones_behind_it() -> None:
    """A share of 30 MiB holds a heavy turn (21.25 MiB); a second heavy one waits; a light one
    coming after would fit beside the first, but waits behind the second, which gets in
    first."""
    turns = TurnMemory(60 * MIB, shares=2)
    first = Held(turns, "acme", 3 * MIB)
    await settle()
    big = Held(turns, "acme", 3 * MIB)
    await settle()
    small = Held(turns, "acme", 0)
    await settle()
    assert (big.inside.is_set(), small.inside.is_set()) == (False, False)
    await first.end()
    await asyncio.wait_for(big.inside.wait(), 2.0)
    await asyncio.wait_for(small.inside.wait(), 2.0)  # 21.25 + 0.25 MiB fit the share
    await big.end()
    await small.end()


async def test_a_turn_larger_than_the_budget_runs_alone_in_it() -> None:
    """A run whose events exceed what any share holds (a per-run cap raised past the worker's
    turn memory) still runs: it takes all of the budget, alone, and the others wait."""
    turns = TurnMemory(8 * MIB, shares=2)  # shares of 4 MiB, a turn of 56+ MiB
    huge = Held(turns, "heavy", 8 * MIB)
    await asyncio.wait_for(huge.inside.wait(), 2.0)
    assert turns.held == 8 * MIB
    light = Held(turns, "light", 0)
    await settle()
    assert not light.inside.is_set()
    await huge.end()
    await asyncio.wait_for(light.inside.wait(), 2.0)
    await light.end()
    assert turns.held == 0


async def test_a_reservation_cancelled_while_it_waits_takes_nothing() -> None:
    turns = TurnMemory(30 * MIB, shares=1)
    first = Held(turns, "acme", 3 * MIB)
    waiting = Held(turns, "acme", 3 * MIB)
    await settle()
    waiting.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting.task
    assert turns.held == turn_bytes(3 * MIB)
    await first.end()
    assert turns.held == 0


def request(tenant: str, uid: str, stored: int) -> FakeMsg:
    turn = TurnRequest(uid, "ns", uid, 3, 40, stored=stored)
    return FakeMsg(protocol.encode_turn_request(turn), subject=protocol.turn_subject(tenant))


class Turns:
    """Stands in for ``TurnConsumer._turn``: each turn runs until released, then acks."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.release = asyncio.Event()

    async def __call__(self, msg: FakeMsg, request: TurnRequest) -> None:
        self.started.append(request.run_uid)
        await self.release.wait()
        await msg.ack()


def consumer_of(turns: Turns) -> TurnConsumer:
    """A consumer whose turn memory holds one heavy turn per tenant (two shares of 30 MiB)."""
    settings = ConsumerSettings(heartbeat=3600.0, turn_memory_bytes=60 * MIB, turn_memory_shares=2)
    consumer = TurnConsumer(None, None, settings, seals=None)  # type: ignore[arg-type]
    consumer._turn = turns  # type: ignore[assignment,method-assign]
    return consumer


async def test_the_consumer_runs_a_heavy_tenants_second_turn_after_its_first() -> None:
    """``heavy``'s second run's turn waits (unstarted, counted as waiting) while its first
    runs; ``light``'s turn runs beside the first; the TurnRequest's ``stored`` is what is
    reserved; once the first ends, the second runs."""
    turns = Turns()
    consumer = consumer_of(turns)
    first, second = (request("heavy", u, 3 * MIB) for u in ("h1", "h2"))
    other = request("light", "l1", 3 * MIB)
    handlers = [asyncio.create_task(consumer._handle(m)) for m in (first, second, other)]  # type: ignore[arg-type]
    await settle()
    assert sorted(turns.started) == ["h1", "l1"]
    assert consumer.memory.held == 2 * turn_bytes(3 * MIB)
    assert metrics.TURNS_WAITING_MEMORY._value.get() == 1
    assert metrics.TURN_MEMORY._value.get() == 2 * turn_bytes(3 * MIB)
    assert consumer.in_flight == 3
    turns.release.set()
    await asyncio.wait_for(asyncio.gather(*handlers), 5.0)
    assert sorted(turns.started) == ["h1", "h2", "l1"]
    assert (first.outcome, second.outcome, other.outcome) == (["ack"], ["ack"], ["ack"])
    assert consumer.memory.held == 0 and consumer.in_flight == 0
    assert metrics.TURNS_WAITING_MEMORY._value.get() == 0
    assert metrics.TURN_MEMORY._value.get() == 0


async def test_a_stopping_worker_gives_a_turn_waiting_for_memory_back_at_once() -> None:
    """Stopped with one turn running and one waiting for room: the waiting one is naked at
    once (another worker takes it, unstarted), the running one goes on to its commit."""
    turns = Turns()
    consumer = consumer_of(turns)
    running, waiting = (request("heavy", u, 3 * MIB) for u in ("h1", "h2"))
    handlers = [asyncio.create_task(consumer._handle(m)) for m in (running, waiting)]  # type: ignore[arg-type]
    await settle()
    consumer.stop()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(handlers[1], 2.0)
    assert (turns.started, waiting.outcome) == (["h1"], ["nak"])
    assert consumer.memory.held == turn_bytes(3 * MIB)
    assert metrics.TURNS_WAITING_MEMORY._value.get() == 0
    turns.release.set()
    await asyncio.wait_for(handlers[0], 2.0)
    assert running.outcome == ["ack"] and consumer.memory.held == 0
