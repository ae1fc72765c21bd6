"""A worker's turns on a three-server JetStream cluster at R3 (issue 23): the real
``TurnConsumer``, on its own connection (the worker's identity) to another server than the
operator's, runs a six-turn run against the scripted model and commits each turn on the
replicated event stream while this test dispatches the next turn as the operator does; during
the run the leaders of the event stream, the work queue and the workers' consumer step down.
The run completes with each turn committed once and one model request per turn.

The worker reads its run's history from the stream's leader: a direct get, answered by the
worker's own server when it is a follower, could miss the event the turn was dispatched on and
the turn was dropped as stale (the stall this test once showed, issue 23); the forced version
of that is ``test_behind_reads.py``."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import nats
import pytest
from cluster_nats_support import ELECTION_ERRORS
from seals_support import VERIFIER, sealed

from agentrun import kernel, protocol
from agentrun.bus import Bus, BusSettings
from agentrun.kernel import Phase
from agentrun.protocol import RunConfig, RunEvent, TurnRequest
from agentrun.testing import mockllm, scenario
from agentrun.tools import Catalog, ToolContext, ToolSpec
from agentrun.worker.consumer import ConsumerSettings, TurnConsumer
from agentrun.worker.model import ModelClient, RetryPolicy
from agentrun.worker.turn import TurnDeps
from agentrun_dev import natscluster

from .loop import NoSecrets, config

TURNS = 6
"""Model turns of the run: five with a tool call, then the answer."""
TURN_TIMEOUT = 60.0
"""Seconds a turn may take to be committed: a few on a quiet machine (the test takes about 6 s);
an election on three servers competing with other work for two cores took over 30."""
SCRIPT = f"""
scenarios:
  - name: pages
    turns:
{
    "".join(
        f'''      - content: "page {i}"
        tool_calls: [{{id: c{i}, name: read, arguments: {{page: {i}}}}}]
        usage: {{prompt_tokens: 100, completion_tokens: 10}}
        latency_ms: 300
'''
        for i in range(TURNS - 1)
    )
}      - content: "read them all"
        usage: {{prompt_tokens: 100, completion_tokens: 5}}
"""


class Read:
    """A read tool that answers at once."""

    spec = ToolSpec(
        "read",
        "reads one page",
        {"type": "object", "properties": {"page": {"type": "integer"}}, "required": ["page"]},
        "read",
        False,
    )

    async def run(self, arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        return f"page {arguments['page']}"


@pytest.fixture
async def bus(nats_cluster: natscluster.NatsCluster) -> AsyncIterator[Bus]:
    """The operator's connection (provisioning the streams at R3), to the first server."""
    # A reply lost in an election (an ack or a nak) leaves the turn to be redelivered after
    # the ack wait: 5 s here rather than the default 30, well inside a turn's TURN_TIMEOUT.
    settings = BusSettings(
        url=nats_cluster.url, auth=nats_cluster.auth("operator"), replicas=3, ack_wait=5.0
    )
    connected = await Bus.connect(settings, name="test-replicated-turns")
    try:
        yield connected
    finally:
        await connected.close()


@pytest.fixture
async def worker_bus(nats_cluster: natscluster.NatsCluster, bus: Bus) -> AsyncIterator[Bus]:
    """The worker's connection, to the second server: the replica serving its direct gets
    would be another than the operator's."""
    settings = BusSettings(url=nats_cluster.urls[1], auth=nats_cluster.auth("worker"))
    connected = await Bus.connect(settings, name="test-replicated-worker", provision=False)
    try:
        yield connected
    finally:
        await connected.close()


async def retried(call: Any) -> Any:
    """``await call()``, again while a stream elects a leader (``ELECTION_ERRORS``), as the
    operator retries; AssertionError after TURN_TIMEOUT seconds."""
    async with asyncio.timeout(TURN_TIMEOUT):
        while True:
            try:
                return await call()
            except ELECTION_ERRORS:
                await asyncio.sleep(0.2)


async def last_after(bus: Bus, run: RunConfig, *, seq: int = 0, turn: int = 0) -> RunEvent:
    """The run's last event once its sequence is above ``seq`` and its turn at ``turn`` or
    beyond (TimeoutError after TURN_TIMEOUT seconds)."""
    async with asyncio.timeout(TURN_TIMEOUT):
        while True:
            last = await retried(lambda: bus.last_event(run.namespace, run.name))
            if last is not None and last.seq > seq and last.summary.turn >= turn:
                return last
            await asyncio.sleep(0.05)


async def run_to_end(bus: Bus, worker_bus: Bus, deps: TurnDeps, run: RunConfig) -> list[RunEvent]:
    """Admit ``run`` on ``bus``, then dispatch each next turn (as the operator does) to a real
    ``TurnConsumer`` on ``worker_bus`` until the run ends; returns the run's events."""
    settings = ConsumerSettings(concurrency=2, heartbeat=1.0)
    consumer = TurnConsumer(worker_bus, deps, settings, seals=VERIFIER)
    serving = asyncio.create_task(consumer.run())
    try:
        state = kernel.initial_state(goal=run.goal)
        admitted = sealed(
            RunEvent("admitted", run.uid, state.summary(), config=run, time=time.time())
        )
        seq = await retried(
            lambda: bus.append_event(run.namespace, run.name, admitted, expected_seq=0)
        )
        last = dataclasses.replace(admitted, seq=seq)
        while not last.phase.is_terminal:
            request = TurnRequest(run.uid, run.namespace, run.name, last.summary.turn, last.seq)
            await retried(functools.partial(bus.publish_turn, request, tenant=run.tenant))
            last = await last_after(bus, run, seq=last.seq)
    finally:
        consumer.stop()
        await serving
    return list(await retried(lambda: bus.read_events(run.namespace, run.name)))


async def step_down_during(bus: Bus, admin: nats.NATS, run: RunConfig) -> list[str]:
    """Step the three leaders down, one each time the run committed another turn."""
    done: list[str] = []
    groups = [protocol.STREAM_EVENTS, protocol.STREAM_TURNS, "consumer"]
    for turn, group in enumerate(groups, start=1):
        last = await last_after(bus, run, turn=turn)
        assert not last.phase.is_terminal, "the run ended before the step-downs"
        if group == "consumer":
            subject = f"{protocol.STREAM_TURNS}.{protocol.WORKERS_CONSUMER}"
            api = f"$JS.API.CONSUMER.LEADER.STEPDOWN.{subject}"
            reply = await admin.request(api, b"", timeout=10)
            assert b'"success":true' in reply.data, reply.data
        else:
            await natscluster.step_down(admin, group)
        done.append(group)
    return done


async def in_flight(admin: nats.NATS) -> str:
    """What the work queue holds and its consumer has out (for a failure's message)."""
    info = await admin.jetstream(timeout=5).consumer_info(
        protocol.STREAM_TURNS, protocol.WORKERS_CONSUMER
    )
    return (
        f"pending {info.num_pending}, ack pending {info.num_ack_pending}, "
        f"waiting pulls {info.num_waiting}, redelivered {info.num_redelivered}"
    )


async def test_a_run_at_r3_completes_through_leader_step_downs_each_turn_once(
    bus: Bus, worker_bus: Bus, nats_cluster: natscluster.NatsCluster
) -> None:
    model = ModelClient(RetryPolicy(max_retries=0))
    deps = TurnDeps(
        model=model, catalog=Catalog([Read()]), secrets=NoSecrets(), message_cap=bus.event_cap
    )
    admin = await nats.connect(**nats_cluster.client_options("admin"))
    try:
        async with mockllm.MockLLM(scenario.parse_scenarios(SCRIPT)) as mock:
            run = config(mock.base_url, goal="read the pages", tools=("read",))
            run = dataclasses.replace(run, uid="uid-r3", name="r3")
            running = asyncio.create_task(run_to_end(bus, worker_bus, deps, run))
            try:
                stepped = await step_down_during(bus, admin, run)
                events = await asyncio.wait_for(running, timeout=TURN_TIMEOUT * TURNS)
            except TimeoutError as err:
                raise AssertionError(f"a turn stalled: {await in_flight(admin)}") from err
            per_turn = collections.Counter(r.turn for r in mock.state.requests)
    finally:
        await admin.close()
        await model.close()
    assert stepped == [protocol.STREAM_EVENTS, protocol.STREAM_TURNS, "consumer"]
    assert [e.kind for e in events] == ["admitted"] + ["turn"] * TURNS
    assert [e.summary.turn for e in events[1:]] == list(range(1, TURNS + 1))
    assert per_turn == dict.fromkeys(range(TURNS), 1), per_turn  # one model request per turn
    end = events[-1].summary
    assert (end.phase, end.answer, end.steps) == (Phase.COMPLETED, "read them all", TURNS)
    assert end.usage.input_tokens == 100 * TURNS
    infos = [await bus.js.stream_info(s) for s in (protocol.STREAM_EVENTS, protocol.STREAM_TURNS)]
    assert [info.config.num_replicas for info in infos] == [3, 3]
