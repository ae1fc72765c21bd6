"""The payloads a worker reads: parsed once at the edge, malformed ones refused whole."""

from __future__ import annotations

import dataclasses
import json
from decimal import Decimal

import pytest

from agentrun import kernel, protocol
from agentrun.protocol import ModelConfig, RunConfig, RunEvent, SecretRef, TurnRequest

CONFIG = RunConfig(
    uid="uid-1",
    namespace="ns",
    name="run",
    goal="g",
    instructions="be brief",
    tools=("calculate",),
    limits=kernel.Limits(
        max_steps=7,
        max_cost_usd=Decimal("0.25"),
        context_window=32_000,
        max_output_tokens=1_000,
        pollable=frozenset({"calculate"}),
        on_exhausted=kernel.OnExhausted.STOP,
        output_schema={"type": "object"},
    ),
    model=ModelConfig(
        "mock",
        "http://model.invalid/v1",
        "scripted",
        kernel.Pricing(Decimal("2.50"), Decimal("1.25"), Decimal("10")),
        32_000,
        1_000,
        SecretRef("key", "ns"),
    ),
    deadline=1_700_000_060.5,
    tenant="team-a",
    output_schema={"type": "object"},
    traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01",
)


def test_a_turn_request_round_trips() -> None:
    request = TurnRequest("uid-1", "ns", "run", 3, 42, stored=4096)
    assert protocol.decode_turn_request(protocol.encode_turn_request(request)) == request
    assert json.loads(protocol.encode_turn_request(request)) == {
        "schemaVersion": protocol.SCHEMA_VERSION,
        "runUID": "uid-1",
        "namespace": "ns",
        "name": "run",
        "turn": 3,
        "expectedSeq": 42,
        "stored": 4096,
    }


def test_a_turn_request_of_an_older_operator_has_no_stored_bytes() -> None:
    """Written before requests carried the run's stored bytes: read as 0 (a light turn's
    memory); and an older worker reads a newer request, ignoring the field it does not know."""
    old = b'{"runUID": "u", "namespace": "ns", "name": "r", "turn": 1, "expectedSeq": 7}'
    assert protocol.decode_turn_request(old) == TurnRequest("u", "ns", "r", 1, 7, stored=0)
    newer = json.loads(old) | {"stored": 9, "someLaterField": [1]}
    decoded = protocol.decode_turn_request(json.dumps(newer).encode())
    assert decoded == TurnRequest("u", "ns", "r", 1, 7, stored=9)


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(b'{"runUID": "u", "namespace": "ns", "name": "r", "turn": 1}', id="missing"),
        pytest.param(
            b'{"runUID": "u", "namespace": "ns", "name": "r", "turn": "one", "expectedSeq": 1}',
            id="not a number",
        ),
        pytest.param(
            b'{"runUID": "u", "namespace": "ns", "name": "r", "turn": 1, "expectedSeq": 1, '
            b'"stored": -1}',
            id="negative stored bytes",
        ),
        pytest.param(b"[1, 2]", id="not an object"),
        pytest.param(b"{", id="not JSON"),
    ],
)
def test_a_malformed_turn_request_is_refused(payload: bytes) -> None:
    with pytest.raises(ValueError):
        protocol.decode_turn_request(payload)


def test_an_admitted_event_carries_the_config_whole() -> None:
    state = kernel.initial_state(goal=CONFIG.goal, instructions=CONFIG.instructions)
    event = RunEvent("admitted", CONFIG.uid, state.summary(), config=CONFIG, time=1.0)
    decoded = RunEvent.decode(event.encode(), seq=1)
    assert decoded.config == CONFIG
    assert decoded.summary == state.summary()
    assert json.loads(event.encode())["config"]["model"]["pricing"] == {
        "inputPerMillionUSD": "2.50",
        "cachedInputPerMillionUSD": "1.25",
        "outputPerMillionUSD": "10",
    }


def test_an_event_whose_config_lacks_a_field_is_refused() -> None:
    state = kernel.initial_state(goal="g")
    data = json.loads(RunEvent("admitted", "uid-1", state.summary(), config=CONFIG).encode())
    del data["config"]["limits"]["maxSteps"]  # no default is guessed on the wire
    with pytest.raises(ValueError, match="maxSteps"):
        RunEvent.decode(json.dumps(data).encode())


def test_a_record_without_its_kind_is_refused() -> None:
    state = kernel.initial_state(goal="g")
    record = kernel.Answered(0, kernel.Final("x"))
    data = json.loads(RunEvent("turn", "uid-1", state.summary(), record=record).encode())
    assert data["record"]["kind"] == "answered"
    del data["record"]["kind"]
    with pytest.raises(ValueError, match="unknown turn record kind"):
        RunEvent.decode(json.dumps(data).encode())


def test_a_committed_decision_keeps_its_deferred_call_ids_on_the_wire() -> None:
    calls = (kernel.CheckedCall("w1", "deploy", {"app": "web"}), kernel.CheckedCall("r1", "ls", {}))
    decision = kernel.ToolCalls(tuple(kernel.ToolCall(c.id, c.name, "{}") for c in calls), None)
    record = kernel.Answered(0, decision, kernel.Usage(10, 2), calls, deferred=("w1", "r1"))
    state = kernel.initial_state(goal="g")
    event = RunEvent("turn", "uid-1", state.summary(), record=record)
    assert RunEvent.decode(event.encode()).record == record
    data = json.loads(event.encode())
    assert data["record"]["deferred"] == ["w1", "r1"]
    del data["record"]["deferred"]  # a record written before calls were deferred
    old = RunEvent.decode(json.dumps(data).encode()).record
    assert isinstance(old, kernel.Answered) and old.deferred == ()


def test_an_mcp_tool_carries_its_rules_path_prefix_and_an_older_config_the_whole_origin() -> None:
    """``pathPrefix`` is an optional field (the schema version stays): a config written before
    it reads as ``/``, every path of the URL's origin, as those releases allowed."""
    tool = protocol.RemoteTool(
        "docs__search", "docs", "search", "", {}, "read", "https://gw.example/a/sse", "SSE", 5.0
    )
    config = dataclasses.replace(
        CONFIG, remote_tools=(dataclasses.replace(tool, path_prefix="/a/"),)
    )
    state = kernel.initial_state(goal=config.goal)
    data = json.loads(RunEvent("admitted", config.uid, state.summary(), config=config).encode())
    assert data["config"]["remoteTools"][0]["pathPrefix"] == "/a/"
    assert RunEvent.decode(json.dumps(data).encode()).config == config
    del data["config"]["remoteTools"][0]["pathPrefix"]
    old = RunEvent.decode(json.dumps(data).encode()).config
    assert old is not None and old.remote_tools == (tool,)
    assert old.remote_tools[0].path_prefix == "/"
