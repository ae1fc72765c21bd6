"""Classification: a raw response becomes exactly one typed decision, before anything runs."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun import kernel
from agentrun.kernel import MalformedCause

from .helpers import call, response

CASES: list[tuple[str, dict[str, Any], type, Any]] = [
    ("plain final answer", response("The area is 12."), kernel.Final, None),
    (
        "content with a tool call runs the call and keeps the text",
        response("Let me check.", tool_calls=[call("ping", "{}")]),
        kernel.ToolCalls,
        None,
    ),
    (
        "finish_reason stop with tool calls: decide on the calls",
        response(None, tool_calls=[call("ping", "{}")], finish_reason="stop"),
        kernel.ToolCalls,
        None,
    ),
    (
        "empty tool_calls with finish tool_calls is malformed",
        response(None, tool_calls=[], finish_reason="tool_calls"),
        kernel.Malformed,
        MalformedCause.EMPTY_TOOL_CALLS,
    ),
    (
        "refusal ends the run",
        response(None, refusal="I can't help with that."),
        kernel.Refusal,
        None,
    ),
    (
        "truncated tool call is never run",
        response(None, tool_calls=[call("calculate", '{"expre')], finish_reason="length"),
        kernel.Malformed,
        MalformedCause.TRUNCATED,
    ),
    (
        "truncated prose is not an answer",
        response("The answer is", finish_reason="length"),
        kernel.Malformed,
        MalformedCause.TRUNCATED,
    ),
    ("blank final answer is malformed", response("   "), kernel.Malformed, MalformedCause.EMPTY),
    (
        "null content and no calls is malformed",
        response(None),
        kernel.Malformed,
        MalformedCause.EMPTY,
    ),
    (
        "content filter without text is a refusal",
        response(None, finish_reason="content_filter"),
        kernel.Refusal,
        None,
    ),
    ("no choices at all", {"choices": []}, kernel.Malformed, MalformedCause.NO_CHOICE),
    ("choices is not a list", {"choices": "x"}, kernel.Malformed, MalformedCause.NO_CHOICE),
    (
        "message is not an object",
        {"choices": [{"message": "hi"}]},
        kernel.Malformed,
        MalformedCause.NO_CHOICE,
    ),
]


@pytest.mark.parametrize(
    ("raw", "kind", "cause"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_classify_sorts_every_response_shape(raw: dict[str, Any], kind: type, cause: Any) -> None:
    decision = kernel.classify(raw)
    assert isinstance(decision, kind)
    if cause is not None:
        assert isinstance(decision, kernel.Malformed)
        assert decision.cause is cause


def test_text_alongside_calls_is_kept() -> None:
    decision = kernel.classify(response("Let me check.", tool_calls=[call("ping", "{}")]))
    assert isinstance(decision, kernel.ToolCalls)
    assert decision.content == "Let me check."
    assert decision.calls[0].name == "ping"


def test_garbage_tool_call_entries_do_not_crash() -> None:
    decision = kernel.classify(response(None, tool_calls=[{"id": 3}, "x", {"function": None}]))  # type: ignore[list-item]
    assert isinstance(decision, kernel.ToolCalls)
    assert [c.name for c in decision.calls] == ["", "", ""]
    assert all(c.id is None for c in decision.calls)


def test_a_filtered_answer_is_a_refusal_naming_the_flagged_categories() -> None:
    """Azure OpenAI answers 200 with ``finish_reason: content_filter`` and per-category verdicts."""
    raw = response("Here is how to", finish_reason="content_filter")
    raw["choices"][0]["content_filter_results"] = {
        "hate": {"filtered": False, "severity": "safe"},
        "violence": {"filtered": True, "severity": "medium"},
        "self_harm": {"filtered": True, "severity": "high"},
    }
    decision = kernel.classify(raw)
    assert decision == kernel.Refusal(
        "the provider's content filter stopped the output: self_harm, violence"
    )
    plain = kernel.classify(response(None, finish_reason="content_filter"))
    assert plain == kernel.Refusal(
        "the provider's content filter stopped the output: unspecified category"
    )
