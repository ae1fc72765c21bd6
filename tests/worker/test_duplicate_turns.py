"""One TurnRequest delivered to two workers at once (a redelivery while the first worker still
runs it, as after a NATS restart): real consumers, a real nats-server (JetStream events and
ledger), the scripted model over HTTP. The turn commits once and every model call made is
charged to the tenant."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from decimal import Decimal
from typing import Any

import pytest

from agentrun import kernel, protocol
from agentrun.bus import Bus, BusSettings
from agentrun.ledger import LedgerStore, QueuedRun, TenantLimits
from agentrun.protocol import ModelConfig, RunConfig, RunEvent, TurnRequest
from agentrun.testing import mockllm, scenario
from agentrun.tools import Calculate, Catalog
from agentrun.worker.consumer import ConsumerSettings, TurnConsumer
from agentrun.worker.model import ModelClient, RetryPolicy
from agentrun.worker.toolrunner import ToolRunSettings
from agentrun.worker.turn import TurnDeps
from agentrun_dev import components, natsserver

from .loop import NoSecrets

SCRIPT = """
scenarios:
  - name: slow-answer
    turns:
      - content: "42"
        latency_ms: 1500
        usage: {prompt_tokens: 100, completion_tokens: 10}
"""
SETTINGS = ConsumerSettings(concurrency=4, heartbeat=0.5, hold_ttl=5.0)
"""A beat of 0.5 s: a hold refreshed within 1 s belongs to a live worker."""


@pytest.fixture(scope="module")
def own_nats(
    tmp_path_factory: pytest.TempPathFactory, devenv_launch: components.Launch
) -> Iterator[natsserver.NatsServer]:
    """A nats-server of this module's own: its run events never reach another suite's
    operator."""
    server = natsserver.start_nats_server(tmp_path_factory.mktemp("nats-dup"), launch=devenv_launch)
    try:
        yield server
    finally:
        server.stop()


class Delivery:
    """One delivery of a TurnRequest, as a worker's handler sees it; records what it got."""

    def __init__(self, request: TurnRequest) -> None:
        self.data = protocol.encode_turn_request(request)
        self.headers: dict[str, str] | None = None
        self.metadata = _Metadata()
        self.outcome: list[str] = []

    async def ack(self) -> None:
        self.outcome.append("ack")

    async def nak(self, delay: float | None = None) -> None:
        self.outcome.append("nak")

    async def term(self) -> None:
        self.outcome.append("term")

    async def in_progress(self) -> None:
        pass


class _Metadata:
    num_delivered = 1
    timestamp = None


class Stack:
    def __init__(self, url: str, mock: mockllm.MockLLM) -> None:
        self.url, self.mock = url, mock
        self.tenant = f"t-{uuid.uuid4().hex[:10]}"
        self.buses: list[Bus] = []
        self.model = ModelClient(RetryPolicy(max_retries=0))

    async def worker(self, *, clock_skew: float = 0.0) -> TurnConsumer:
        """A worker with its own connection; ``clock_skew`` shifts its ledger clock (a hold
        looks that much older to it)."""
        bus = await Bus.connect(BusSettings(self.url), name=f"w{len(self.buses)}")
        self.buses.append(bus)
        ledger = await LedgerStore.open(bus.js, clock=lambda: time.time() + clock_skew)
        deps = TurnDeps(
            model=self.model,
            catalog=Catalog([Calculate()]),
            secrets=NoSecrets(),
            tool_settings=ToolRunSettings(),
        )
        return TurnConsumer(bus, deps, SETTINGS, ledger=ledger)

    async def admit(self) -> TurnRequest:
        """A fresh run, admitted (its event and its tenant slot): its turn 0's request."""
        uid = uuid.uuid4().hex
        config = RunConfig(
            uid=uid,
            namespace="ns",
            name=f"run-{uid[:8]}",
            goal="what is 6*7?",
            instructions="",
            tools=("calculate",),
            limits=kernel.Limits(),
            model=ModelConfig("mock", self.mock.base_url, "scripted", kernel.Pricing(), 32000, 100),
            deadline=time.time() + 60,
            tenant=self.tenant,
        )
        state = kernel.initial_state(goal=config.goal)
        event = RunEvent("admitted", uid, state.summary(), config=config, time=time.time())
        seq = await self.buses[0].append_event("ns", config.name, event, expected_seq=0)
        ledger = await LedgerStore.open(self.buses[0].js)
        refusal = await ledger.admit_run(
            self.tenant,
            QueuedRun(uid, "ns", config.name, time.time()),
            limits=TenantLimits(tokens=1_000_000),
            need=(0, Decimal(0)),
        )
        assert refusal is None
        return TurnRequest(uid, "ns", config.name, 0, seq)

    async def book(self) -> Any:
        return await (await LedgerStore.open(self.buses[0].js)).read(self.tenant)

    def model_calls(self) -> int:
        """Requests the scripted model got (a fresh model per test)."""
        return len(self.mock.state.requests)


@pytest.fixture
async def stack(own_nats: natsserver.NatsServer) -> AsyncIterator[Stack]:
    async with mockllm.MockLLM(scenario.parse_scenarios(SCRIPT)) as mock:
        s = Stack(own_nats.url, mock)
        try:
            yield s
        finally:
            await s.model.close()
            for bus in s.buses:
                await bus.close()


async def run_twice(
    first: TurnConsumer, second: TurnConsumer, request: TurnRequest
) -> tuple[Delivery, Delivery]:
    """Deliver ``request`` to ``first``, and to ``second`` 0.5 s later while it runs."""
    a, b = Delivery(request), Delivery(request)

    async def later() -> None:
        await asyncio.sleep(0.5)
        await second._handle(b)  # type: ignore[arg-type]

    await asyncio.gather(first._handle(a), later())  # type: ignore[arg-type]
    return a, b


async def test_a_redelivery_meeting_a_live_worker_does_not_call_the_model_again(
    stack: Stack,
) -> None:
    first, second = await stack.worker(), await stack.worker()
    request = await stack.admit()
    a, b = await run_twice(first, second, request)
    assert (a.outcome, b.outcome) == (["ack"], ["nak"])  # the second retries later
    assert stack.model_calls() == 1
    events = await stack.buses[0].read_events("ns", request.name)
    assert [e.kind for e in events] == ["admitted", "turn"]
    book = await stack.book()
    assert (book.used_tokens, book.abandoned_tokens, book.holds) == (110, 0, {})

    again = Delivery(request)  # its retry finds the turn committed: acked, nothing run
    await second._handle(again)  # type: ignore[arg-type]
    assert again.outcome == ["ack"] and stack.model_calls() == 1


async def test_a_turn_run_twice_at_once_charges_both_model_calls(stack: Stack) -> None:
    """A redelivery that takes the turn over (the first worker's hold looks stale to it, as
    after a NATS outage that kept its refreshes out) calls the model too; the turn commits
    once, and the losing call is charged to the tenant as abandoned."""
    first, second = await stack.worker(), await stack.worker(clock_skew=30.0)
    request = await stack.admit()
    a, b = await run_twice(first, second, request)
    assert (a.outcome, b.outcome) == (["ack"], ["ack"])
    assert stack.model_calls() == 2
    events = await stack.buses[0].read_events("ns", request.name)
    assert [e.kind for e in events] == ["admitted", "turn"]
    book = await stack.book()
    assert (book.used_tokens, book.abandoned_tokens, book.holds) == (220, 110, {})
