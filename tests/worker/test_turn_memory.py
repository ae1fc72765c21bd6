"""The memory of the turns a worker runs at once (``worker.memory``): each turn reserves three
times its run's stored event bytes plus 256 KiB from its tenant's share before it reads the
run; a tenant whose share is full waits behind its own turns, then gives the delivery back
(naked 5 s), while another tenant's turns go in at once. Without it, 64 turns of runs at the
8 MiB event cap needed ~1.5 GiB on a worker whose limit is 1 GiB."""

from __future__ import annotations

import asyncio

import pytest

from agentrun import metrics, protocol
from agentrun.protocol import TurnRequest
from agentrun.worker.consumer import ConsumerSettings, TurnConsumer
from agentrun.worker.memory import TurnMemory, turn_bytes

from .fakemsg import FakeMsg

MIB = 1_048_576


def test_a_turn_reserves_three_times_its_runs_events_and_a_base() -> None:
    assert turn_bytes(0) == 262_144  # a run of an older operator's request: a light turn's
    assert turn_bytes(-5) == 262_144
    assert turn_bytes(8 * MIB) == 24 * MIB + 262_144  # a run at the default event cap


async def test_a_reservation_is_given_back_after_its_block_even_when_it_raises() -> None:
    turns = TurnMemory(10 * MIB, shares=2)
    async with turns.reserved("acme", MIB) as room:
        assert room and turns.held == 3 * MIB + 262_144
    assert turns.held == 0
    with pytest.raises(RuntimeError):
        async with turns.reserved("acme", MIB):
            raise RuntimeError("the turn failed")
    assert turns.held == 0


async def test_a_tenant_whose_share_is_full_waits_and_another_tenant_goes_in() -> None:
    """Shares of 40 MiB: one heavy turn (24.25 MiB) of ``heavy`` fills its share; its second
    waits within it, though the whole budget has room, and gets in once the first is done;
    ``light``'s turn goes in at once meanwhile."""
    turns = TurnMemory(80 * MIB, shares=2, wait=5.0)
    first = turns.reserved("heavy", 8 * MIB)
    assert await first.__aenter__()
    second = asyncio.create_task(_hold(turns, "heavy", 8 * MIB))
    await asyncio.sleep(0.05)
    assert not second.done()
    async with turns.reserved("light", 8 * MIB) as room:
        assert room  # another tenant's share
        assert turns.held == 2 * turn_bytes(8 * MIB)
    await first.__aexit__(None, None, None)
    assert await asyncio.wait_for(second, 2.0) is True
    assert turns.held == 0


async def _hold(turns: TurnMemory, tenant: str, stored: int) -> bool:
    async with turns.reserved(tenant, stored) as room:
        return room


async def test_no_room_within_the_wait_reserves_nothing() -> None:
    turns = TurnMemory(60 * MIB, shares=2, wait=0.1)
    async with turns.reserved("heavy", 8 * MIB) as room:
        assert room
        async with turns.reserved("heavy", 2 * MIB) as again:
            assert not again  # 24.25 + 6.25 MiB: over its 30 MiB share
            assert turns.held == turn_bytes(8 * MIB)  # the refused one took nothing
    assert turns.held == 0
    async with turns.reserved("heavy", MIB) as room:
        assert room  # its room is back


async def test_a_turn_larger_than_the_budget_runs_alone_in_it() -> None:
    """A run whose events exceed what any share holds (a per-run cap raised past the worker's
    turn memory) still runs: it takes all of the budget, alone, and the others wait."""
    turns = TurnMemory(8 * MIB, shares=2, wait=0.1)  # shares of 4 MiB, a turn of 24+ MiB
    async with turns.reserved("heavy", 8 * MIB) as room:
        assert room and turns.held == 8 * MIB
        async with turns.reserved("light", 0) as other:
            assert not other
    assert turns.held == 0
    async with turns.reserved("light", 0) as other:
        assert other


async def test_a_reservation_cancelled_while_it_waits_takes_nothing() -> None:
    turns = TurnMemory(30 * MIB, shares=1, wait=30.0)
    async with turns.reserved("acme", 8 * MIB):
        waiting = asyncio.create_task(_hold(turns, "acme", 8 * MIB))
        await asyncio.sleep(0.05)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert turns.held == turn_bytes(8 * MIB)
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


async def test_the_consumer_gives_back_a_heavy_tenants_turn_and_runs_anothers() -> None:
    """A worker whose turn memory holds one heavy turn per tenant (two shares of 30 MiB):
    ``heavy``'s second run's turn is naked for 5 s after the wait, unrun and counted;
    ``light``'s turn runs beside the first. The TurnRequest's ``stored`` is what is reserved."""
    settings = ConsumerSettings(heartbeat=3600.0, turn_memory_bytes=60 * MIB, turn_memory_shares=2)
    consumer = TurnConsumer(None, None, settings, seals=None)  # type: ignore[arg-type]
    consumer.memory = TurnMemory(60 * MIB, shares=2, wait=0.2)
    turns = Turns()
    consumer._turn = turns  # type: ignore[assignment,method-assign]
    deferred = metrics.TURNS_DEFERRED._value.get()
    first, second, other = (
        request("heavy", "h1", 8 * MIB),
        request("heavy", "h2", 8 * MIB),
        request("light", "l1", 8 * MIB),
    )
    handlers = [asyncio.create_task(consumer._handle(m)) for m in (first, second, other)]  # type: ignore[arg-type]
    await asyncio.wait_for(handlers[1], 5.0)
    assert second.outcome == ["nak 5.0"]  # offered again in 5 s
    assert metrics.TURNS_DEFERRED._value.get() == deferred + 1
    assert sorted(turns.started) == ["h1", "l1"]
    assert consumer.memory.held == 2 * turn_bytes(8 * MIB)
    turns.release.set()
    await asyncio.wait_for(asyncio.gather(handlers[0], handlers[2]), 5.0)
    assert (first.outcome, other.outcome) == (["ack"], ["ack"])
    assert consumer.memory.held == 0 and consumer.in_flight == 0
