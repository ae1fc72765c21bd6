"""``plan_answer`` and the records it builds, exactly: a summary's record, minted ids that
name their turn, the tool budget counted over valid calls only, a stopped batch's results, a
stopped or denied resume's results, and arguments no JSON encoder can size."""

from __future__ import annotations

import dataclasses

from agentrun import kernel
from agentrun.kernel import Phase
from agentrun.kernel.decision import MAX_BATCH_ARGUMENTS_BYTES

from .helpers import TOOLS, call, response
from .test_resume_fold import approve_all, decided

NOW = kernel.Timing(now=1_000.0, deadline=2_000.0)
USAGE = kernel.Usage(100, 20)


def _plan(state: kernel.RunState, limits: kernel.Limits) -> kernel.CallModel:
    step = kernel.plan_turn(
        state, limits, pricing=kernel.Pricing(), offer=kernel.Offer([]), clock=NOW
    )
    assert isinstance(step, kernel.CallModel)
    return step


def _answer(
    state: kernel.RunState, limits: kernel.Limits, decision: kernel.Decision
) -> kernel.TurnRecord | kernel.RunTools:
    step = _plan(state, limits)
    return kernel.plan_answer(state, limits, step, (decision, USAGE), tools=TOOLS, clock=NOW)


def test_a_summary_s_answer_is_recorded_with_its_decision_and_usage() -> None:
    limits = kernel.Limits(max_steps=1)
    state = kernel.initial_state(goal="g")
    final = kernel.Final("the answer")
    first = _answer(state, limits, final)
    assert isinstance(first, kernel.Answered)
    capped = dataclasses.replace(state, pending_cap=Phase.MAX_STEPS, steps=1, turn=1)
    summary = _answer(capped, limits, kernel.Final("in short"))
    assert summary == kernel.Summarized(1, kernel.Final("in short"), USAGE)


def test_a_call_without_an_id_gets_one_naming_its_turn() -> None:
    state = dataclasses.replace(kernel.initial_state(goal="g"), turn=4)
    decision = kernel.classify(response(None, tool_calls=[call("ping", "{}", id=None)]))
    planned = _answer(state, kernel.Limits(), decision)
    assert isinstance(planned, kernel.RunTools)
    assert [c.id for c in planned.runnable] == ["4:ping:0"]


def test_the_tool_budget_counts_the_valid_calls_only() -> None:
    """An invalid call is answered with its error, never run: a batch of one valid and one
    invalid call fits ``maxToolCalls: 1``."""
    decision = kernel.classify(
        response(None, tool_calls=[call("ping", "{}", id="a"), call("nope", "{}", id="b")])
    )
    planned = _answer(kernel.initial_state(goal="g"), kernel.Limits(max_tool_calls=1), decision)
    assert isinstance(planned, kernel.RunTools) and planned.record.stopped is None
    assert [c.id for c in planned.runnable] == ["a", "b"]


def test_a_stopped_batch_answers_each_call_not_run_and_an_invalid_one_with_its_error() -> None:
    decision = kernel.classify(
        response(None, tool_calls=[call("ping", "{}", id="a"), call("nope", "{}", id="b")])
    )
    planned = _answer(kernel.initial_state(goal="g"), kernel.Limits(max_tool_calls=0), decision)
    assert isinstance(planned, kernel.Answered) and planned.stopped is not None
    why = planned.stopped.message
    [invalid] = [c for c in planned.calls if isinstance(c, kernel.InvalidCall)]
    assert planned.results == (
        kernel.ToolResult("a", "ping", f"not run: {why}", True),
        kernel.ToolResult("b", "nope", invalid.error, True, kernel.ToolFault.ARGUMENTS),
    )


def test_a_resume_stopped_by_its_gate_or_a_denial_answers_each_call_by_name() -> None:
    limits = kernel.Limits(approval_tools=frozenset({"deploy"}))
    state = approve_all(decided(limits, ("w1", "deploy", "{}")), approved=False)
    step = kernel.plan_turn(
        state, limits, pricing=kernel.Pricing(), offer=kernel.Offer([]), clock=NOW
    )
    assert isinstance(step, kernel.ResumeHeld)
    assert step.finish(()).results == (kernel.ToolResult("w1", "deploy", kernel.DENIED, True),)
    approved = approve_all(decided(limits, ("w1", "deploy", "{}")))
    late = kernel.Timing(now=2_000.0, deadline=2_000.0)
    step = kernel.plan_turn(
        approved, limits, pricing=kernel.Pricing(), offer=kernel.Offer([]), clock=late
    )
    assert isinstance(step, kernel.ResumeHeld) and step.stopped is not None
    assert step.finish(()).results == (
        kernel.ToolResult("w1", "deploy", f"not run: {step.stopped.message}", True),
    )


def test_arguments_no_encoder_can_size_count_as_over_the_batch_cap() -> None:
    nested: list[object] = []
    for _ in range(100_000):
        nested = [nested]
    reply = response(None, tool_calls=[call("ping", "{}", id="a")])
    reply["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = nested
    decision = kernel.classify(reply)
    assert isinstance(decision, kernel.ToolCalls)
    [dropped] = decision.calls
    assert dropped.dropped == MAX_BATCH_ARGUMENTS_BYTES + 1
    assert dropped.arguments == f"list…[{MAX_BATCH_ARGUMENTS_BYTES + 1} bytes dropped]"
