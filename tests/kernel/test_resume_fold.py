"""The fold of a resume turn (``kernel.advance`` of a ``Resumed`` record), field by field.

A resume turn settles a committed batch: the held calls of a decided approval and the deferred
calls of a batch with effects. Each counter it moves is checked against values worked out by
hand from the batch, and every field it must leave alone against the state before it, so a
counter moved the wrong way, or not at all, fails here (``make mutate`` found these folds
checked only by their phase)."""

from __future__ import annotations

import dataclasses

import pytest

from agentrun import kernel
from agentrun.kernel import Phase

from .test_deferred import decide, plan, start

WRITE = ("w1", "deploy", '{"app": "web"}')
TAG = ("t1", "tag", "{}")
LOOKUP = ("r1", "lookup", "{}")


def decided(limits: kernel.Limits, *calls: tuple[str, str, str]) -> kernel.RunState:
    """The state after the decision turn that called ``calls`` (its batch now pending)."""
    record = decide(start(), limits, *calls)
    if isinstance(record, kernel.RunTools):  # invalid calls get their errors in this turn
        record = record.finish(
            tuple(
                kernel.ToolResult(c.id, c.name, c.error, True, kernel.ToolFault.ARGUMENTS)
                for c in record.runnable
                if isinstance(c, kernel.InvalidCall)
            )
        )
    assert isinstance(record, kernel.Answered)
    return kernel.advance(start(), record, limits)


def approve_all(state: kernel.RunState, *, approved: bool = True) -> kernel.RunState:
    while (pending := state.summary().pending_approval) is not None:
        state = kernel.resolve_approval(state, digest=pending.digest, approved=approved)
    return state


def resumed(
    state: kernel.RunState, limits: kernel.Limits, results: dict[str, kernel.ToolResult]
) -> kernel.RunState:
    step = plan(state, limits)
    assert isinstance(step, kernel.ResumeHeld)
    return kernel.advance(state, step.finish(tuple(results[c.id] for c in step.runnable)), limits)


def _unchanged_but(before: kernel.RunState, after: kernel.RunState, **moved: object) -> None:
    """``after`` is ``before`` with exactly the fields ``moved`` changed (history compared by
    the caller)."""
    expected = dataclasses.replace(before, messages=after.messages, **moved)
    assert after == expected


def test_a_batch_with_effects_settles_every_counter_by_its_results() -> None:
    limits = kernel.Limits(approval_tools=frozenset({"deploy"}))
    state = approve_all(decided(limits, WRITE, TAG, ("x1", "nope", "{}")))
    earlier = state.call_ids | {"c0"}  # an earlier turn's call
    state = dataclasses.replace(state, stale_streak=1, unavailable={"tag": 1}, call_ids=earlier)
    results = {
        "w1": kernel.ToolResult("w1", "deploy", "deployed"),
        "t1": kernel.ToolResult("t1", "tag", "tag failed", True, kernel.ToolFault.DOMAIN),
    }
    after = resumed(state, limits, results)
    _unchanged_but(
        state,
        after,
        turn=state.turn + 1,
        tool_calls=state.tool_calls + 2,
        tool_failures=state.tool_failures + 1,
        tool_calls_not_run=state.tool_calls_not_run,
        call_ids={"c0", "w1", "t1", "x1"},
        signatures=after.signatures,
        stale_streak=0,  # a new result: progress
        unavailable={},  # a tool error, not an infrastructure failure
        pending=None,
        phase=Phase.RUNNING,
        message=f"turn {state.turn} committed",
    )
    assert len(after.signatures) == len(state.signatures) + 1
    roles = [(m["role"], m.get("tool_call_id")) for m in after.messages[len(state.messages) :]]
    assert roles == [("assistant", None), ("tool", "w1"), ("tool", "t1"), ("tool", "x1")]


def test_an_invalid_call_beside_effects_ends_the_run_after_they_ran_at_the_malformed_limit() -> (
    None
):
    limits = kernel.Limits(malformed_limit=1)
    state = decided(limits, WRITE, ("x1", "nope", "{}"))
    assert state.phase is Phase.RUNNING and state.malformed_streak == 1
    after = resumed(state, limits, {"w1": kernel.ToolResult("w1", "deploy", "deployed")})
    assert (after.phase, after.message) == (
        Phase.INVALID_DECISION,
        "1 malformed turns in a row (limit 1)",
    )
    assert after.tool_calls == 1
    below = kernel.Limits(malformed_limit=2)
    state = decided(below, WRITE, ("x1", "nope", "{}"))
    after = resumed(state, below, {"w1": kernel.ToolResult("w1", "deploy", "deployed")})
    assert (after.phase, after.message) == (Phase.RUNNING, f"turn {state.turn} committed")


@pytest.mark.parametrize("approved", [True, False], ids=["approved", "denied"])
def test_an_approval_alone_settles_its_call_and_lets_the_run_go_on(approved: bool) -> None:
    """A held ``read`` call (approval, no effects): it runs once approved, is counted not run
    once denied; the run goes on with no no-progress bookkeeping (only a batch with effects
    is compared with earlier results)."""
    limits = kernel.Limits(approval_tools=frozenset({"lookup"}))
    state = approve_all(decided(limits, LOOKUP), approved=approved)
    state = dataclasses.replace(state, stale_streak=1)
    found = {"r1": kernel.ToolResult("r1", "lookup", "found")} if approved else {}
    after = resumed(state, limits, found)
    _unchanged_but(
        state,
        after,
        turn=state.turn + 1,
        tool_calls=state.tool_calls + (1 if approved else 0),
        tool_calls_not_run=state.tool_calls_not_run + (0 if approved else 1),
        call_ids=state.call_ids | {"r1"},
        pending=None,
        phase=Phase.RUNNING,
        message="approved calls settled",
    )


def test_a_resume_record_with_nothing_decided_to_resume_is_refused() -> None:
    limits = kernel.Limits(approval_tools=frozenset({"lookup"}))
    results = (kernel.ToolResult("r1", "lookup", "found"),)
    with pytest.raises(ValueError, match=r"^turn 0 resumes, but no decided batch is pending$"):
        kernel.advance(start(), kernel.Resumed(0, results), limits)
    waiting = decided(limits, LOOKUP)  # held, not yet decided
    assert waiting.phase is Phase.AWAITING_APPROVAL
    with pytest.raises(ValueError, match=r"^turn 1 resumes, but no decided batch is pending$"):
        kernel.advance(waiting, kernel.Resumed(1, results), limits)
