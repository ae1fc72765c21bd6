"""What agentrun writes into a model's conversation, pinned to literals: the model reads these
words (a changed word changes what it does next), so a test compares them with the text, never
with the function that builds it. Also the bytes a reply takes in its record, which sizes what
the turn's tool results may take (``bounds.reply_size``, ``results_budget``)."""

from __future__ import annotations

import pytest

from agentrun import kernel
from agentrun.kernel import bounds
from agentrun.kernel.context import elided_note
from agentrun.kernel.transcript import nudge
from agentrun.kernel.usage import completion_texts

from .helpers import TOOLS


def test_the_no_progress_nudge() -> None:
    assert nudge(3) == (
        "[agentrun] Your last 3 turns produced tool results you had already seen: you are not "
        "making progress. Try a different approach, or give your final answer."
    )


def test_the_note_in_place_of_an_elided_tool_result() -> None:
    assert elided_note(1200) == (
        "[agentrun: an earlier tool result of 1200 characters was elided to fit the model's "
        "context window; call the tool again if you need it]"
    )


def test_a_call_whose_arguments_were_dropped_is_told_the_cap_and_what_to_do() -> None:
    dropped = kernel.ToolCall("c1", "calculate", None, dropped=900_000)
    (result,) = kernel.check_calls([dropped], turn=0, tools=TOOLS)
    assert isinstance(result, kernel.InvalidCall)
    assert result.error == (
        "the arguments were 900000 bytes, over the 65536-byte cap per call (or the cap for all "
        "calls of one reply); the call did not run. Pass smaller arguments, or split the work "
        "into several calls"
    )


NOT_JSON = {
    "NaN": "NaN is not a JSON number (RFC 8259 has no NaN or Infinity)",
    "Infinity": "Infinity is not a JSON number (RFC 8259 has no NaN or Infinity)",
    "-Infinity": "-Infinity is not a JSON number (RFC 8259 has no NaN or Infinity)",
    "1e999": "1e999 is out of range for a JSON number",
    "-1e999": "-1e999 is out of range for a JSON number",
}


@pytest.mark.parametrize("number", NOT_JSON)
def test_nan_infinity_or_a_number_past_a_doubles_range_is_named_as_not_json(number: str) -> None:
    call = kernel.ToolCall("c1", "calculate", f'{{"expression": {number}}}')
    (result,) = kernel.check_calls([call], turn=0, tools=TOOLS)
    assert isinstance(result, kernel.InvalidCall)
    assert result.error.startswith(
        f"arguments are not valid JSON: {NOT_JSON[number]}. The tool's schema: "
    )


def test_a_refusal_s_text_is_model_output() -> None:
    assert completion_texts({"content": None, "refusal": "I can't help"}) == ["I can't help"]
    assert completion_texts({"content": "a", "refusal": "b"}) == ["a", "b"]


@pytest.mark.parametrize(
    "decision",
    [
        kernel.Final("hello"),
        kernel.Refusal("hello"),
        kernel.ToolCalls((), "hello"),
    ],
    ids=["final", "refusal", "tool-calls"],
)
def test_a_reply_s_text_counts_in_its_size_byte_for_byte(decision: kernel.Decision) -> None:
    assert bounds.reply_size(kernel.Answered(0, decision)) == 5


def test_tool_calls_without_text_take_no_bytes_for_it() -> None:
    assert bounds.reply_size(kernel.Answered(0, kernel.ToolCalls((), None))) == 0


def test_the_results_budget_at_small_caps() -> None:
    """Half the cap, less what the reserve leaves; never below nothing."""
    reserved = bounds.RESERVED_BYTES
    assert kernel.results_budget(2 * reserved) == reserved
    assert kernel.results_budget(2 * reserved, reply_bytes=1) == reserved - 1
    assert kernel.results_budget(reserved) == 0
    assert kernel.results_budget(reserved // 2) == 0


def test_a_calls_schema_is_shown_as_compact_json_with_sorted_keys() -> None:
    """An invalid call's error ends with the tool's schema as the model reads it."""
    schema = kernel.ToolSchema(
        "shape",
        {"type": "object", "required": ["b"], "properties": {"b": {"type": "string"}}},
    )
    call = kernel.ToolCall("c1", "shape", "{}")
    (result,) = kernel.check_calls([call], turn=0, tools={"shape": schema})
    assert isinstance(result, kernel.InvalidCall)
    assert result.error.endswith(
        'The tool\'s schema: {"properties":{"b":{"type":"string"}},"required":["b"],'
        '"type":"object"}'
    )


def test_a_run_starts_with_its_instructions_as_the_system_message_and_its_goal() -> None:
    state = kernel.initial_state(goal="add 2 and 3", instructions="be brief")
    assert state.messages == (
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "add 2 and 3"},
    )
    assert state.message == "admitted" and state.turn == 0
    assert kernel.initial_state(goal="g").messages == ({"role": "user", "content": "g"},)
