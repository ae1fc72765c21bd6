"""``classify`` of replies that cannot run, exactly: a reply cut at the token limit and one
over ``MAX_CALLS_PER_REPLY`` calls become ``Malformed`` with the text the model reads next (the
reply's own content kept), and a call's arguments are read as valid Unicode: a placeholder
for arguments over the cap starts with their own first characters, and half a surrogate pair
becomes U+FFFD (once per byte of its UTF-8 form)."""

from __future__ import annotations

from typing import Any

from agentrun import kernel
from agentrun.kernel.decision import (
    MAX_ARGUMENTS_BYTES,
    MAX_BATCH_ARGUMENTS_BYTES,
    MAX_CALLS_PER_REPLY,
    NULL_BYTES,
)

from .helpers import call, response


def cut(reply: dict[str, Any]) -> dict[str, Any]:
    reply["choices"][0]["finish_reason"] = "length"
    return reply


def test_a_reply_cut_in_its_tool_calls_names_how_many_and_keeps_its_content() -> None:
    reply = cut(response("let me", tool_calls=[call("ping", "{}", id="a"), call("ping", "{")]))
    assert kernel.classify(reply) == kernel.Malformed(
        kernel.MalformedCause.TRUNCATED,
        "the output hit the token limit in the middle of 2 tool call(s); nothing was run",
        "let me",
    )


def test_a_reply_cut_in_its_answer_says_so() -> None:
    assert kernel.classify(cut(response("the answer is"))) == kernel.Malformed(
        kernel.MalformedCause.TRUNCATED,
        "the output hit the token limit in the middle of the answer; nothing was run",
        "the answer is",
    )


def test_a_reply_over_the_calls_cap_runs_none_and_names_the_cap() -> None:
    calls = [call("ping", "{}", id=f"c{i}") for i in range(MAX_CALLS_PER_REPLY + 1)]
    assert kernel.classify(response("all of them", tool_calls=calls)) == kernel.Malformed(
        kernel.MalformedCause.TOO_MANY_CALLS,
        f"the reply holds {MAX_CALLS_PER_REPLY + 1} tool calls, over the 128 one reply may "
        "make; none of them was run",
        "all of them",
    )


def test_arguments_over_the_cap_keep_their_first_characters_in_the_placeholder() -> None:
    arguments = '{"text": "' + "x" * MAX_ARGUMENTS_BYTES + '"}'
    decision = kernel.classify(response(None, tool_calls=[call("ping", arguments)]))
    assert isinstance(decision, kernel.ToolCalls)
    [dropped] = decision.calls
    size = len(arguments)
    assert dropped.dropped == size
    assert dropped.arguments == arguments[:256] + f"…[{size} bytes dropped]"


def test_half_a_surrogate_pair_in_arguments_becomes_replacement_characters() -> None:
    decision = kernel.classify(response(None, tool_calls=[call("ping", '{"a": "x\ud83dy"}')]))
    assert isinstance(decision, kernel.ToolCalls)
    assert decision.calls[0].arguments == '{"a": "x\ufffd\ufffd\ufffdy"}'


def held(arguments: Any) -> dict[str, Any]:
    """A call whose ``arguments`` an answer sent whole holds as they are (no JSON text)."""
    return {"id": "h", "type": "function", "function": {"name": "ping", "arguments": arguments}}


def calls_of(*raw: dict[str, Any]) -> tuple[kernel.ToolCall, ...]:
    decision = kernel.classify(response(None, tool_calls=list(raw)))
    assert isinstance(decision, kernel.ToolCalls)
    return decision.calls


def test_arguments_an_answer_holds_as_an_object_are_its_json_text_non_ascii_kept() -> None:
    (kept,) = calls_of(held({"q": "é", "n": [1]}))
    assert kept.arguments == '{"q": "é", "n": [1]}'
    assert kept.dropped is None


def test_arguments_of_no_json_type_are_dropped_as_past_the_batch_cap() -> None:
    """Only a caller's own objects can be such (an answer read from JSON holds none); kept,
    the turn's record could not be encoded."""
    (dropped,) = calls_of(held({"q": {"a set"}}))
    assert dropped.dropped == MAX_BATCH_ARGUMENTS_BYTES + 1
    assert dropped.arguments == f"dict…[{MAX_BATCH_ARGUMENTS_BYTES + 1} bytes dropped]"


def test_a_call_without_arguments_keeps_none_and_takes_the_bytes_of_null_in_the_batch() -> None:
    """Four calls fill the batch cap with the ``null`` of the first; a byte more drops the
    last."""
    assert NULL_BYTES == 4
    whole = ["x" * MAX_ARGUMENTS_BYTES] * 3
    last = MAX_BATCH_ARGUMENTS_BYTES - NULL_BYTES - 3 * MAX_ARGUMENTS_BYTES
    for extra, dropped in ((0, None), (1, last + 1)):
        texts = [*whole, "x" * (last + extra)]
        more = (call("ping", text, id=f"c{i}") for i, text in enumerate(texts))
        found = calls_of(held(None), *more)
        assert found[0].arguments is None
        assert [c.dropped for c in found] == [None, None, None, None, dropped]


def test_a_response_without_a_message_says_what_it_lacks() -> None:
    for raw in ({}, {"choices": []}, {"choices": [{"message": "text"}]}):
        assert kernel.classify(raw) == kernel.Malformed(
            kernel.MalformedCause.NO_CHOICE, "the response has no choices[0].message"
        ), raw


def test_a_refusal_keeps_its_text() -> None:
    reply = response("ignored")
    reply["choices"][0]["message"]["refusal"] = "I can't help with that"
    assert kernel.classify(reply) == kernel.Refusal("I can't help with that")


def test_finish_reason_tool_calls_without_calls_is_malformed_with_its_content_kept() -> None:
    reply = response("I will call a tool")
    reply["choices"][0]["finish_reason"] = "tool_calls"
    assert kernel.classify(reply) == kernel.Malformed(
        kernel.MalformedCause.EMPTY_TOOL_CALLS,
        "finish_reason was tool_calls but the response holds no tool calls",
        "I will call a tool",
    )


def test_calls_with_blank_content_carry_no_content() -> None:
    for content, kept in (("  \n", None), ("", None), (None, None), ("thinking", "thinking")):
        decision = kernel.classify(response(content, tool_calls=[call("ping", "{}")]))
        assert isinstance(decision, kernel.ToolCalls)
        assert decision.content == kept, content
