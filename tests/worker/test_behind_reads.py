"""A worker whose read of a run's history comes back *behind* the TurnRequest (the read missed
the event the request was built on, as a replica that has not applied an acknowledged append
answers; issue 23) reads again instead of dropping the turn as stale: the real consumer on a
real nats-server, with a bus whose reads hide the run's newest events for a while, and the
scripted model over HTTP. A run whose events never appear (deleted, purged) has its request
acked after ``BEHIND_DELIVERIES`` deliveries, without a model call."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncGenerator, AsyncIterator

import pytest
from seals_support import VERIFIER, sealed

from agentrun import kernel
from agentrun.bus import Bus, BusSettings
from agentrun.kernel import Phase
from agentrun.protocol import RunConfig, RunEvent, TurnRequest
from agentrun.testing import mockllm, scenario
from agentrun.tools import Catalog
from agentrun.worker import consumer as consumer_module
from agentrun.worker.consumer import ConsumerSettings, TurnConsumer
from agentrun.worker.model import ModelClient, RetryPolicy
from agentrun.worker.turn import TurnDeps
from agentrun_dev import natsserver

from .loop import NoSecrets, config

SCRIPT = """
scenarios:
  - name: answer
    turns:
      - content: "done"
        usage: {prompt_tokens: 100, completion_tokens: 5}
"""


class LaggingBus(Bus):
    """A ``Bus`` whose first ``hidden_reads`` history reads leave out every event from
    sequence ``hide_from`` on, as a replica behind the leader would."""

    hide_from = 0
    hidden_reads = 0
    reads = 0

    async def iter_events(
        self, namespace: str, name: str, *, after_seq: int = 0
    ) -> AsyncGenerator[RunEvent, None]:
        self.reads += 1
        hidden = self.reads <= self.hidden_reads
        async for event in super().iter_events(namespace, name, after_seq=after_seq):
            if not (hidden and event.seq >= self.hide_from):
                yield event


@pytest.fixture
async def bus(own_nats_server: natsserver.NatsServer) -> AsyncIterator[LaggingBus]:
    settings = BusSettings(url=own_nats_server.url, auth=own_nats_server.auth(), ack_wait=30.0)
    connected = await LaggingBus.connect(settings, name="test-behind-reads")
    assert isinstance(connected, LaggingBus)
    try:
        yield connected
    finally:
        await connected.close()


async def serve(bus: Bus, run: RunConfig, *, admit: bool) -> tuple[TurnConsumer, int]:
    """A consumer on ``bus`` (to run, then stop) and the work queue's sequence of turn 0 of
    ``run``, dispatched on top of its admission (appended only if ``admit``: else the request
    names an event that is not there, as for a run whose events were purged)."""
    model = ModelClient(RetryPolicy(max_retries=0))
    deps = TurnDeps(model=model, catalog=Catalog([]), secrets=NoSecrets(), message_cap=1 << 20)
    seq = 1
    if admit:
        state = kernel.initial_state(goal=run.goal)
        admitted = RunEvent("admitted", run.uid, state.summary(), config=run, time=time.time())
        seq = await bus.append_event(run.namespace, run.name, sealed(admitted), expected_seq=0)
    request = TurnRequest(run.uid, run.namespace, run.name, 0, seq)
    queued = await bus.publish_turn(request, tenant=run.tenant)
    settings = ConsumerSettings(concurrency=2, heartbeat=1.0)
    return TurnConsumer(bus, deps, settings, seals=VERIFIER), queued


async def test_a_history_read_behind_the_request_is_read_again_and_the_turn_runs_once(
    bus: LaggingBus, caplog: pytest.LogCaptureFixture
) -> None:
    bus.hide_from, bus.hidden_reads = 1, 2  # the admission missed by two reads
    async with mockllm.MockLLM(scenario.parse_scenarios(SCRIPT)) as mock:
        run = dataclasses.replace(config(mock.base_url, goal="g", tools=()), uid="u-1", name="r1")
        consumer, _ = await serve(bus, run, admit=True)
        serving = asyncio.create_task(consumer.run())
        try:
            async with asyncio.timeout(30):
                while (last := await bus.last_event(run.namespace, run.name)).seq < 2:
                    await asyncio.sleep(0.05)
        finally:
            consumer.stop()
            await serving
        requests = len(mock.state.requests)
    assert (last.kind, last.phase, last.summary.answer) == ("turn", Phase.COMPLETED, "done")
    assert requests == 1  # run once, after the read caught up
    assert bus.reads == 3
    behind = [r for r in caplog.records if "before the request's base 1" in r.getMessage()]
    assert len(behind) == 2


async def test_a_request_whose_base_event_never_appears_is_acked_without_a_model_call(
    bus: LaggingBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(consumer_module, "BEHIND_DELAY", 0.1)
    async with mockllm.MockLLM(scenario.parse_scenarios(SCRIPT)) as mock:
        run = dataclasses.replace(config(mock.base_url, goal="g", tools=()), uid="u-2", name="r2")
        consumer, queued = await serve(bus, run, admit=False)
        serving = asyncio.create_task(consumer.run())
        try:
            async with asyncio.timeout(30):
                while await bus.turn_queued(queued):  # acked: gone from the work queue
                    await asyncio.sleep(0.1)
        finally:
            consumer.stop()
            await serving
        requests = len(mock.state.requests)
    assert requests == 0
    assert bus.reads == consumer_module.BEHIND_DELIVERIES  # read at each delivery, then acked
    assert await bus.last_event(run.namespace, run.name) is None
