"""Two deliveries of one run in one worker at once: the run's next turn arrives while the
handler of the turn before is still in its tail (the commit landed, the operator published the
next turn at once, and the first handler still settles its ledger hold and acks). The first
handler's end must not take the second's place: a cancel of the run, or the loss of its hold,
must still cut the turn running now."""

from __future__ import annotations

import asyncio

from agentrun import protocol
from agentrun.protocol import TurnRequest
from agentrun.worker.consumer import ConsumerSettings, TurnConsumer

from .fakemsg import FakeMsg

UID = "uid-1"


def turn_of(turn: int) -> FakeMsg:
    return FakeMsg(protocol.encode_turn_request(TurnRequest(UID, "ns", "run", turn, 10 + turn)))


class Turns:
    """Stands in for ``TurnConsumer._turn``: each turn runs until released (turn 0 returns
    then, as a handler whose commit and ack are done); records the turns cut."""

    def __init__(self) -> None:
        self.started: dict[int, asyncio.Event] = {}
        self.release: dict[int, asyncio.Event] = {}
        self.cut: list[int] = []

    async def __call__(self, msg: FakeMsg, request: TurnRequest) -> None:
        self.release.setdefault(request.turn, asyncio.Event())
        self.started.setdefault(request.turn, asyncio.Event()).set()
        try:
            await self.release[request.turn].wait()
        except asyncio.CancelledError:
            self.cut.append(request.turn)
            raise
        await msg.ack()

    async def wait_started(self, turn: int) -> None:
        while turn not in self.started:
            await asyncio.sleep(0)
        await self.started[turn].wait()


async def two_turns_one_in_its_tail() -> tuple[TurnConsumer, Turns, FakeMsg, asyncio.Task[None]]:
    """A consumer that ran turn 0 of the run to its end while turn 1 of it had started: turn
    1's handler still runs."""
    consumer = TurnConsumer(None, None, ConsumerSettings(heartbeat=3600.0), seals=None)  # type: ignore[arg-type]
    turns = Turns()
    consumer._turn = turns  # type: ignore[assignment,method-assign]
    first, second = turn_of(0), turn_of(1)
    ending = asyncio.create_task(consumer._handle(first))  # type: ignore[arg-type]
    await turns.wait_started(0)
    running = asyncio.create_task(consumer._handle(second))  # type: ignore[arg-type]
    await turns.wait_started(1)
    turns.release[0].set()
    await ending
    assert first.outcome == ["ack"]
    return consumer, turns, second, running


async def test_a_cancel_cuts_the_runs_turn_running_after_its_previous_turns_handler_ended() -> None:
    consumer, turns, second, running = await two_turns_one_in_its_tail()
    await consumer._on_cancel(UID)
    await asyncio.wait_for(running, timeout=5.0)
    assert turns.cut == [1]
    assert second.outcome == ["ack"]  # the run is stopped: its turn is void
    assert consumer.in_flight == 0


async def test_a_lost_hold_cuts_the_runs_turn_running_after_its_previous_turns_handler_ended() -> (
    None
):
    consumer, turns, second, running = await two_turns_one_in_its_tail()
    consumer._hold_lost(UID)
    await asyncio.wait_for(running, timeout=5.0)
    assert turns.cut == [1]
    assert second.outcome == []  # left to whichever delivery has the turn, or to redelivery
    assert consumer.in_flight == 0
