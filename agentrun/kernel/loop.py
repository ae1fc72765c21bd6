"""``advance``: the one place that decides a run's phase after each turn.

A turn is planned (``plan``), carried out by the worker, and its ``TurnRecord`` folded into the
state here. Ending a run is a value (a terminal ``Phase``), never an exception.
"""

from __future__ import annotations

import dataclasses
from typing import assert_never

from agentrun.kernel import approval, faults, gates, output, records, transcript
from agentrun.kernel.decision import Final, Malformed, Refusal
from agentrun.kernel.faults import ToolFault
from agentrun.kernel.limits import Limits, OnExhausted
from agentrun.kernel.state import Message, RunState, RunSummary
from agentrun.kernel.terminal import Phase
from agentrun.kernel.validate import InvalidCall


def _unavailable(state: RunState, results: list[records.ToolResult]) -> dict[str, int]:
    """The per-tool infrastructure-failure turn counts after a turn that ran ``results``."""
    return faults.next_unavailable(
        state.unavailable, ((r.name, r.fault if r.is_error else None) for r in results)
    )


def _unavailable_tool(state: RunState, limits: Limits) -> str | None:
    """The first tool (by name) that failed for infrastructure reasons in the last
    ``limits.unavailable_turns`` turns it was called in, if any."""
    worn = sorted(name for name, n in state.unavailable.items() if n >= limits.unavailable_turns)
    return worn[0] if worn else None


CAPS = frozenset({Phase.MAX_STEPS, Phase.TOKEN_BUDGET_EXHAUSTED, Phase.COST_BUDGET_EXHAUSTED})
"""The caps at which ``onExhausted: summarize`` makes one last, tool-free model call."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Turn:
    """What one answered turn showed, worked out before the phase is decided."""

    malformed: bool
    output_error: str | None


def _decide(
    state: RunState, record: records.Answered, limits: Limits, seen: _Turn, *, before: RunState
) -> tuple[Phase, str]:
    """The phase after an answered turn (``state``: after it, ``before``: before it): exactly
    one decision per turn; a call that went past a cap (``gates.overrun``) ends the run before
    any answer completes it; the other caps are checked last."""
    if record.stopped is not None:
        return record.stopped.phase, record.stopped.message
    unknown = [r for r in transcript.ran_results(record) if r.fault is ToolFault.EFFECT_UNKNOWN]
    if unknown:
        return Phase.EFFECT_UNKNOWN, unknown[0].content
    decision = record.decision
    if isinstance(decision, Refusal):
        return Phase.REFUSED, decision.text
    over = gates.overrun(before, limits, record.usage)
    if over is not None:  # the answer is kept, but the run is capped: partial, not completed
        return over.phase, over.message
    if isinstance(decision, Final) and seen.output_error is None:
        return Phase.COMPLETED, "the model gave a final answer"
    if seen.output_error is not None and state.output_failures >= limits.output_attempts:
        return (
            Phase.INVALID_OUTPUT,
            f"the final answer does not meet spec.output.schema: {seen.output_error}",
        )
    if seen.malformed and state.malformed_streak >= limits.malformed_limit:
        return Phase.INVALID_DECISION, (
            f"{state.malformed_streak} malformed turns in a row (limit {limits.malformed_limit})"
        )
    return _decide_after_tools(state, limits, turn=record.turn)


def _decide_after_tools(state: RunState, limits: Limits, *, turn: int) -> tuple[Phase, str]:
    """The phase once a turn's tools ran (the tail of ``_decide``, also used after the calls
    of a batch with effects ran in their resume turn): unavailable tools, no progress, caps."""
    unavailable = _unavailable_tool(state, limits)
    if unavailable is not None:
        return Phase.TOOL_UNAVAILABLE, (
            f"tool {unavailable} failed for infrastructure reasons (timeout, connection, "
            f"server or transport error) in {state.unavailable[unavailable]} turns in a row, "
            "after retries"
        )
    if state.stale_streak >= 2 * limits.no_progress_window:
        return Phase.NO_PROGRESS, (
            f"{state.stale_streak} turns in a row repeated results already seen"
        )
    if state.steps >= limits.max_steps:
        return (
            Phase.MAX_STEPS,
            f"maxSteps {limits.max_steps} reached while the model still wanted to act",
        )
    if limits.max_tokens is not None and state.usage.total_tokens >= limits.max_tokens:
        return Phase.TOKEN_BUDGET_EXHAUSTED, f"maxTokens {limits.max_tokens} used"
    if limits.max_cost_usd is not None and state.usage.cost_usd >= limits.max_cost_usd:
        return Phase.COST_BUDGET_EXHAUSTED, f"maxCostUSD {limits.max_cost_usd} spent"
    return Phase.RUNNING, f"turn {turn} committed"


_AFTER_TOOLS = CAPS | {Phase.INVALID_DECISION, Phase.TOOL_UNAVAILABLE, Phase.NO_PROGRESS}
"""The endings a turn's tool results can lead to: a turn with deferred calls leaves them to
its resume turn (the calls run first, then the run may end so)."""


def _deferred_message(record: records.Answered) -> str:
    """``.status.message`` while a batch with effects waits for its resume turn."""
    names = {c.id: c.name for c in record.calls}
    calls = ", ".join(f"{names[i]} ({i})" for i in record.deferred)
    return f"turn {record.turn} committed the model's decision; its calls run next: {calls}"


def _settle_phase(after: RunState, ending: records.Ending, limits: Limits) -> RunState:
    """Set the decided phase; a cap with ``onExhausted: summarize`` asks for a summary first,
    unless the run is already past its token or cost cap (a summary would only spend more)."""
    past_cap = (limits.max_tokens is not None and after.usage.total_tokens > limits.max_tokens) or (
        limits.max_cost_usd is not None and after.usage.cost_usd > limits.max_cost_usd
    )
    asked = after.pending_cap is not None  # the summary was due but cannot be made: end
    summarize = limits.on_exhausted is OnExhausted.SUMMARIZE and not past_cap and not asked
    if ending.phase in CAPS and summarize:
        return dataclasses.replace(
            after, pending_cap=ending.phase, message=f"{ending.message}; asking for a summary"
        )
    return dataclasses.replace(after, phase=ending.phase, message=ending.message, pending_cap=None)


def advance(state: RunState, record: records.TurnRecord, limits: Limits) -> RunState:
    """Fold one committed turn into the state and decide the next phase.

    Shapes: ``state`` must be running and ``record.turn == state.turn``; returns the state after
    the turn (``turn + 1``). Raises ``ValueError`` on a turn out of order or a finished run —
    a bug in the caller, never a model fault.
    """
    if state.phase.is_terminal:
        raise ValueError(
            f"run already ended ({state.phase.value}); turn {record.turn} cannot advance it"
        )
    if record.turn != state.turn:
        raise ValueError(f"turn {record.turn} does not follow turn {state.turn - 1}")
    match record:
        case records.Answered():
            return _advance_answered(state, record, limits)
        case records.Summarized():
            return _advance_summary(state, record)
        case records.Resumed():
            return _advance_resume(state, record, limits)
        case records.Stopped():
            return _advance_stopped(state, record.ending, limits)
        case records.ModelFailed():
            return _advance_stopped(state, records.Ending(Phase.MODEL_ERROR, record.error), limits)
        case _:
            assert_never(record)


def _advance_stopped(state: RunState, ending: records.Ending, limits: Limits) -> RunState:
    """Fold a turn that made no (successful) model call: only the phase moves."""
    after = dataclasses.replace(state, turn=state.turn + 1, malformed_streak=0, pending=None)
    return _settle_phase(after, ending, limits)


def _advance_answered(state: RunState, record: records.Answered, limits: Limits) -> RunState:
    decision = record.decision
    malformed = isinstance(decision, Malformed) or any(
        isinstance(c, InvalidCall) for c in record.calls
    )
    output_error = (
        output.output_error(decision.content, limits.output_schema)
        if isinstance(decision, Final) and limits.output_schema is not None
        else None
    )
    signature = transcript.turn_signature(record, limits.pollable)
    stale = signature is not None and signature in state.signatures
    stale_streak = (
        state.stale_streak + 1 if stale else (0 if signature is not None else state.stale_streak)
    )
    nudged = stale and stale_streak == limits.no_progress_window
    notes = transcript.correction_notes(decision, output_error, nudged=nudged, limits=limits)
    ran = transcript.ran_results(record)
    pending = record.held or record.deferred
    after = dataclasses.replace(
        state,
        messages=state.messages + (() if pending else transcript.messages_of(record)) + notes,
        turn=state.turn + 1,
        steps=state.steps + 1,
        tool_calls=state.tool_calls + len(ran),
        tool_failures=state.tool_failures + transcript.failed_count(record, ran),
        tool_calls_not_run=state.tool_calls_not_run + transcript.not_run_count(record),
        corrections=state.corrections + (1 if malformed or output_error or nudged else 0),
        malformed_streak=state.malformed_streak + 1 if malformed else 0,
        usage=state.usage + record.usage,
        answer=decision.content if isinstance(decision, Final) and output_error is None else None,
        call_ids=state.call_ids | {c.id for c in record.calls},
        signatures=state.signatures | {signature} if signature is not None else state.signatures,
        stale_streak=stale_streak,
        unavailable=_unavailable(state, ran),
        output_failures=state.output_failures + (1 if output_error else 0),
        pending=approval.pending_of(record) if pending else None,
    )
    phase, message = _decide(after, record, limits, _Turn(malformed, output_error), before=state)
    if record.deferred and (phase is Phase.RUNNING or phase in _AFTER_TOOLS):
        # the deferred calls run first: what they show is decided in their resume turn
        phase, message = Phase.RUNNING, _deferred_message(record)
    if phase is Phase.RUNNING and after.pending is not None:
        waiting = after.pending.waiting_message()
        if waiting is not None:
            phase, message = Phase.AWAITING_APPROVAL, waiting
    return _settle_phase(after, records.Ending(phase, message), limits)


def _advance_summary(state: RunState, record: records.Summarized) -> RunState:
    """Fold the tool-free summary call made at a cap: the run ends with the cap's reason."""
    if state.pending_cap is None:
        raise ValueError(f"turn {record.turn} is a summary, but no cap is pending")
    decision = record.decision
    answer = decision.content if isinstance(decision, Final) else None
    messages: tuple[Message, ...] = (transcript.summary_request(state.pending_cap),)
    if answer is not None:
        messages += ({"role": "assistant", "content": answer},)
    return dataclasses.replace(
        state,
        messages=state.messages + messages,
        turn=state.turn + 1,
        steps=state.steps + (1 if decision is not None else 0),
        usage=state.usage + record.usage,
        phase=state.pending_cap,
        pending_cap=None,
        answer=answer,
        message=state.message + ("; summary written to answer" if answer else "; no summary"),
    )


def _advance_resume(state: RunState, record: records.Resumed, limits: Limits) -> RunState:
    """Fold the turn that settled a pending batch: the batch enters history whole, in call
    order. After a batch with effects ran, the phase is decided as after any tool batch (no
    progress, unavailable tools, caps); after an approval alone the run goes on. The batch's
    call ids are in ``call_ids`` already: its answer's fold put them there."""
    pending = state.pending
    if pending is None or pending.next_undecided is not None:
        raise ValueError(f"turn {record.turn} resumes, but no decided batch is pending")
    held = pending.record
    by_id = {r.tool_call_id: r for r in (*held.results, *record.results)}
    assistant = transcript.assistant_message(held)
    assert assistant is not None
    approved = {h.id for h in pending.held if h.approved}
    ran = [] if record.stopped else [r for r in record.results if r.tool_call_id in approved]
    signature = transcript.signature(ran, limits.pollable) if held.deferred else None
    stale = signature is not None and signature in state.signatures
    stale_streak = state.stale_streak + 1 if stale else (0 if signature else state.stale_streak)
    nudged = stale and stale_streak == limits.no_progress_window
    after = dataclasses.replace(
        state,
        messages=(
            *state.messages,
            assistant,
            *(transcript.tool_message(by_id[c.id]) for c in held.calls),
            *transcript.correction_notes(held.decision, None, nudged=nudged, limits=limits),
        ),
        turn=state.turn + 1,
        tool_calls=state.tool_calls + len(ran),
        tool_failures=state.tool_failures + sum(r.is_error for r in ran),
        tool_calls_not_run=state.tool_calls_not_run + len(record.results) - len(ran),
        corrections=state.corrections + (1 if nudged else 0),
        unavailable=_unavailable(state, ran),
        signatures=state.signatures | {signature} if signature is not None else state.signatures,
        stale_streak=stale_streak,
        pending=None,
    )
    return _settle_resumed(after, record, limits, ran=ran, effects=bool(held.deferred))


def _settle_resumed(
    after: RunState,
    record: records.Resumed,
    limits: Limits,
    *,
    ran: list[records.ToolResult],
    effects: bool,
) -> RunState:
    """The phase after a resume turn: its gate's ending, an effect left unknown, then — only
    for a batch with effects, whose decision turn left this to it — a malformed streak and
    what any tool batch can end in; an approval alone lets the run go on."""
    unknown = next((r for r in ran if r.fault is ToolFault.EFFECT_UNKNOWN), None)
    stopped = record.stopped
    if stopped is None and unknown is not None:
        stopped = records.Ending(Phase.EFFECT_UNKNOWN, unknown.content)
    if stopped is not None:
        return dataclasses.replace(after, phase=stopped.phase, message=stopped.message)
    if not effects:
        return dataclasses.replace(after, phase=Phase.RUNNING, message="approved calls settled")
    if after.malformed_streak >= limits.malformed_limit:
        message = f"{after.malformed_streak} malformed turns in a row"
        ending = records.Ending(
            Phase.INVALID_DECISION, f"{message} (limit {limits.malformed_limit})"
        )
    else:
        ending = records.Ending(*_decide_after_tools(after, limits, turn=record.turn))
    return _settle_phase(after, ending, limits)


def resolve_approval(
    state: RunState, *, digest: str, approved: bool, reviewer: str = ""
) -> RunState:
    """Apply ``reviewer``'s decision on the next held call (bound to its ``digest``); the
    reviewer is recorded on the call and named in the run's message.

    Raises ``ValueError`` when the run is not waiting or the digest is not the pending call's.
    Once every held call is decided the run is ``running`` again and its next turn resumes.
    """
    if state.phase is not Phase.AWAITING_APPROVAL or state.pending is None:
        raise ValueError(f"the run is {state.phase.value}, not waiting for an approval")
    pending = approval.decide(state.pending, digest=digest, approved=approved, reviewer=reviewer)
    waiting = pending.waiting_message()
    verdict = f"{'approved' if approved else 'denied'} by {reviewer or 'reviewer'}"
    if waiting is not None:
        return dataclasses.replace(state, pending=pending, message=f"{verdict}; {waiting}")
    return dataclasses.replace(state, pending=pending, phase=Phase.RUNNING, message=verdict)


def stop(state: RunState, phase: Phase, message: str) -> RunState:
    """End a run from outside the turn (deadline, cancellation); a no-op on an ended run."""
    if state.phase.is_terminal:
        return state
    return dataclasses.replace(state, phase=phase, message=message)


def state_from_summary(summary: RunSummary) -> RunState:
    """A state holding only counters (no messages), rebuilt from a ``RunSummary``.

    The operator projects status from summaries and never needs the transcript.
    """
    return RunState(
        messages=(),
        turn=summary.turn,
        steps=summary.steps,
        tool_calls=summary.tool_calls,
        tool_failures=summary.tool_failures,
        tool_calls_not_run=summary.tool_calls_not_run,
        corrections=summary.corrections,
        usage=summary.usage,
        phase=summary.phase,
        answer=summary.answer,
        message=summary.message,
    )
