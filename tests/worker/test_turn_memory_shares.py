"""A tenant's heavy runs take turns within its share of the worker's turn memory, end to end:
a real consumer pulling from a real nats-server, runs of real events, the scripted model over
HTTP. Shares of 10.5 MiB hold one turn of a run of 1.38 MiB of events (7 × 1.38 MiB + 256
KiB = 9.9 MiB) and nothing beside it: tenant A's three heavy runs are asked of the model one at
a time, the others waiting for room meanwhile (their slots held), and all three complete;
tenant B's lighter run (a turn of 2.7 MiB, which would not fit in A's share beside a heavy
one) ends before any of A's. Before the turn memory all three of A's turns called the model at
once (64 such turns of runs of 6.7 MiB of events took 1.85 GiB of a 1 GiB worker)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from seals_support import VERIFIER, sealed

from agentrun import kernel, metrics
from agentrun.bus import Bus, BusSettings
from agentrun.kernel import Phase
from agentrun.protocol import ModelConfig, RunConfig, RunEvent, TurnRequest
from agentrun.testing import mockllm, scenario
from agentrun.tools import Calculate, Catalog
from agentrun.worker.consumer import ConsumerSettings, TurnConsumer
from agentrun.worker.model import ModelClient, RetryPolicy
from agentrun.worker.turn import TurnDeps
from agentrun_dev import natsserver

from .loop import NoSecrets
from .test_run_cache import calls_answered

MIB = 1_048_576
SCRIPT = """
scenarios:
  - name: heavy
    match: {goal: heavy}
    turns:
      - content: "done"
        latency_ms: 4000
        usage: {prompt_tokens: 100, completion_tokens: 5}
    after: repeat_last
  - name: light
    match: {goal: light}
    turns:
      - content: "done"
        usage: {prompt_tokens: 10, completion_tokens: 5}
    after: repeat_last
"""
SETTINGS = ConsumerSettings(
    concurrency=8, heartbeat=1.0, turn_memory_bytes=21 * MIB, turn_memory_shares=2
)
"""Two shares of 10.5 MiB: one heavy turn (9.9 MiB) fills one."""


@pytest.fixture
async def bus(own_nats_server: natsserver.NatsServer) -> AsyncIterator[Bus]:
    settings = BusSettings(url=own_nats_server.url, auth=own_nats_server.auth())
    connected = await Bus.connect(settings, name="test-turn-memory-shares")
    try:
        yield connected
    finally:
        await connected.close()


async def admit(bus: Bus, url: str, *, name: str, turns: int, goal: str = "heavy") -> TurnRequest:
    """A run named ``name`` of goal ``goal`` (the scenario it is answered by) admitted and
    given ``turns`` turns of 8 calls answered 45,000 characters each (1.38 MiB of events
    for 4); its next turn's request, ``stored`` its events' bytes as the operator writes it."""
    limits = kernel.Limits(max_steps=100, max_tool_calls=1000)
    model = ModelConfig("mock", url, "scripted", kernel.Pricing(), 32000, 100)
    cfg = RunConfig(name, "ns", name, goal, "", ("calculate",), limits, model, time.time() + 60)
    state = kernel.initial_state(goal=goal)
    event = sealed(RunEvent("admitted", name, state.summary(), config=cfg, time=1.0))
    seq = await bus.append_event("ns", name, event, expected_seq=0)
    stored = len(event.encode())
    for turn in range(turns):
        ids = [f"c{turn}x{n}abcde" for n in range(8)]
        record = calls_answered(turn, ids, lambda _: "r" * 45_000)
        state = kernel.advance(state, record, limits)
        event = RunEvent(
            "turn", name, state.summary(), record=record, time=1.0, stored_before=stored
        )
        seq = await bus.append_event("ns", name, event, expected_seq=seq)
        stored += len(event.encode())
    return TurnRequest(name, "ns", name, turns, seq, stored=stored)


class Watch:
    """What a 10 ms poll sees: the most heavy model calls awaiting their answer at once, the
    most turn memory held and the most turns waiting for it."""

    def __init__(self, mock: mockllm.MockLLM, consumer: TurnConsumer) -> None:
        self.mock, self.consumer = mock, consumer
        self.heavy_at_once = 0
        self.held = 0
        self.waiting = 0.0

    async def poll(self) -> None:
        while True:
            pending = [
                r for r in self.mock.state.requests if r.status is None and r.scenario == "heavy"
            ]
            self.heavy_at_once = max(self.heavy_at_once, len(pending))
            self.held = max(self.held, self.consumer.memory.held)
            self.waiting = max(self.waiting, metrics.TURNS_WAITING_MEMORY._value.get())
            await asyncio.sleep(0.01)


async def ended(bus: Bus, request: TurnRequest) -> bool:
    last = await bus.last_event("ns", request.name)
    return last is not None and last.phase is Phase.COMPLETED


async def test_a_tenant_s_heavy_turns_run_one_at_a_time_in_its_share_and_another_s_go_in(
    bus: Bus,
) -> None:
    async with mockllm.MockLLM(scenario.parse_scenarios(SCRIPT), strict_call_ids=False) as mock:
        heavy = [await admit(bus, mock.base_url, name=f"heavy-{i}", turns=4) for i in range(3)]
        light = await admit(bus, mock.base_url, name="light", turns=1, goal="light")
        assert 0.3 * MIB < light.stored < 0.4 * MIB  # a turn of 2.4-3.05 MiB
        assert all(1.36 * MIB < r.stored < 1.4 * MIB for r in heavy)  # a turn: 9.77-10.05 MiB
        for request in heavy:
            await bus.publish_turn(request, tenant="tenant-a")
        await bus.publish_turn(light, tenant="tenant-b")
        model = ModelClient(RetryPolicy(max_retries=0))
        deps = TurnDeps(model=model, catalog=Catalog([Calculate()]), secrets=NoSecrets())
        consumer = TurnConsumer(bus, deps, SETTINGS, seals=VERIFIER)
        watch = Watch(mock, consumer)
        serving = asyncio.create_task(consumer.run())
        polling = asyncio.create_task(watch.poll())
        try:
            async with asyncio.timeout(60):
                while not await ended(bus, light):
                    await asyncio.sleep(0.02)
                a_ended_then = [await ended(bus, r) for r in heavy]
                while not all([await ended(bus, r) for r in heavy]):
                    await asyncio.sleep(0.05)
        finally:
            polling.cancel()
            consumer.stop()
            await serving
            await model.close()
    assert not any(a_ended_then)  # B's run ended first: in a share of its own
    assert watch.heavy_at_once == 1
    assert 9.7 * MIB < watch.held < 13.2 * MIB  # one heavy turn (and B's lighter one) at most
    assert watch.waiting == 2  # A's second and third waited for room, unstarted
    assert metrics.TURNS_WAITING_MEMORY._value.get() == 0
    heavy_calls = [r for r in mock.state.requests if r.scenario == "heavy"]
    assert len(heavy_calls) == 3  # each of A's turns asked the model once
