"""How a run ends, in the kernel's own terms: the resource phase each terminal reason shows,
a stop from outside the turn, a turn that ended before any model call, and the counters-only
state the operator rebuilds from a summary. Written from ``make mutate``'s survivors in
``kernel.terminal`` and ``kernel.loop`` (tests/README.md)."""

from __future__ import annotations

import dataclasses

import pytest

from agentrun import kernel
from agentrun.kernel import Phase, output

from .helpers import checked, tool_turn

ENDS = [
    # (phase, the AgentRun phase it shows)
    (Phase.COMPLETED, "Succeeded"),
    (Phase.CANCELLED, "Cancelled"),
    *(
        (phase, "Failed")
        for phase in Phase
        if phase.is_terminal and phase not in (Phase.COMPLETED, Phase.CANCELLED)
    ),
]


@pytest.mark.parametrize(("phase", "shown"), ENDS, ids=[p.value for p, _ in ENDS])
def test_every_end_shows_its_resource_phase_whatever_the_steps(phase: Phase, shown: str) -> None:
    for steps in (0, 1):
        terminal = kernel.conclude(phase, steps=steps)
        assert terminal is not None and terminal.resource_phase.value == shown


def test_a_stop_from_outside_the_turn_ends_the_run_with_its_message_once() -> None:
    state = kernel.initial_state(goal="g")
    stopped = kernel.stop(state, Phase.CANCELLED, "the AgentRun was deleted")
    assert (stopped.phase, stopped.message) == (Phase.CANCELLED, "the AgentRun was deleted")
    assert kernel.stop(stopped, Phase.DEADLINE_EXCEEDED, "late") == stopped


def test_a_turn_that_ended_before_its_model_call_only_moves_the_turn_and_the_phase() -> None:
    limits = kernel.Limits()
    bad = kernel.Malformed(kernel.MalformedCause.EMPTY_TOOL_CALLS, "no calls")
    state = kernel.advance(kernel.initial_state(goal="g"), kernel.Answered(0, decision=bad), limits)
    assert (state.turn, state.malformed_streak) == (1, 1)
    ending = kernel.Ending(Phase.TENANT_BUDGET_EXHAUSTED, "tenant 'acme' tokens: used up")
    after = kernel.advance(state, kernel.Stopped(1, ending), limits)
    assert (after.turn, after.malformed_streak, after.pending) == (2, 0, None)
    assert (after.phase, after.message) == (ending.phase, ending.message)
    assert (after.steps, after.usage, after.messages) == (state.steps, state.usage, state.messages)


def test_the_operator_s_state_from_a_summary_keeps_every_counter_and_no_transcript() -> None:
    limits = kernel.Limits(max_steps=1, on_exhausted=kernel.OnExhausted.STOP)
    start = kernel.initial_state(goal="g")
    state = kernel.advance(start, tool_turn(start, checked("a"), checked("b"), ok=False), limits)
    state = dataclasses.replace(state, answer="partial answer", corrections=2)
    summary = state.summary()
    rebuilt = kernel.state_from_summary(summary)
    assert rebuilt.messages == ()
    assert (rebuilt.turn, rebuilt.steps, rebuilt.tool_calls, rebuilt.tool_failures) == (1, 1, 2, 2)
    assert (rebuilt.corrections, rebuilt.usage, rebuilt.phase) == (2, state.usage, Phase.MAX_STEPS)
    assert (rebuilt.answer, rebuilt.message) == ("partial answer", state.message)
    assert rebuilt.summary() == summary


SCHEMA = {
    "type": "object",
    "properties": {"b": {"type": "string"}, "a": {"type": "array", "items": {"type": "integer"}}},
    "required": ["a", "b"],
}
"""``b`` is checked before ``a``: the error reported first is the first in path order."""


def test_an_answer_missing_its_schema_says_where_first_in_path_order() -> None:
    assert output.output_error('{"a": [1]}', SCHEMA) == "(root): 'b' is a required property"
    assert (
        output.output_error('{"a": [1, "x"], "b": 2}', SCHEMA)
        == "a/1: 'x' is not of type 'integer'"
    )
    assert output.output_error('{"a": [1], "b": "ok"}', SCHEMA) is None
