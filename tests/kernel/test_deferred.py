"""A batch with effects is committed before any of its calls runs.

When the model asks for a ``write`` or ``idempotent`` call, its decision (the assistant message
with every call id, the usage and its charge) is the turn's record, with the batch's valid calls
``deferred``; the next turn runs them under those committed ids (the effect ledger's keys), so a
turn run again never asks the model for a new decision after an effect may have happened. A
batch of ``read`` calls runs in its own turn, with no extra commit. Approval comes first for a
call whose tool needs it.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from agentrun import kernel
from agentrun.kernel import HoldReason, Phase

NOW = kernel.Timing(now=1_000.0, deadline=2_000.0)
LATE = kernel.Timing(now=2_000.0, deadline=2_000.0)
ANY = {"type": "object"}
SCHEMAS = {
    "lookup": kernel.ToolSchema("lookup", ANY),
    "deploy": kernel.ToolSchema("deploy", ANY, effect="write"),
    "tag": kernel.ToolSchema("tag", ANY, effect="idempotent"),
}
USAGE = kernel.Usage(100, 20)


def start() -> kernel.RunState:
    return kernel.initial_state(goal="ship it")


def plan(state: kernel.RunState, limits: kernel.Limits, *, timing: kernel.Timing = NOW) -> object:
    return kernel.plan_turn(
        state, limits, pricing=kernel.Pricing(), offer=kernel.Offer([]), clock=timing
    )


def decide(
    state: kernel.RunState, limits: kernel.Limits, *calls: tuple[str, str, str]
) -> kernel.TurnRecord | kernel.RunTools:
    """Plan the answer of a model that called ``calls`` (``(id, tool, arguments JSON)``)."""
    step = plan(state, limits)
    assert isinstance(step, kernel.CallModel)
    decision = kernel.ToolCalls(tuple(kernel.ToolCall(*c) for c in calls), "on it")
    return kernel.plan_answer(state, limits, step, (decision, USAGE), tools=SCHEMAS, clock=NOW)


def ok(calls: Sequence[kernel.CheckedCall], content: str = "done") -> tuple[kernel.ToolResult, ...]:
    return tuple(kernel.ToolResult(c.id, c.name, f"{content} {c.id}") for c in calls)


def resume(
    state: kernel.RunState, limits: kernel.Limits, results: str = "done"
) -> tuple[kernel.ResumeHeld, kernel.RunState]:
    step = plan(state, limits)
    assert isinstance(step, kernel.ResumeHeld)
    record = step.finish(ok(step.runnable, results))
    return step, kernel.advance(state, record, limits)


WRITE_AND_READ = (("w1", "deploy", '{"app": "web"}'), ("r1", "lookup", "{}"))


def test_a_batch_with_a_write_call_is_committed_before_any_of_its_calls_runs() -> None:
    record = decide(start(), kernel.Limits(), *WRITE_AND_READ)
    assert isinstance(record, kernel.Answered)  # nothing to run in this turn
    assert record.deferred == ("w1", "r1") and record.results == ()
    assert record.usage == USAGE and [c.id for c in record.calls] == ["w1", "r1"]


@pytest.mark.parametrize("tool", ["deploy", "tag"], ids=["write", "idempotent"])
def test_write_and_idempotent_calls_are_both_deferred(tool: str) -> None:
    record = decide(start(), kernel.Limits(), ("c1", tool, "{}"))
    assert isinstance(record, kernel.Answered) and record.deferred == ("c1",)


def test_a_batch_of_read_calls_runs_in_its_own_turn_with_no_extra_commit() -> None:
    step = decide(start(), kernel.Limits(), ("r1", "lookup", "{}"), ("r2", "lookup", "{}"))
    assert isinstance(step, kernel.RunTools)
    assert [c.id for c in step.runnable] == ["r1", "r2"] and step.record.deferred == ()


def test_invalid_calls_of_a_deferred_batch_get_their_errors_in_the_decision_turn() -> None:
    step = decide(start(), kernel.Limits(), ("w1", "deploy", "{}"), ("x1", "lookup", "{oops"))
    assert isinstance(step, kernel.RunTools)
    assert [c.id for c in step.runnable] == ["x1"]
    assert step.record.deferred == ("w1",)


def test_the_committed_decision_keeps_the_run_going_with_its_calls_pending() -> None:
    record = decide(start(), kernel.Limits(), *WRITE_AND_READ)
    assert isinstance(record, kernel.Answered)
    after = kernel.advance(start(), record, kernel.Limits())
    assert after.phase is Phase.RUNNING and after.turn == 1
    assert after.messages == start().messages  # history gets the batch whole, once it ran
    assert (after.steps, after.usage, after.tool_calls) == (1, USAGE, 0)
    assert after.pending is not None
    assert [(h.id, h.reason, h.approved) for h in after.pending.held] == [
        ("w1", HoldReason.EFFECT, True),
        ("r1", HoldReason.EFFECT, True),
    ]
    assert after.message == (
        "turn 0 committed the model's decision; its calls run next: deploy (w1), lookup (r1)"
    )
    assert after.summary().pending_approval is None  # nobody is asked


def test_the_next_turn_runs_the_committed_calls_under_their_committed_ids() -> None:
    limits = kernel.Limits()
    record = decide(start(), limits, *WRITE_AND_READ)
    assert isinstance(record, kernel.Answered)
    decided = kernel.advance(start(), record, limits)
    step, after = resume(decided, limits)
    assert [(c.id, c.name, dict(c.arguments)) for c in step.runnable] == [
        ("w1", "deploy", {"app": "web"}),
        ("r1", "lookup", {}),
    ]
    assert after.phase is Phase.RUNNING and after.pending is None
    assert (after.steps, after.tool_calls) == (1, 2)  # no second model call
    roles = [(m["role"], m.get("tool_call_id")) for m in after.messages[-3:]]
    assert roles == [("assistant", None), ("tool", "w1"), ("tool", "r1")]
    assert [c["id"] for c in after.messages[-3]["tool_calls"]] == ["w1", "r1"]
    assert isinstance(plan(after, limits), kernel.CallModel)


def test_an_effect_left_unknown_in_the_resume_turn_ends_the_run_effect_unknown() -> None:
    limits = kernel.Limits()
    record = decide(start(), limits, ("w1", "deploy", "{}"))
    assert isinstance(record, kernel.Answered)
    decided = kernel.advance(start(), record, limits)
    step = plan(decided, limits)
    assert isinstance(step, kernel.ResumeHeld)
    unknown = kernel.ToolResult(
        "w1", "deploy", "outcome unknown", True, kernel.ToolFault.EFFECT_UNKNOWN
    )
    after = kernel.advance(decided, step.finish((unknown,)), limits)
    assert (after.phase, after.message) == (Phase.EFFECT_UNKNOWN, "outcome unknown")


def test_a_cap_reached_by_the_decision_waits_until_its_calls_ran() -> None:
    limits = kernel.Limits(max_steps=1, on_exhausted=kernel.OnExhausted.STOP)
    record = decide(start(), limits, ("w1", "deploy", "{}"))
    assert isinstance(record, kernel.Answered)
    decided = kernel.advance(start(), record, limits)
    assert decided.phase is Phase.RUNNING  # the write still runs
    step, after = resume(decided, limits)
    assert [c.id for c in step.runnable] == ["w1"]
    assert after.phase is Phase.MAX_STEPS and after.tool_calls == 1


def test_the_resume_turn_is_gated_like_any_batch() -> None:
    limits = kernel.Limits()
    record = decide(start(), limits, ("w1", "deploy", "{}"))
    assert isinstance(record, kernel.Answered)
    decided = kernel.advance(start(), record, limits)
    step = plan(decided, limits, timing=LATE)
    assert isinstance(step, kernel.ResumeHeld) and step.runnable == ()
    after = kernel.advance(decided, step.finish(()), limits)
    assert after.phase is Phase.DEADLINE_EXCEEDED and after.tool_calls == 0


def test_a_batch_over_the_tool_budget_defers_nothing_and_ends_the_run() -> None:
    limits = kernel.Limits(max_tool_calls=1)
    record = decide(start(), limits, *WRITE_AND_READ)
    assert isinstance(record, kernel.Answered) and record.deferred == ()
    assert kernel.advance(start(), record, limits).phase is Phase.TOOL_BUDGET_EXHAUSTED


def test_a_write_that_needs_approval_waits_for_it_then_runs_with_the_rest() -> None:
    limits = kernel.Limits(approval_tools=frozenset({"deploy"}))
    calls = (("w1", "deploy", "{}"), ("t1", "tag", "{}"), ("r1", "lookup", "{}"))
    record = decide(start(), limits, *calls)
    assert isinstance(record, kernel.Answered)
    assert (record.held, record.deferred) == (("w1",), ("t1", "r1"))
    waiting = kernel.advance(start(), record, limits)
    assert waiting.phase is Phase.AWAITING_APPROVAL
    pending = waiting.summary().pending_approval
    assert pending is not None and pending.id == "w1"
    approved = kernel.resolve_approval(waiting, digest=pending.digest, approved=True)
    step, after = resume(approved, limits)
    assert [c.id for c in step.runnable] == ["w1", "t1", "r1"]
    assert after.phase is Phase.RUNNING and after.tool_calls == 3


def test_a_denied_write_is_answered_denied_and_the_deferred_calls_still_run() -> None:
    limits = kernel.Limits(approval_tools=frozenset({"deploy"}))
    record = decide(start(), limits, ("w1", "deploy", "{}"), ("t1", "tag", "{}"))
    assert isinstance(record, kernel.Answered)
    waiting = kernel.advance(start(), record, limits)
    pending = waiting.summary().pending_approval
    assert pending is not None
    denied = kernel.resolve_approval(waiting, digest=pending.digest, approved=False)
    step, after = resume(denied, limits)
    assert [c.id for c in step.runnable] == ["t1"]
    tool_messages = [m["content"] for m in after.messages if m["role"] == "tool"]
    assert tool_messages == ["ERROR: " + kernel.DENIED, "done t1"]
    assert (after.tool_calls, after.tool_failures, after.tool_calls_not_run) == (1, 0, 1)


def test_a_write_repeated_with_the_same_result_is_nudged_then_ends_no_progress() -> None:
    limits = kernel.Limits(no_progress_window=1, max_steps=10)
    state, phases, corrections = start(), [], []
    for turn in range(3):
        record = decide(state, limits, (f"w{turn}", "deploy", "{}"))
        assert isinstance(record, kernel.Answered)
        state = kernel.advance(state, record, limits)
        step = plan(state, limits)
        assert isinstance(step, kernel.ResumeHeld)
        same = tuple(kernel.ToolResult(c.id, c.name, "deployed") for c in step.runnable)
        state = kernel.advance(state, step.finish(same), limits)
        phases.append(state.phase)
        corrections.append(state.corrections)
    assert phases == [Phase.RUNNING, Phase.RUNNING, Phase.NO_PROGRESS]
    assert corrections == [0, 1, 1]  # the nudge after the first repeat
    assert sum("you are not making progress" in m["content"] for m in state.messages) == 1
