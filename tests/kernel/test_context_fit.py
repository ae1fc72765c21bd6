"""``fit_context`` by its rule, values pinned by hand: a prompt that fits (``estimate_tokens``
of the messages and the tools at most ``contextWindow - maxOutputTokens``) goes as it is; one
that does not has its tool results of 256 characters or more replaced by a note, oldest first,
until it fits, each elision taking ``(len(result) - len(note)) // 4`` tokens off; the goal,
the system prompt, assistant messages and short results are never touched.

The history used: the goal (40 characters), an assistant message with two calls of ``t`` with
``{}`` (19 characters each with their framing) and their two results of 3,000 characters:
6,078 characters, 1,519 tokens, plus 4 framing tokens for each of the 4 messages and the reply:
1,539. An elided 3,000-character result is ``NOTE_3000`` (134 characters): 716 tokens less."""

from __future__ import annotations

from typing import Any

from agentrun import kernel

NOTE_3000 = (
    "[agentrun: an earlier tool result of 3000 characters was elided to fit the model's "
    "context window; call the tool again if you need it]"
)
NOTE_256 = NOTE_3000.replace("3000", "256")
TOOLS = [{"type": "function", "function": {"name": "t"}}]
"""45 characters as compact JSON."""
WHOLE = 1539
ONE_ELIDED = WHOLE - (3000 - 134) // 4  # 823


def assistant(*ids: str) -> dict[str, Any]:
    calls = [
        {"id": i, "type": "function", "function": {"name": "t", "arguments": "{}"}} for i in ids
    ]
    return {"role": "assistant", "content": None, "tool_calls": calls}


def result(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def history(goal: str = "g" * 40, first: str = "a" * 3000) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": goal},
        assistant("c1", "c2"),
        result("c1", first),
        result("c2", "b" * 3000),
    ]


def limits(budget: int) -> kernel.Limits:
    return kernel.Limits(context_window=budget + 1000, max_output_tokens=1000)


def test_a_prompt_of_exactly_the_budget_goes_as_it_is() -> None:
    fitted = kernel.fit_context(history(), limits=limits(WHOLE))
    assert fitted.messages == tuple(history()) and fitted.tokens == WHOLE


def test_eliding_stops_once_the_prompt_is_exactly_the_budget() -> None:
    fitted = kernel.fit_context(history(), limits=limits(ONE_ELIDED))
    assert fitted.tokens == ONE_ELIDED == 823
    assert [m["content"] for m in fitted.messages[2:]] == [NOTE_3000, "b" * 3000]


def test_every_large_result_is_elided_while_the_prompt_does_not_fit() -> None:
    fitted = kernel.fit_context(history(), limits=limits(ONE_ELIDED - 1))
    assert fitted.tokens == ONE_ELIDED - 716 == 107
    assert [m["content"] for m in fitted.messages[2:]] == [NOTE_3000, NOTE_3000]


def test_the_tools_count_toward_the_prompt() -> None:
    """With the tools' 45 characters the same history is 1,550 tokens: over a budget of
    1,539, so the oldest result goes."""
    fitted = kernel.fit_context(history(), limits=limits(WHOLE), tools=TOOLS)
    assert fitted.tokens == 1550 - 716
    assert fitted.messages[2]["content"] == NOTE_3000


def test_a_long_goal_and_short_results_are_never_elided() -> None:
    """A 400-character goal is kept whatever the budget; a short result before a large one
    is skipped, not where eliding stops."""
    messages = history(goal="g" * 400, first="ok")
    fitted = kernel.fit_context(messages, limits=limits(10))
    assert [m["content"] for m in fitted.messages] == ["g" * 400, None, "ok", NOTE_3000]


def test_a_result_of_256_characters_is_elided_and_one_of_255_kept() -> None:
    for size, kept in ((256, NOTE_256), (255, "a" * 255)):
        messages = [{"role": "user", "content": "g"}, assistant("c1"), result("c1", "a" * size)]
        fitted = kernel.fit_context(messages, limits=limits(10))
        assert fitted.messages[2]["content"] == kept, size


def test_the_model_is_sent_the_fitted_prompt_with_its_tools_counted() -> None:
    """``plan_turn`` fits the prompt with the run's tools: without them this history would go
    whole (1,539 tokens, the budget)."""
    state = kernel.RunState(messages=tuple(history()))
    step = kernel.plan_turn(
        state,
        limits(WHOLE),
        pricing=kernel.Pricing(),
        offer=kernel.Offer(TOOLS),
        clock=kernel.Timing(now=0.0, deadline=100.0),
    )
    assert isinstance(step, kernel.CallModel)
    assert [m.get("content") for m in step.prompt[2:]] == [NOTE_3000, "b" * 3000]
