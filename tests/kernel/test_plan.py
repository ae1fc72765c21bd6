"""The kernel plans each turn; the worker only carries the plan out.

Every way a turn can go is decided here, from values: stop before the model call, settle a
decided approval, call the model (or make the summary call at a cap), and what a model's
answer, a model failure or a tenant's refusal becomes.
"""

from __future__ import annotations

import dataclasses

import pytest

from agentrun import kernel
from agentrun.kernel import Phase

from .helpers import checked, tool_turn

NOW = kernel.Timing(now=1_000.0, deadline=2_000.0)
LATE = kernel.Timing(now=2_000.0, deadline=2_000.0)
SCHEMAS = {"calculate": kernel.ToolSchema("calculate", {"type": "object"})}


def start() -> kernel.RunState:
    return kernel.initial_state(goal="do it")


def plan(
    state: kernel.RunState,
    limits: kernel.Limits,
    *,
    timing: kernel.Timing = NOW,
    missing: tuple[str, ...] = (),
) -> kernel.TurnPlan:
    return kernel.plan_turn(
        state, limits, pricing=kernel.Pricing(), offer=kernel.Offer([], missing), clock=timing
    )


def call_of(state: kernel.RunState, limits: kernel.Limits) -> kernel.CallModel:
    step = plan(state, limits)
    assert isinstance(step, kernel.CallModel)
    return step


def test_a_running_run_calls_the_model_with_its_history_and_allowance() -> None:
    limits = kernel.Limits(max_output_tokens=700)
    step = call_of(start(), limits)
    assert step.prompt == start().messages and not step.summary
    assert step.max_output_tokens == 700 and step.prompt_estimate > 0


def test_a_tool_the_worker_lacks_ends_the_run_before_any_call() -> None:
    step = plan(start(), kernel.Limits(), missing=("deploy", "scale"))
    assert isinstance(step, kernel.EndRun)
    assert step.record == kernel.Stopped(
        0,
        kernel.Ending(Phase.TOOL_UNAVAILABLE, "this worker's catalog lacks tool(s) deploy, scale"),
    )


def test_a_run_past_its_deadline_stops_without_calling_the_model() -> None:
    step = plan(start(), kernel.Limits(), timing=LATE)
    assert isinstance(step, kernel.EndRun)
    assert step.record == kernel.Stopped(
        0,
        kernel.Ending(
            Phase.DEADLINE_EXCEEDED, "the run's timeout passed before the next model call"
        ),
    )


def test_at_a_cap_the_model_is_asked_for_a_tool_free_summary() -> None:
    limits = kernel.Limits(max_steps=1)
    state = kernel.advance(start(), tool_turn(start(), checked()), limits)
    step = call_of(state, limits)
    assert step.summary and step.max_output_tokens == limits.summary_output_tokens
    assert step.prompt[-1] == kernel.summary_request(Phase.MAX_STEPS)


def test_a_decided_approval_is_settled_before_anything_else() -> None:
    limits = kernel.Limits(approval_tools=frozenset({"deploy"}))
    held = dataclasses.replace(
        tool_turn(start(), checked("c1"), kernel.CheckedCall("d1", "deploy", {})),
        held=("d1",),
    )
    held = dataclasses.replace(held, results=held.results[:1])
    waiting = kernel.advance(start(), held, limits)
    pending = waiting.pending
    assert pending is not None and pending.next_undecided is not None
    decided = kernel.resolve_approval(waiting, digest=pending.next_undecided.digest, approved=False)
    step = plan(decided, limits, timing=LATE)  # even past the deadline: nothing would run
    assert isinstance(step, kernel.ResumeHeld)
    assert step.runnable == ()
    record = step.finish(())
    assert [(r.tool_call_id, r.content) for r in record.results] == [("d1", kernel.DENIED)]


def awaiting_deploy_approval() -> tuple[kernel.Limits, kernel.RunState]:
    """Limits holding ``deploy`` for approval, and a run whose first batch (``calculate`` c1,
    then ``deploy`` d1) ran c1 and waits for a person's decision on d1."""
    limits = kernel.Limits(approval_tools=frozenset({"deploy"}))
    held = dataclasses.replace(
        tool_turn(start(), checked("c1"), kernel.CheckedCall("d1", "deploy", {})),
        held=("d1",),
    )
    waiting = kernel.advance(start(), dataclasses.replace(held, results=held.results[:1]), limits)
    return limits, waiting


def test_an_approved_call_past_the_deadline_is_settled_without_running() -> None:
    limits, waiting = awaiting_deploy_approval()
    assert waiting.pending is not None and waiting.pending.next_undecided is not None
    digest = waiting.pending.next_undecided.digest
    decided = kernel.resolve_approval(waiting, digest=digest, approved=True)
    step = plan(decided, limits, timing=LATE)
    assert isinstance(step, kernel.ResumeHeld) and step.runnable == ()
    assert step.stopped == kernel.Ending(
        Phase.DEADLINE_EXCEEDED, "the run's timeout passed before the tool batch"
    )


def test_a_tenant_refusal_ends_the_run_tenant_budget_exhausted() -> None:
    step = call_of(start(), kernel.Limits())
    record = kernel.refused_by_tenant(step, "tenant 't' tokens exhausted")
    assert record == kernel.Stopped(
        0, kernel.Ending(Phase.TENANT_BUDGET_EXHAUSTED, "tenant 't' tokens exhausted")
    )


def test_a_tenant_refusal_of_the_summary_ends_with_the_runs_own_cap() -> None:
    limits = kernel.Limits(max_steps=1)
    state = kernel.advance(start(), tool_turn(start(), checked()), limits)
    record = kernel.refused_by_tenant(call_of(state, limits), "no budget")
    assert isinstance(record, kernel.Summarized) and record.decision is None
    assert record.error == "no budget"  # the committed record says why no summary came
    assert kernel.advance(state, record, limits).phase is Phase.MAX_STEPS


@pytest.mark.parametrize(
    ("timing", "expected"),
    [
        pytest.param(NOW, kernel.ModelFailed(0, "HTTP 500"), id="model_error"),
        pytest.param(
            LATE,
            kernel.Stopped(
                0,
                kernel.Ending(
                    Phase.DEADLINE_EXCEEDED,
                    "the run's timeout passed during the model call (HTTP 500)",
                ),
            ),
            id="deadline passed meanwhile",
        ),
    ],
)
def test_a_failed_model_call_ends_with_model_error_unless_the_deadline_passed(
    timing: kernel.Timing, expected: kernel.TurnRecord
) -> None:
    step = call_of(start(), kernel.Limits())
    assert kernel.model_failed(step, "HTTP 500", clock=timing) == expected


@pytest.mark.parametrize(
    ("fault", "summary", "expected"),
    [
        pytest.param(
            kernel.ModelFault.FILTERED,
            False,
            kernel.Stopped(0, kernel.Ending(Phase.REFUSED, "filtered: jailbreak")),
            id="filter-refused",
        ),
        pytest.param(
            kernel.ModelFault.FILTERED,
            True,
            kernel.Summarized(0, None, error="filtered: jailbreak"),
            id="filter-on-summary-keeps-the-cap",
        ),
        pytest.param(
            kernel.ModelFault.WAIT_BEYOND_DEADLINE,
            False,
            kernel.Stopped(0, kernel.Ending(Phase.DEADLINE_EXCEEDED, "filtered: jailbreak")),
            id="wait-past-deadline",
        ),
        pytest.param(
            kernel.ModelFault.WAIT_BEYOND_DEADLINE,
            True,
            kernel.Stopped(0, kernel.Ending(Phase.DEADLINE_EXCEEDED, "filtered: jailbreak")),
            id="wait-past-deadline-on-summary",
        ),
        pytest.param(
            kernel.ModelFault.UNAVAILABLE,
            False,
            kernel.ModelFailed(0, "filtered: jailbreak"),
            id="unavailable",
        ),
    ],
)
def test_a_failed_call_ends_as_its_fault_says(
    fault: kernel.ModelFault, summary: bool, expected: kernel.TurnRecord
) -> None:
    step = dataclasses.replace(call_of(start(), kernel.Limits()), summary=summary)
    assert kernel.model_failed(step, "filtered: jailbreak", clock=NOW, fault=fault) == expected


def answer(
    state: kernel.RunState, limits: kernel.Limits, decision: kernel.Decision
) -> kernel.TurnRecord | kernel.RunTools:
    step = call_of(state, limits)
    usage = kernel.Usage(10, 2)
    return kernel.plan_answer(state, limits, step, (decision, usage), tools=SCHEMAS, clock=NOW)


def tool_calls(*ids: str) -> kernel.ToolCalls:
    return kernel.ToolCalls(tuple(kernel.ToolCall(i, "calculate", "{}") for i in ids), None)


def test_a_final_answer_is_the_turns_record() -> None:
    record = answer(start(), kernel.Limits(), kernel.Final("12"))
    assert record == kernel.Answered(0, kernel.Final("12"), kernel.Usage(10, 2))


def test_tool_calls_within_budget_are_run_then_recorded_with_their_results() -> None:
    step = answer(start(), kernel.Limits(), tool_calls("a", "b"))
    assert isinstance(step, kernel.RunTools)
    assert [c.id for c in step.runnable] == ["a", "b"]
    results = tuple(kernel.ToolResult(i, "calculate", "1") for i in ("a", "b"))
    record = step.finish(results)
    assert record.results == results and record.stopped is None


def test_a_batch_over_the_tool_budget_runs_nothing_and_ends_the_run() -> None:
    record = answer(start(), kernel.Limits(max_tool_calls=1), tool_calls("a", "b"))
    assert isinstance(record, kernel.Answered)
    assert record.stopped is not None and record.stopped.phase is Phase.TOOL_BUDGET_EXHAUSTED
    assert all(r.is_error and r.content.startswith("not run: ") for r in record.results)
    state = kernel.advance(start(), record, kernel.Limits(max_tool_calls=1))
    assert state.phase is Phase.TOOL_BUDGET_EXHAUSTED and state.tool_calls == 0


def test_calls_a_budget_cut_are_counted_not_run_not_failed() -> None:
    """The demo's inventory run: 3 calls return values, the next batch of 3 does not fit."""
    limits = kernel.Limits(max_tool_calls=4)
    state = kernel.advance(start(), tool_turn(start(), *(checked(i) for i in "xyz")), limits)
    record = answer(state, limits, tool_calls("a", "b", "c"))
    assert isinstance(record, kernel.Answered) and record.stopped is not None
    summary = kernel.advance(state, record, limits).summary()
    counts = (summary.tool_calls, summary.tool_failures, summary.tool_calls_not_run)
    assert counts == (3, 0, 3)
    assert kernel.state_from_summary(summary).summary() == summary


def test_an_invalid_call_in_a_cut_batch_is_still_a_failure() -> None:
    limits = kernel.Limits(max_tool_calls=1)
    batch = kernel.ToolCalls(
        tuple(kernel.ToolCall(i, "nope" if i == "b" else "calculate", "{}") for i in "abc"), None
    )
    record = answer(start(), limits, batch)
    assert isinstance(record, kernel.Answered) and record.stopped is not None
    state = kernel.advance(start(), record, limits)
    assert (state.tool_calls, state.tool_failures, state.tool_calls_not_run) == (0, 1, 2)


def test_calls_to_approval_tools_are_held_not_run() -> None:
    limits = kernel.Limits(approval_tools=frozenset({"calculate"}))
    step = answer(start(), limits, tool_calls("a"))
    assert isinstance(step, kernel.RunTools)
    assert step.runnable == () and step.record.held == ("a",)


def test_a_run_past_its_deadline_while_awaiting_approval_ends_holding_no_request() -> None:
    limits, waiting = awaiting_deploy_approval()
    assert waiting.pending is not None
    step = plan(waiting, limits, timing=LATE)
    assert isinstance(step, kernel.EndRun)
    after = kernel.advance(waiting, step.record, limits)
    assert (after.phase, after.pending) == (Phase.DEADLINE_EXCEEDED, None)
