"""What the runtime tells the model and records about its replies, word for word: the
corrective message each malformed reply earns and the details of an empty or oversized answer
(``decision``, ``transcript``), the output-schema correction, the no-progress nudge, the
summary request at a budget cap, the ids minted for calls that came without one, and what a
turn's no-progress signature tells apart. The model reads these texts, and a changed word
changes runs; a change here is a decision, made in this file."""

from __future__ import annotations

import pytest

from agentrun.kernel.decision import (
    MAX_CONTENT_BYTES,
    PLACEHOLDER_CHARS,
    Final,
    Malformed,
    MalformedCause,
    Refusal,
    classify,
)
from agentrun.kernel.limits import Limits
from agentrun.kernel.records import ToolResult
from agentrun.kernel.terminal import Phase
from agentrun.kernel.transcript import (
    correction_for,
    correction_notes,
    nudge,
    signature,
    summary_request,
)
from agentrun.kernel.validate import mint_call_id

from .helpers import response

HINTS = {
    MalformedCause.TRUNCATED: "Your reply was cut off by the output token limit. Be shorter: "
    "make fewer or smaller tool calls, or give a concise answer.",
    MalformedCause.OVERSIZED: "Give a shorter final answer.",
    MalformedCause.TOO_MANY_CALLS: "Make fewer tool calls in one reply, and spread the work "
    "over several turns.",
    MalformedCause.UNSTORABLE: "Make fewer tool calls in one reply, ask the tools for less "
    "output, and keep your text and arguments short.",
    MalformedCause.EMPTY_TOOL_CALLS: "Your reply said it calls tools but held no tool calls. "
    "Call a tool with valid arguments, or give your final answer.",
    MalformedCause.EMPTY: "Your reply was empty. Call a tool, or give your final answer.",
    MalformedCause.NO_CHOICE: "Your reply was empty. Call a tool, or give your final answer.",
    MalformedCause.INVALID_TOOL_CALLS: "Your reply was empty. Call a tool, or give your final "
    "answer.",
}


@pytest.mark.parametrize("cause", list(MalformedCause))
def test_each_malformed_reply_earns_its_detail_and_its_hint(cause: MalformedCause) -> None:
    message = correction_for(Malformed(cause, "the detail"))
    assert message == f"[agentrun] the detail. {HINTS[cause]}"


def test_usable_decisions_earn_no_correction() -> None:
    assert correction_for(Final("done")) is None and correction_for(Refusal("no")) is None


def test_the_notes_after_a_turn_come_in_order_each_as_a_user_message() -> None:
    limits = Limits(output_schema={"type": "object", "required": ["b", "a"]}, no_progress_window=4)
    notes = correction_notes(
        Malformed(MalformedCause.OVERSIZED, "too long"),
        "'a' is required",
        nudged=True,
        limits=limits,
    )
    assert notes == (
        {"role": "user", "content": "[agentrun] too long. Give a shorter final answer."},
        {
            "role": "user",
            "content": "[agentrun] Your final answer does not meet the required output schema: "
            "'a' is required. Reply with only a JSON document valid against: "
            '{"required":["b","a"],"type":"object"}',
        },
        {
            "role": "user",
            "content": "[agentrun] Your last 4 turns produced tool results you had already seen: "
            "you are not making progress. Try a different approach, or give your final answer.",
        },
    )
    assert correction_notes(Final("ok"), None, nudged=False, limits=limits) == ()


def test_the_nudge_and_the_summary_request_name_the_window_and_the_cap() -> None:
    assert nudge(2).startswith("[agentrun] Your last 2 turns produced")
    assert summary_request(Phase.TOKEN_BUDGET_EXHAUSTED) == {
        "role": "user",
        "content": "[agentrun] The run has reached its budget (token_budget_exhausted) and "
        "cannot call tools any more. Summarize what you found so far and what remains open, in "
        "a few sentences.",
    }


def test_an_empty_or_oversized_answer_is_malformed_with_these_details() -> None:
    empty = classify(response("   "))
    assert empty == Malformed(
        MalformedCause.EMPTY, "the response has neither content nor tool calls"
    )
    whole = "é" * MAX_CONTENT_BYTES  # twice the cap in bytes
    oversized = classify(response(whole))
    assert oversized == Malformed(
        MalformedCause.OVERSIZED,
        f"the answer is {2 * MAX_CONTENT_BYTES} bytes, over the {MAX_CONTENT_BYTES}-byte cap; "
        "it was cut and not accepted",
        "é" * PLACEHOLDER_CHARS + "…",
    )


def test_a_minted_call_id_is_turn_tool_and_ordinal_with_the_tool_name_made_safe() -> None:
    assert mint_call_id(3, "srv__read file!", 2) == "3:srv__read_file_:2"
    assert mint_call_id(0, "a-b_c9", 0) == "0:a-b_c9:0"
    assert mint_call_id(1, "", 4) == "1:tool:4"
    assert mint_call_id(1, "x" * 70, 0) == f"1:{'x' * 64}:0"


def test_a_turns_signature_tells_an_error_from_a_success_with_the_same_text() -> None:
    ok = [ToolResult("c1", "srv__read", "same")]
    failed = [ToolResult("c1", "srv__read", "same", is_error=True)]
    assert signature(ok, frozenset()) != signature(failed, frozenset())
    assert signature(ok, frozenset()) == signature(
        [ToolResult("c9", "srv__read", "same")], frozenset()
    )
    assert signature(ok, frozenset({"srv__read"})) is None
