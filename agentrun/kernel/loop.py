"""``advance``: the one place that decides a run's phase after each turn.

A turn is planned (``plan``), carried out by the worker, and its ``TurnRecord`` folded into the
state here. Ending a run is a value (a terminal ``Phase``), never an exception.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import assert_never

from agentrun.kernel import approval, faults, output, records
from agentrun.kernel.decision import Decision, Final, Malformed, MalformedCause, Refusal, ToolCalls
from agentrun.kernel.faults import ToolFault
from agentrun.kernel.limits import Limits, OnExhausted
from agentrun.kernel.state import Message, RunState, RunSummary
from agentrun.kernel.terminal import Phase
from agentrun.kernel.validate import CheckedCall, InvalidCall, stored_arguments

SIGNATURE_CLIP = 512
"""Characters of a result that count toward its no-progress signature."""


def _assistant_message(record: records.Answered) -> Message | None:
    decision = record.decision
    if isinstance(decision, Final):
        return {"role": "assistant", "content": decision.content}
    if isinstance(decision, ToolCalls):
        return {
            "role": "assistant",
            "content": decision.content,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": stored_arguments(call)},
                }
                for call in record.calls
            ],
        }
    return None


def _tool_message(result: records.ToolResult) -> Message:
    content = records.ERROR_PREFIX + result.content if result.is_error else result.content
    return {"role": "tool", "tool_call_id": result.tool_call_id, "content": content}


def correction_for(decision: Decision) -> str | None:
    """The corrective user message a malformed decision earns, or ``None``.

    Invalid tool calls are corrected by their own error results, so they need no extra message.
    """
    if isinstance(decision, Malformed):
        hint = {
            MalformedCause.TRUNCATED: "Your reply was cut off by the output token limit. "
            "Be shorter: make fewer or smaller tool calls, or give a concise answer.",
            MalformedCause.EMPTY_TOOL_CALLS: "Your reply said it calls tools but held no tool "
            "calls. Call a tool with valid arguments, or give your final answer.",
        }.get(decision.cause, "Your reply was empty. Call a tool, or give your final answer.")
        return f"[agentrun] {decision.detail}. {hint}"
    return None


def summary_request(cap: Phase) -> Message:
    """The user message of the tool-free summary call made at a budget cap."""
    return {
        "role": "user",
        "content": f"[agentrun] The run has reached its budget ({cap.value}) and cannot call "
        "tools any more. Summarize what you found so far and what remains open, in a few "
        "sentences.",
    }


def _nudge(window: int) -> str:
    return (
        f"[agentrun] Your last {window} turns produced tool results you had already seen: "
        "you are not making progress. Try a different approach, or give your final answer."
    )


def turn_signature(record: records.Answered, pollable: frozenset[str]) -> str | None:
    """The multiset of (tool, ok/error, clipped result) of the calls a turn ran, hashed.

    ``None`` when the turn ran no non-pollable tool (such a turn is never stale). Keyed on
    results, not arguments: calls that vary their arguments but learn nothing new are stale
    ; pollable tools are exempt.
    """
    items = sorted(
        f"{r.name}\x1f{'err' if r.is_error else 'ok'}\x1f{r.content[:SIGNATURE_CLIP]}"
        for r in _ran_results(record)
        if r.name not in pollable
    )
    if not items:
        return None
    return hashlib.sha256("\x1e".join(items).encode()).hexdigest()[:24]


def _ran_results(record: records.Answered) -> list[records.ToolResult]:
    """Results of the valid calls that actually ran (not invalid, held or gated ones)."""
    if record.stopped is not None:
        return []
    valid = {c.id for c in record.calls if isinstance(c, CheckedCall)} - set(record.held)
    return [r for r in record.results if r.tool_call_id in valid]


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
    state: RunState, record: records.Answered, limits: Limits, seen: _Turn
) -> tuple[Phase, str]:
    """The phase after an answered turn: exactly one decision per turn, caps checked last."""
    if record.stopped is not None:
        return record.stopped.phase, record.stopped.message
    unknown = [r for r in _ran_results(record) if r.fault is ToolFault.EFFECT_UNKNOWN]
    if unknown:
        return Phase.EFFECT_UNKNOWN, unknown[0].content
    decision = record.decision
    if isinstance(decision, Refusal):
        return Phase.REFUSED, decision.text
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
    return Phase.RUNNING, f"turn {record.turn} committed"


def _settle_phase(after: RunState, ending: records.Ending, limits: Limits) -> RunState:
    """Set the decided phase; a cap with ``onExhausted: summarize`` asks for a summary first."""
    if ending.phase in CAPS and limits.on_exhausted is OnExhausted.SUMMARIZE:
        return dataclasses.replace(
            after, pending_cap=ending.phase, message=f"{ending.message}; asking for a summary"
        )
    return dataclasses.replace(after, phase=ending.phase, message=ending.message)


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
            return _advance_resume(state, record)
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


def _correction_notes(
    decision: Decision, output_error: str | None, *, nudged: bool, limits: Limits
) -> tuple[Message, ...]:
    """The user messages that correct the model after this turn: a malformed decision, an
    answer that misses the output schema, the no-progress nudge (none for a clean turn)."""
    corrections = [correction_for(decision)]
    if output_error is not None:
        corrections.append(
            f"[agentrun] Your final answer does not meet the required output schema: "
            f"{output_error}. Reply with only a JSON document valid against: "
            f"{json.dumps(limits.output_schema, separators=(',', ':'), sort_keys=True)}"
        )
    if nudged:
        corrections.append(_nudge(limits.no_progress_window))
    return tuple({"role": "user", "content": c} for c in corrections if c is not None)


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
    signature = turn_signature(record, limits.pollable)
    stale = signature is not None and signature in state.signatures
    stale_streak = (
        state.stale_streak + 1 if stale else (0 if signature is not None else state.stale_streak)
    )
    nudged = stale and stale_streak == limits.no_progress_window
    notes = _correction_notes(decision, output_error, nudged=nudged, limits=limits)
    ran = _ran_results(record)
    after = dataclasses.replace(
        state,
        messages=state.messages + (() if record.held else _messages_of(record)) + notes,
        turn=state.turn + 1,
        steps=state.steps + 1,
        tool_calls=state.tool_calls + len(ran),
        tool_failures=state.tool_failures + sum(r.is_error for r in record.results),
        corrections=state.corrections + (1 if malformed or output_error or nudged else 0),
        malformed_streak=state.malformed_streak + 1 if malformed else 0,
        usage=state.usage + record.usage,
        answer=decision.content if isinstance(decision, Final) and output_error is None else None,
        call_ids=state.call_ids | {c.id for c in record.calls},
        signatures=state.signatures | {signature} if signature is not None else state.signatures,
        stale_streak=stale_streak,
        unavailable=_unavailable(state, ran),
        output_failures=state.output_failures + (1 if output_error else 0),
        pending=approval.pending_of(record) if record.held else None,
    )
    phase, message = _decide(after, record, limits, _Turn(malformed, output_error))
    if phase is Phase.RUNNING and after.pending is not None:
        waiting = after.pending.next_undecided
        assert waiting is not None
        phase = Phase.AWAITING_APPROVAL
        message = f"waiting for approval of {waiting.name} ({waiting.id})"
    return _settle_phase(after, records.Ending(phase, message), limits)


def _advance_summary(state: RunState, record: records.Summarized) -> RunState:
    """Fold the tool-free summary call made at a cap: the run ends with the cap's reason."""
    if state.pending_cap is None:
        raise ValueError(f"turn {record.turn} is a summary, but no cap is pending")
    decision = record.decision
    answer = decision.content if isinstance(decision, Final) else None
    messages: tuple[Message, ...] = (summary_request(state.pending_cap),)
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


def _advance_resume(state: RunState, record: records.Resumed) -> RunState:
    """Fold the turn that settled a held batch: the batch enters history whole, in call order."""
    pending = state.pending
    if pending is None or pending.next_undecided is not None:
        raise ValueError(f"turn {record.turn} resumes, but no decided approval is pending")
    held = pending.record
    by_id = {r.tool_call_id: r for r in (*held.results, *record.results)}
    assistant = _assistant_message(held)
    assert assistant is not None
    approved = {h.id for h in pending.held if h.approved}
    ran = [r for r in record.results if r.tool_call_id in approved]
    stopped = record.stopped
    unknown = next((r for r in ran if r.fault is ToolFault.EFFECT_UNKNOWN), None)
    if stopped is None and unknown is not None:
        stopped = records.Ending(Phase.EFFECT_UNKNOWN, unknown.content)
    return dataclasses.replace(
        state,
        messages=(*state.messages, assistant, *(_tool_message(by_id[c.id]) for c in held.calls)),
        turn=state.turn + 1,
        tool_calls=state.tool_calls + (0 if record.stopped else len(ran)),
        tool_failures=state.tool_failures + sum(r.is_error for r in record.results),
        unavailable=_unavailable(state, ran),
        call_ids=state.call_ids | {c.id for c in held.calls},
        pending=None,
        phase=stopped.phase if stopped else Phase.RUNNING,
        message=stopped.message if stopped else "approved calls settled",
    )


def resolve_approval(state: RunState, *, digest: str, approved: bool) -> RunState:
    """Apply a person's decision on the next held call (bound to its ``digest``).

    Raises ``ValueError`` when the run is not waiting or the digest is not the pending call's.
    Once every held call is decided the run is ``running`` again and its next turn resumes.
    """
    if state.phase is not Phase.AWAITING_APPROVAL or state.pending is None:
        raise ValueError(f"the run is {state.phase.value}, not waiting for an approval")
    pending = approval.decide(state.pending, digest=digest, approved=approved)
    waiting = pending.next_undecided
    verdict = "approved" if approved else "denied"
    if waiting is not None:
        return dataclasses.replace(
            state,
            pending=pending,
            message=f"{verdict}; waiting for approval of {waiting.name} ({waiting.id})",
        )
    return dataclasses.replace(
        state, pending=pending, phase=Phase.RUNNING, message=f"{verdict} by reviewer"
    )


def _messages_of(record: records.Answered) -> tuple[Message, ...]:
    out: list[Message] = []
    assistant = _assistant_message(record)
    if assistant is not None:
        out.append(assistant)
    out.extend(_tool_message(r) for r in record.results)
    return tuple(out)


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
        corrections=summary.corrections,
        usage=summary.usage,
        phase=summary.phase,
        answer=summary.answer,
        message=summary.message,
    )
