"""The fold of an answered turn (``kernel.advance`` of an ``Answered`` record), exactly: the
counters a clean tool turn moves and the ones it leaves, the assistant message in wire form,
each phase's message whole (``make mutate`` found these checked only in part)."""

from __future__ import annotations

import dataclasses

from agentrun import kernel
from agentrun.kernel import Phase

from .helpers import checked, tool_turn


def start() -> kernel.RunState:
    return kernel.initial_state(goal="g")


def test_a_clean_tool_turn_moves_its_counters_and_leaves_the_others() -> None:
    state = dataclasses.replace(start(), call_ids=frozenset({"c0"}))
    record = tool_turn(state, checked("c1", "1+1"))
    after = kernel.advance(state, record, kernel.Limits())
    assert after == dataclasses.replace(
        state,
        messages=after.messages,
        turn=1,
        steps=1,
        tool_calls=1,
        usage=kernel.Usage(100, 10),
        call_ids=frozenset({"c0", "c1"}),
        signatures=after.signatures,
        message="turn 0 committed",
    )
    assert len(after.signatures) == 1
    assert after.messages[len(state.messages) :] == (
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "calculate", "arguments": '{"expression":"1+1"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    )


def test_a_final_answer_completes_with_no_signature_and_no_output_failure() -> None:
    state = start()
    record = kernel.Answered(0, kernel.Final("done"), kernel.Usage(10, 2))
    after = kernel.advance(state, record, kernel.Limits())
    assert (after.phase, after.message) == (Phase.COMPLETED, "the model gave a final answer")
    assert (after.signatures, after.output_failures, after.answer) == (frozenset(), 0, "done")


def test_an_effect_left_unknown_in_an_ordinary_turn_ends_the_run_with_the_first_one() -> None:
    state = start()
    calls = (checked("c1"), checked("c2"))
    record = tool_turn(state, *calls, ok=False, fault=kernel.ToolFault.EFFECT_UNKNOWN)
    results = tuple(
        dataclasses.replace(r, content=f"unknown {r.tool_call_id}") for r in record.results
    )
    after = kernel.advance(state, dataclasses.replace(record, results=results), kernel.Limits())
    assert (after.phase, after.message) == (Phase.EFFECT_UNKNOWN, "unknown c1")


def test_a_cap_with_a_summary_to_come_says_so() -> None:
    limits = kernel.Limits(max_steps=1)
    after = kernel.advance(start(), tool_turn(start(), checked()), limits)
    assert after.phase is Phase.RUNNING and after.pending_cap is Phase.MAX_STEPS
    assert after.message == (
        "maxSteps 1 reached while the model still wanted to act; asking for a summary"
    )
