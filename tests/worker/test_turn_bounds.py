"""A model that asks for many large tool results in one turn cannot make the turn
uncommittable: the worker's real consumer runs each turn against the scripted model over HTTP
and commits it on a real nats-server (its own, with the default 1 MiB message cap), while this
test dispatches the next turn as the operator does. The run goes on, and its usage counts the
model calls."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
from seals_support import VERIFIER, sealed

from agentrun import kernel
from agentrun.bus import Bus, BusSettings, EventTooLarge
from agentrun.kernel import MalformedCause, Phase
from agentrun.protocol import RunConfig, RunEvent, TurnRequest
from agentrun.testing import mockllm, scenario
from agentrun.tools import Catalog, ToolContext, ToolError, ToolSpec
from agentrun.worker import toolrunner
from agentrun.worker.consumer import ConsumerSettings, TurnConsumer
from agentrun.worker.model import ModelClient, RetryPolicy
from agentrun.worker.toolrunner import ToolRunSettings
from agentrun.worker.turn import TurnDeps
from agentrun_dev import natsserver

from .loop import NoSecrets, config

CALLS = 80
PAGE = "x" * 20_000
"""What one call returns: over the worker's 16 KiB cap of one result, so it is cut to it."""


class Fetch:
    """A read tool that returns a large page."""

    spec = ToolSpec(
        "fetch",
        "returns one page of a document",
        {"type": "object", "properties": {"page": {"type": "integer"}}, "required": ["page"]},
        "read",
        False,
    )

    def __init__(self) -> None:
        self.calls = 0

    async def run(self, arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        self.calls += 1
        return f"page {arguments['page']}: {PAGE}"


def script(*, text: str, calls: int = CALLS) -> str:
    """Turn 0: ``calls`` fetches with ``text`` beside them (just ``text`` without calls), sent
    whole by a server that does not stream (a streamed reply that long would be cut at the
    call's output allowance); turn 1: the answer. A correction asking for fewer calls in one
    reply is answered at once (it adds no assistant message, so the scripted model would
    otherwise repeat turn 0)."""
    fetches = "\n".join(
        f"          - {{id: f{i}, name: fetch, arguments: {{page: {i}}}}}" for i in range(calls)
    )
    fetches = f"        tool_calls:\n{fetches}" if calls else ""
    return f"""
scenarios:
  - name: corrected
    match: {{last: "tool calls in one reply"}}
    turns:
      - content: "read what fit"
        usage: {{prompt_tokens: 700, completion_tokens: 5}}
    after: repeat_last
  - name: many-pages
    turns:
      - content: "{text}"
{fetches}
        usage: {{prompt_tokens: 500, completion_tokens: 400}}
        stream: json
      - content: "read {{turn}} turns of pages"
        usage: {{prompt_tokens: 600, completion_tokens: 10}}
"""


@pytest.fixture
async def bus(own_nats_server: natsserver.NatsServer) -> AsyncIterator[Bus]:
    connected = await Bus.connect(
        BusSettings(url=own_nats_server.url, auth=own_nats_server.auth()), name="test-turn-bounds"
    )
    try:
        yield connected
    finally:
        await connected.close()


async def next_event(bus: Bus, run: RunConfig, *, after: int, timeout: float = 30) -> RunEvent:
    """The run's last event once it is newer than sequence ``after``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        last = await bus.last_event(run.namespace, run.name)
        if last is not None and last.seq > after:
            return last
        await asyncio.sleep(0.05)
    raise AssertionError(f"no event after {after} in {timeout}s")


async def run_to_end(
    bus: Bus,
    deps: TurnDeps,
    run: RunConfig,
    settings: ConsumerSettings | None = None,
    *,
    turn_timeout: float = 30,
) -> list[RunEvent]:
    """Admit ``run``, then dispatch each next turn (as the operator does) to a real
    ``TurnConsumer`` until the run ends, each turn committed within ``turn_timeout`` seconds
    (AssertionError otherwise); returns the run's events."""
    settings = settings or ConsumerSettings(concurrency=2, heartbeat=1.0)
    consumer = TurnConsumer(bus, deps, settings, seals=VERIFIER)
    serving = asyncio.create_task(consumer.run())
    try:
        state = kernel.initial_state(goal=run.goal)
        admitted = sealed(
            RunEvent("admitted", run.uid, state.summary(), config=run, time=time.time())
        )
        last = dataclasses.replace(
            admitted, seq=await bus.append_event(run.namespace, run.name, admitted, expected_seq=0)
        )
        while not last.phase.is_terminal:
            request = TurnRequest(run.uid, run.namespace, run.name, last.summary.turn, last.seq)
            await bus.publish_turn(request, tenant=run.tenant)
            last = await next_event(bus, run, after=last.seq, timeout=turn_timeout)
    finally:
        consumer.stop()
        await serving
    return await bus.read_events(run.namespace, run.name)


async def drive(
    bus: Bus, *, name: str, script: str, settings: ConsumerSettings | None = None
) -> tuple[list[RunEvent], Fetch]:
    fetch = Fetch()
    model = ModelClient(RetryPolicy(max_retries=0))
    deps = TurnDeps(
        model=model, catalog=Catalog([fetch]), secrets=NoSecrets(), message_cap=bus.event_cap
    )
    try:
        async with mockllm.MockLLM(scenario.parse_scenarios(script)) as mock:
            limits = kernel.Limits(max_tool_calls=200)
            run = config(mock.base_url, goal="read every page", tools=("fetch",), limits=limits)
            run = dataclasses.replace(run, uid=f"uid-{name}", name=name)
            return await run_to_end(bus, deps, run, settings), fetch
    finally:
        await model.close()


async def test_eighty_large_results_in_one_turn_are_committed_bounded_and_the_run_completes(
    bus: Bus,
) -> None:
    events, fetch = await drive(bus, name="many-pages", script=script(text="Reading all pages."))
    assert fetch.calls == CALLS
    assert max(len(e.encode()) for e in events) <= bus.event_cap
    end = events[-1].summary
    assert (end.phase, end.answer) == (Phase.COMPLETED, "read 1 turns of pages")
    assert (end.steps, end.tool_calls, end.tool_failures, end.corrections) == (2, CALLS, 0, 0)
    # the scripted model reports 1,100 prompt tokens in all; the second prompt holds the 80
    # calls and their results (clipped pages, their notes), more than its 600: that prompt is
    # charged its text's floor
    second = events[2].record
    assert isinstance(second, kernel.Answered) and second.usage.input_tokens > 600
    assert (end.usage.input_tokens > 1100, end.usage.output_tokens) == (True, 410)
    record = events[1].record
    assert isinstance(record, kernel.Answered)
    assert [r.tool_call_id for r in record.results] == [f"f{i}" for i in range(CALLS)]
    assert record.results[0].content.startswith("page 0: xxx")
    assert "result truncated" in record.results[0].content  # the worker's 16 KiB per result
    dropped = [r for r in record.results if r.content.startswith("[agentrun: result dropped")]
    assert 40 < len(dropped) < CALLS - 20
    assert record.results[-1] in dropped


async def test_a_turn_whose_event_would_still_pass_the_cap_is_committed_as_a_correction(
    bus: Bus,
) -> None:
    # a final answer of 128 KiB of control characters is within the cap on text, but it is
    # stored twice (the decision and the run's answer), 6 bytes a character: about 1.5 MiB
    text = "\\x01" * kernel.decision.MAX_CONTENT_BYTES
    events, _ = await drive(bus, name="unstorable", script=script(text=text, calls=0))
    assert max(len(e.encode()) for e in events) <= bus.event_cap
    assert [e.kind for e in events] == ["admitted", "turn", "turn"]
    shrunk = events[1].record
    assert isinstance(shrunk, kernel.Answered)
    assert isinstance(shrunk.decision, kernel.Malformed)
    assert shrunk.decision.cause is MalformedCause.UNSTORABLE
    assert "bytes, over the" in shrunk.decision.detail
    assert events[1].summary.answer is None
    end = events[-1].summary
    assert (end.phase, end.answer) == (Phase.COMPLETED, "read what fit")
    assert (end.steps, end.corrections) == (2, 1)
    # the scripted model reports 400 output tokens for 128 Ki characters of one repeated
    # character: above their floor, so believed
    floor = kernel.least_tokens(["\x01" * kernel.decision.MAX_CONTENT_BYTES])  # as decoded
    assert floor < 400
    assert (end.usage.input_tokens, end.usage.output_tokens) == (1200, 400 + 5)


def test_each_event_carries_the_bytes_the_runs_events_took_before_it() -> None:
    summary = kernel.RunSummary(Phase.RUNNING)
    event = RunEvent("stop", "uid", summary, time=1.0, stored_before=12_345)
    read = RunEvent.decode(event.encode(), seq=7)
    assert (read.stored_before, read.size) == (12_345, len(event.encode()))
    assert read.stored == 12_345 + len(event.encode())
    first = RunEvent.decode(RunEvent("stop", "uid", summary, time=1.0).encode(), seq=1)
    assert "storedBefore" not in first.encode().decode()  # 0 is not written
    assert first.stored_before == 0


async def test_a_run_at_its_event_bytes_bound_ends_checkpoint_failed_before_its_next_call(
    bus: Bus,
) -> None:
    # turn 0 stores about 1 MiB of tool results (the message cap), past a 256 KiB bound: the
    # next turn is not run, the run ends checkpoint_failed naming the setting
    settings = ConsumerSettings(concurrency=2, heartbeat=1.0, run_event_max_bytes=256 * 1024)
    events, fetch = await drive(
        bus, name="over-run-bound", script=script(text="Reading all pages."), settings=settings
    )
    assert fetch.calls == CALLS  # turn 0 ran (the run was under its bound before it)
    assert [e.kind for e in events] == ["admitted", "turn", "stop"]
    for index, event in enumerate(events):  # each event counts the ones before it
        assert event.stored_before == sum(e.size for e in events[:index])
        assert event.size == len(event.encode())
    end = events[-1].summary
    assert end.phase is Phase.CHECKPOINT_FAILED
    assert end.steps == 1  # no model call after the bound was reached
    assert f"at its limit of {256 * 1024} (AGENTRUN_RUN_EVENT_MAX_BYTES)" in (end.message or "")
    assert f"take {events[-1].stored_before} bytes" in (end.message or "")


class Loud:
    """A read tool whose errors hold a whole response body."""

    spec = ToolSpec("loud", "fails verbosely", {"type": "object"}, "read", False)

    async def run(self, arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        if arguments.get("crash"):
            raise RuntimeError("b" * 100_000)
        raise ToolError("the backend said: " + "a" * 100_000)


async def test_a_tool_error_is_cut_to_the_result_cap_like_any_result() -> None:
    calls = (
        kernel.CheckedCall("e1", "loud", {}),
        kernel.CheckedCall("e2", "loud", {"crash": True}),
    )
    context = ToolContext(namespace="ns", run_name="run", run_uid="uid", call_id="")
    settings = ToolRunSettings(max_result_bytes=4096)
    results = await toolrunner.run_batch(
        calls, tools={"loud": Loud()}, context=context, settings=settings, deadline=time.time() + 9
    )
    assert [(r.tool_call_id, r.fault) for r in results] == [
        ("e1", kernel.ToolFault.DOMAIN),
        ("e2", kernel.ToolFault.CRASHED),
    ]
    assert results[0].content.startswith("the backend said: aaa")
    assert results[1].content.startswith("the tool failed: RuntimeError: bbb")
    for result in results:
        assert len(result.content.encode()) < 4096 + 100
        assert "[agentrun: result truncated, " in result.content


async def test_the_bus_refuses_an_event_over_its_cap_without_sending_it(bus: Bus) -> None:
    summary = kernel.RunSummary(Phase.COMPLETED, answer="a" * bus.event_cap)
    event = RunEvent("stop", "uid-big", summary, time=1.0)
    with pytest.raises(EventTooLarge) as raised:
        await bus.append_event("ns", "big", event, expected_seq=None)
    assert raised.value.cap == bus.event_cap == 1024 * 1024 - 4096
    assert raised.value.size > bus.event_cap
    assert await bus.last_event("ns", "big") is None
    assert bus.nc.is_connected
