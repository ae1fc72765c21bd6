"""A worker's turns on a three-server JetStream cluster at R3 (issue 23): the real
``TurnConsumer`` runs a six-turn run against the scripted model and commits each turn on the
replicated event stream while this test dispatches the next turn as the operator does; during
the run the leaders of the event stream, the work queue and the workers' consumer step down.
The run completes with each turn committed once and one model request per turn."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import AsyncIterator, Mapping
from typing import Any

import nats
import pytest

from agentrun import protocol
from agentrun.bus import Bus, BusSettings
from agentrun.kernel import Phase
from agentrun.testing import mockllm, scenario
from agentrun.tools import Catalog, ToolContext, ToolSpec
from agentrun.worker.model import ModelClient, RetryPolicy
from agentrun.worker.turn import TurnDeps
from agentrun_dev import natscluster

from .loop import NoSecrets, config
from .test_turn_bounds import run_to_end

TURNS = 6
"""Model turns of the run: five with a tool call, then the answer."""
TURN_TIMEOUT = 90.0
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
    # A reply lost in an election (an ack or a nak) leaves the turn to be redelivered after
    # the ack wait: 5 s here rather than the default 30, well inside a turn's TURN_TIMEOUT.
    settings = BusSettings(url=nats_cluster.url, auth=nats_cluster.auth(), replicas=3, ack_wait=5.0)
    connected = await Bus.connect(settings, name="test-replicated-turns")
    try:
        yield connected
    finally:
        await connected.close()


async def step_down_during(bus: Bus, admin: nats.NATS, run_name: str) -> list[str]:
    """Step the three leaders down, one each time the run committed another turn."""
    groups = [protocol.STREAM_EVENTS, protocol.STREAM_TURNS]
    done: list[str] = []
    for turn, group in zip((1, 2, 3), [*groups, "consumer"], strict=True):
        async with asyncio.timeout(TURN_TIMEOUT):
            while True:
                last = await bus.last_event("ns", run_name)
                if last is not None and last.summary.turn >= turn:
                    break
                await asyncio.sleep(0.05)
        assert not last.phase.is_terminal, "the run ended before the step-downs"
        if group == "consumer":
            subject = f"{protocol.STREAM_TURNS}.{protocol.WORKERS_CONSUMER}"
            reply = await admin.request(f"$JS.API.CONSUMER.LEADER.STEPDOWN.{subject}", b"")
            assert b'"success":true' in reply.data, reply.data
        else:
            await natscluster.step_down(admin, group)
        done.append(group)
    return done


async def test_a_run_at_r3_completes_through_leader_step_downs_each_turn_once(
    bus: Bus, nats_cluster: natscluster.NatsCluster
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
            running = asyncio.create_task(run_to_end(bus, deps, run, turn_timeout=TURN_TIMEOUT))
            stepped = await step_down_during(bus, admin, run.name)
            events = await asyncio.wait_for(running, timeout=TURN_TIMEOUT * TURNS)
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
