"""Every prompt the kernel builds meets the strictest providers' rules (``wire.conform``).

The inputs of the reported failures are kept as tests: the summary request after tool results,
the no-progress nudge after tool results, two truncation corrections in a row. The rules are
checked with ``agentrun.testing.strict``, written apart from ``conform``; the same checker makes
the scripted model server answer 400, as Mistral's API does.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun import kernel
from agentrun.kernel import Phase, wire
from agentrun.testing import strict

from .helpers import checked, tool_turn

NOW = kernel.Timing(now=1_000.0, deadline=2_000.0)


def prompt_of(state: kernel.RunState, limits: kernel.Limits) -> tuple[Any, ...]:
    step = kernel.plan_turn(
        state, limits, pricing=kernel.Pricing(), offer=kernel.Offer([]), clock=NOW
    )
    assert isinstance(step, kernel.CallModel)
    return step.prompt


def truncated(turn: int) -> kernel.TurnRecord:
    decision = kernel.Malformed(kernel.MalformedCause.TRUNCATED, "the reply hit the limit")
    return kernel.Answered(turn, decision)


def roles(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    return [m["role"] for m in messages]


# --------------------------------------------------------------------------- the reported inputs


def test_the_summary_request_after_tool_results_is_bridged_by_an_assistant_message() -> None:
    limits = kernel.Limits(max_steps=1)
    state = kernel.initial_state(goal="collatz", instructions="be brief")
    state = kernel.advance(state, tool_turn(state, checked("c1")), limits)
    assert state.pending_cap is Phase.MAX_STEPS
    assert state.messages[-1]["role"] == "tool"
    assert strict.violations([*state.messages, kernel.summary_request(Phase.MAX_STEPS)])
    prompt = prompt_of(state, limits)
    assert roles(prompt) == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert prompt[-2] == {"role": "assistant", "content": wire.BRIDGE}
    assert "reached its budget" in prompt[-1]["content"]
    assert strict.violations(prompt) == []


def test_the_no_progress_nudge_after_tool_results_is_bridged() -> None:
    limits = kernel.Limits(no_progress_window=1)
    state = kernel.initial_state(goal="poll")
    for call_id in ("c1", "c2"):
        state = kernel.advance(state, tool_turn(state, checked(call_id)), limits)
    assert "not making progress" in state.messages[-1]["content"]
    assert state.messages[-2]["role"] == "tool"
    assert strict.violations(state.messages)
    prompt = prompt_of(state, limits)
    assert roles(prompt)[-3:] == ["tool", "assistant", "user"]
    assert strict.violations(prompt) == []


def test_two_truncation_corrections_after_the_goal_are_one_user_message() -> None:
    limits = kernel.Limits()
    state = kernel.initial_state(goal="write a lot")
    state = kernel.advance(state, truncated(0), limits)
    state = kernel.advance(state, truncated(1), limits)
    assert roles(state.messages) == ["user", "user", "user"]
    prompt = prompt_of(state, limits)
    assert roles(prompt) == ["user"]
    assert prompt[0]["content"].startswith("write a lot\n\n[agentrun] ")
    assert prompt[0]["content"].count("cut off by the output token limit") == 2
    assert strict.violations(prompt) == []


def test_merged_messages_join_their_texts_and_a_message_without_text_adds_none() -> None:
    def user(content: Any) -> dict[str, Any]:
        return {"role": "user", "content": content}

    assert wire.conform([user("a"), user("b")]) == (user("a\n\nb"),)
    assert wire.conform([user("a"), user(None)]) == (user("a"),)
    assert wire.conform([user(""), user("b")]) == (user("b"),)
    assert wire.conform([user(None), user(None)]) == (user(""),)
    answer = {"role": "assistant", "content": None}
    assert wire.conform([user("q"), answer, {"role": "assistant", "content": "x"}]) == (
        user("q"),
        {"role": "assistant", "content": "x"},
    )


def test_a_late_system_message_goes_as_user_and_the_first_one_stays() -> None:
    system = {"role": "system", "content": "be brief"}
    goal = {"role": "user", "content": "go"}
    answer = {"role": "assistant", "content": "ok"}
    assert wire.conform([system, goal]) == (system, goal)
    assert wire.conform([goal, system]) == ({"role": "user", "content": "go\n\nbe brief"},)
    assert wire.conform([goal, answer, system]) == (
        goal,
        answer,
        {"role": "user", "content": "be brief"},
    )


def test_an_assistant_message_is_merged_into_the_one_before_only_if_that_made_no_call() -> None:
    goal = {"role": "user", "content": "go"}
    calling = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f"}}],
    }
    after = {"role": "assistant", "content": "done"}
    out = wire.conform([goal, calling, after])
    assert [m["role"] for m in out] == ["user", "assistant", "assistant"]
    assert out[1]["tool_calls"][0]["function"] == {"name": "f"} and out[2] == after


def test_ids_and_mangled_names_go_out_in_wire_form_and_keep_their_pairing() -> None:
    limits = kernel.Limits()
    state = kernel.initial_state(goal="list pods")
    calls = (checked("0:calculate:0"), checked("call_abc-1"))
    state = kernel.advance(state, tool_turn(state, *calls), limits)
    bad = kernel.InvalidCall("x" * 80, "list_pods<|channel|>json", "unknown tool")
    state = kernel.advance(state, tool_turn(state, bad), limits)
    prompt = prompt_of(state, limits)
    assert strict.violations(prompt) == []
    first, second = prompt[1]["tool_calls"], prompt[4]["tool_calls"]
    assert [c["id"] for c in first] == [
        wire.wire_call_id("0:calculate:0"),
        wire.wire_call_id("call_abc-1"),
    ]
    assert second[0]["function"]["name"] == "list_pods__channel__json"
    assert prompt[5]["tool_call_id"] == second[0]["id"]
    assert state.messages[1]["tool_calls"][0]["id"] == "0:calculate:0"  # history keeps its ids


def test_ids_that_hash_alike_are_told_apart_in_order_of_appearance() -> None:
    real = wire.wire_call_id

    def colliding(stored: str, *, salt: int = 0) -> str:  # every id's first two tries alike
        return {0: "AAAAAAAAA", 1: "BBBBBBBBB"}.get(salt) or real(stored, salt=salt)

    ids = ["a", "b", "c"]
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}}
                for i in ids
            ],
        },
        *({"role": "tool", "tool_call_id": i, "content": i} for i in ids),
    ]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(wire, "wire_call_id", colliding)
        out = wire.conform(messages)
    sent = [c["id"] for c in out[1]["tool_calls"]]
    assert sent == ["AAAAAAAAA", "BBBBBBBBB", real("c", salt=2)]  # salted 1, 2, … in turn
    assert [m["tool_call_id"] for m in out[2:]] == sent
    assert strict.violations(out) == []


@pytest.mark.parametrize(
    ("name", "sent"),
    [
        pytest.param("calculate", "calculate", id="valid-kept"),
        pytest.param("echo ", "echo_", id="trailing-space"),
        pytest.param("functions.echo", "functions_echo", id="dotted"),
        pytest.param("", "_", id="empty"),
        pytest.param("é" * 70, "_" * 64, id="non-ascii-too-long"),
    ],
)
def test_wire_name_meets_the_openai_function_name_rule(name: str, sent: str) -> None:
    assert wire.wire_name(name) == sent
    assert wire.WIRE_NAME.match(wire.wire_name(name))


# --------------------------------------------------------------------------- the property

CALL_IDS = st.sampled_from(["c1", "0:echo:0", "call_0_0", "x" * 60, "é", ""]) | st.text(max_size=12)
NAMES = st.sampled_from(["echo", "echo<|channel|>json", "", "a.b", "n" * 70]) | st.text(max_size=6)


@st.composite
def histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Any history the kernel stores: a system prompt or not, the goal, then turns of
    assistant answers, assistant tool calls with one result each in call order, and user notes
    (corrections, nudges, the summary request) wherever a turn may end."""
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(st.text(max_size=5))})
    messages.append({"role": "user", "content": draw(st.text(max_size=5))})
    used: set[str] = set()
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["calls", "calls", "final", "note"]))
        if kind == "final":
            messages.append({"role": "assistant", "content": draw(st.text(max_size=5))})
        elif kind == "calls":
            ids = draw(st.lists(CALL_IDS.filter(lambda i: i not in used), min_size=1, max_size=3))
            ids = list(dict.fromkeys(ids))
            used.update(ids)
            calls = [
                {"id": i, "type": "function", "function": {"name": draw(NAMES), "arguments": "{}"}}
                for i in ids
            ]
            messages.append(
                {
                    "role": "assistant",
                    "content": draw(st.none() | st.text(max_size=3)),
                    "tool_calls": calls,
                }
            )
            messages.extend({"role": "tool", "tool_call_id": i, "content": f"r-{i}"} for i in ids)
        for _ in range(draw(st.integers(0, 2))):
            messages.append({"role": "user", "content": draw(st.text(max_size=5))})
    if messages[-1]["role"] == "assistant":  # a stored answer ends the run: a note follows
        messages.append({"role": "user", "content": "[agentrun] note"})
    return messages


@settings(max_examples=300, deadline=None)
@given(history=histories())
def test_every_history_the_kernel_stores_goes_out_meeting_every_rule(
    history: list[dict[str, Any]],
) -> None:
    kept = copy.deepcopy(history)
    out = wire.conform(history)
    assert history == kept  # stored history is never rewritten, even where messages merge
    assert strict.violations(out) == []
    # each result still answers the call it answered in history: same position, same content
    by_wire: dict[str, str] = {}
    for message in out:
        for call in message.get("tool_calls") or ():
            by_wire[call["id"]] = call["function"]["name"]
        if message["role"] == "tool":
            assert message["tool_call_id"] in by_wire
    stored = [m["content"] for m in history if m["role"] == "tool"]
    assert [m["content"] for m in out if m["role"] == "tool"] == stored
    # no text is lost: every user and assistant text of history is in the prompt
    sent = "\n".join(str(m.get("content") or "") for m in out)
    for message in history:
        assert str(message.get("content") or "") in sent


@settings(max_examples=200, deadline=None)
@given(history=histories(), more=histories())
def test_a_prompt_s_ids_stay_the_same_as_its_history_grows(
    history: list[dict[str, Any]], more: list[dict[str, Any]]
) -> None:
    """Prompt caches see the same prefix turn after turn: earlier calls keep their wire ids."""
    before = [c["id"] for m in wire.conform(history) for c in m.get("tool_calls") or ()]
    grown = [*history, *(m for m in more if m["role"] != "system")]
    after = [c["id"] for m in wire.conform(grown) for c in m.get("tool_calls") or ()]
    assert after[: len(before)] == before
