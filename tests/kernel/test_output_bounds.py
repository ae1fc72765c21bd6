"""Oversized model output is the model's fault: the kernel bounds it before it is stored, so a
committed turn can never outgrow the bus's message cap, and the model gets a correction."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentrun import kernel
from agentrun.kernel import MalformedCause
from agentrun.kernel import decision as dec
from agentrun.protocol import events

from .helpers import TOOLS, call, response

HUGE_EXPRESSION = "1+" * 400_000 + "1"  # ~800 KB of arguments
HUGE_ARGS = json.dumps({"expression": HUGE_EXPRESSION})
OVER_CAP = "x" * (dec.MAX_CONTENT_BYTES + 1)

# (id, response, decision type, malformed cause or None, calls dropped)
CASES: list[tuple[str, dict[str, Any], type, MalformedCause | None, int]] = [
    (
        "800 KB of arguments: the call is dropped, not the reply",
        response(None, tool_calls=[call("calculate", HUGE_ARGS)]),
        kernel.ToolCalls,
        None,
        1,
    ),
    (
        "one oversized call beside a good one: only it is dropped",
        response(
            None,
            tool_calls=[
                call("calculate", {"expression": "1+1"}, id="a"),
                call("calculate", HUGE_ARGS, id="b"),
            ],
        ),
        kernel.ToolCalls,
        None,
        1,
    ),
    (
        "calls each under the cap but together over the batch cap: the excess is dropped",
        response(
            None,
            tool_calls=[
                call("ping", "{" + " " * (dec.MAX_ARGUMENTS_BYTES - 2) + "}", id=f"p{i}")
                for i in range(5)
            ],
        ),
        kernel.ToolCalls,
        None,
        1,
    ),
    (
        "a non-string arguments object over the cap is dropped",
        response(None, tool_calls=[call("calculate", {"expression": HUGE_EXPRESSION})]),
        kernel.ToolCalls,
        None,
        1,
    ),
    (
        "a final answer over the content cap is malformed",
        response(OVER_CAP),
        kernel.Malformed,
        MalformedCause.OVERSIZED,
        0,
    ),
    (
        "an answer exactly at the cap is accepted",
        response("y" * dec.MAX_CONTENT_BYTES),
        kernel.Final,
        None,
        0,
    ),
    (
        "arguments exactly at the cap are kept",
        response(None, tool_calls=[call("ping", "{" + " " * (dec.MAX_ARGUMENTS_BYTES - 2) + "}")]),
        kernel.ToolCalls,
        None,
        0,
    ),
]


@pytest.mark.parametrize(
    ("raw", "kind", "cause", "dropped"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_oversized_output_is_bounded_at_classification(
    raw: dict[str, Any], kind: type, cause: MalformedCause | None, dropped: int
) -> None:
    decision = kernel.classify(raw)
    assert isinstance(decision, kind)
    if cause is not None:
        assert isinstance(decision, kernel.Malformed)
        assert decision.cause is cause
    calls = decision.calls if isinstance(decision, kernel.ToolCalls) else ()
    assert sum(c.dropped is not None for c in calls) == dropped
    stored = json.dumps(events.decision_as_dict(decision))
    batch = dec.MAX_BATCH_ARGUMENTS_BYTES + 2 * dec.MAX_CONTENT_BYTES
    assert len(stored.encode()) <= batch + 4096
    assert events.decision_from_dict(json.loads(stored)) == decision


def test_a_dropped_call_is_an_error_result_naming_the_cap_and_stored_as_empty_arguments() -> None:
    decision = kernel.classify(response(None, tool_calls=[call("calculate", HUGE_ARGS, id="big")]))
    assert isinstance(decision, kernel.ToolCalls)
    [placeholder] = decision.calls
    assert placeholder.dropped == len(HUGE_ARGS)
    assert len(placeholder.arguments) < dec.PLACEHOLDER_CHARS + 64
    [checked] = kernel.check_calls(decision.calls, turn=0, tools=TOOLS)
    assert isinstance(checked, kernel.InvalidCall)
    assert f"{len(HUGE_ARGS)} bytes, over the {dec.MAX_ARGUMENTS_BYTES}-byte cap" in checked.error


def test_oversized_text_beside_tool_calls_is_cut_with_a_marker() -> None:
    decision = kernel.classify(response(OVER_CAP + "é" * 10, tool_calls=[call("ping", "{}")]))
    assert isinstance(decision, kernel.ToolCalls)
    assert decision.content is not None
    assert decision.content.startswith("x" * 1000)
    assert "[agentrun: cut, " in decision.content
    assert len(decision.content.encode()) < dec.MAX_CONTENT_BYTES + 64


def test_an_oversized_reply_is_a_correction_that_counts_toward_invalid_decision() -> None:
    limits = kernel.Limits()
    state = kernel.initial_state(goal="sum", instructions="be brief")
    for _ in range(limits.malformed_limit):
        decision = kernel.classify(response(None, tool_calls=[call("calculate", HUGE_ARGS)]))
        assert isinstance(decision, kernel.ToolCalls)
        calls = kernel.check_calls(decision.calls, turn=state.turn, tools=TOOLS)
        results = tuple(
            kernel.ToolResult(c.id, c.name, c.error, True, kernel.ToolFault.ARGUMENTS)
            for c in calls
            if isinstance(c, kernel.InvalidCall)
        )
        record = kernel.Answered(
            state.turn, decision=decision, calls=calls, results=results, usage=kernel.Usage(100, 10)
        )
        state = kernel.advance(state, record, limits)
    assert state.corrections == limits.malformed_limit
    assert state.phase is kernel.Phase.INVALID_DECISION
    assert state.usage.input_tokens == 100 * limits.malformed_limit
