"""Budget gates and ``advance``: the one place that decides a run's phase after each turn.

A turn is: gate the model call, call the model (worker), classify, validate, gate the tool
batch, run the tools (worker), then fold the ``TurnRecord`` into the state with ``advance``.
Ending a run is a value (a terminal ``Phase``), never an exception.
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from typing import Any

from agentrun.kernel.decision import Decision, Final, Malformed, MalformedCause, Refusal, ToolCalls
from agentrun.kernel.limits import Limits, Pricing
from agentrun.kernel.state import Message, RunState
from agentrun.kernel.terminal import Phase
from agentrun.kernel.usage import Usage
from agentrun.kernel.validate import CheckedCall, InvalidCall, stored_arguments

ERROR_PREFIX = "ERROR: "
"""Tool messages have no error flag in the OpenAI shape; an error result's content starts so."""


@dataclasses.dataclass(frozen=True, slots=True)
class Gate:
    """The verdict of a budget gate: allowed (``phase is None``) or the cap that stops the run."""

    phase: Phase | None
    """``None`` when allowed, else the terminal phase."""
    max_output_tokens: int = 0
    """For a model call: the most output tokens the call may produce within every budget."""
    message: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class ToolResult:
    """The result of one call, correlated by ``tool_call_id`` (one per call, always)."""

    tool_call_id: str
    name: str
    content: str
    is_error: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class ModelFailure:
    """The model could not be reached or kept failing (after retries): ``model_error``."""

    error: str


@dataclasses.dataclass(frozen=True, slots=True)
class TurnRecord:
    """What one turn did; the content of a committed turn event."""

    turn: int
    gate: Gate | None = None
    """A gate that stopped the turn (before the model call, or before the tool batch)."""
    decision: Decision | None = None
    """The classified response; ``None`` when no model call returned."""
    calls: tuple[CheckedCall | InvalidCall, ...] = ()
    """The validated calls, in the assistant's order, with their final ids."""
    results: tuple[ToolResult, ...] = ()
    """One result per call in ``calls``, same order."""
    usage: Usage = dataclasses.field(default_factory=Usage)
    """This turn's model usage."""
    failure: ModelFailure | None = None


def _pct_left(used: Decimal, cap: Decimal) -> str:
    return f"{used} of {cap}"


def admit_model_call(
    state: RunState,
    limits: Limits,
    *,
    pricing: Pricing,
    prompt_estimate: int,
    now: float,
    deadline: float,
) -> Gate:
    """May the next model call start, and with how many output tokens at most?

    Checks, in order: the wall-clock deadline (``now``/``deadline`` in epoch seconds), the step
    cap, then the token and cost caps against the worst case of this call (``prompt_estimate``
    input tokens plus the output allowance). The output allowance is cut to what the budgets
    leave; below ``limits.min_output_tokens`` the call is not made.
    """
    if now >= deadline:
        return Gate(
            Phase.DEADLINE_EXCEEDED, message="the run's timeout passed before the next model call"
        )
    if state.steps >= limits.max_steps:
        return Gate(Phase.MAX_STEPS, message=f"maxSteps {limits.max_steps} reached")
    allowance = limits.max_output_tokens
    if limits.max_tokens is not None:
        left = limits.max_tokens - state.usage.total_tokens - prompt_estimate
        if left < limits.min_output_tokens:
            return Gate(
                Phase.TOKEN_BUDGET_EXHAUSTED,
                message=f"maxTokens {limits.max_tokens}: {state.usage.total_tokens} used, "
                f"the next prompt needs about {prompt_estimate}",
            )
        allowance = min(allowance, left)
    if limits.max_cost_usd is not None:
        left_usd = limits.max_cost_usd - state.usage.cost_usd
        left_usd -= pricing.cost(
            input_tokens=prompt_estimate, cached_input_tokens=0, output_tokens=0
        )
        if pricing.output_per_million > 0:
            affordable = int(left_usd * Decimal(1_000_000) / pricing.output_per_million)
        else:
            affordable = allowance if left_usd >= 0 else -1
        if affordable < limits.min_output_tokens:
            return Gate(
                Phase.COST_BUDGET_EXHAUSTED,
                message=f"maxCostUSD: {_pct_left(state.usage.cost_usd, limits.max_cost_usd)} "
                "spent; the next call could exceed it",
            )
        allowance = min(allowance, affordable)
    return Gate(None, max_output_tokens=allowance)


def admit_tool_batch(
    state: RunState, limits: Limits, *, calls: int, now: float, deadline: float
) -> Gate:
    """May a batch of ``calls`` valid tool calls run within the deadline and ``maxToolCalls``?

    All or none: a batch that does not fit is not started (its calls get "not run" results).
    """
    if calls and now >= deadline:
        return Gate(
            Phase.DEADLINE_EXCEEDED, message="the run's timeout passed before the tool batch"
        )
    if state.tool_calls + calls > limits.max_tool_calls:
        return Gate(
            Phase.TOOL_BUDGET_EXHAUSTED,
            message=f"maxToolCalls {limits.max_tool_calls}: {state.tool_calls} made, "
            f"{calls} more requested",
        )
    return Gate(None)


def _assistant_message(record: TurnRecord) -> Message | None:
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


def _tool_message(result: ToolResult) -> Message:
    content = ERROR_PREFIX + result.content if result.is_error else result.content
    return {"role": "tool", "tool_call_id": result.tool_call_id, "content": content}


def correction_for(decision: Decision, calls: tuple[CheckedCall | InvalidCall, ...]) -> str | None:
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


def _messages_of(record: TurnRecord, correction: str | None) -> tuple[Message, ...]:
    out: list[Message] = []
    assistant = _assistant_message(record)
    if assistant is not None:
        out.append(assistant)
    out.extend(_tool_message(r) for r in record.results)
    if correction is not None:
        out.append({"role": "user", "content": correction})
    return tuple(out)


def _decide(
    state: RunState, record: TurnRecord, limits: Limits, malformed: bool
) -> tuple[Phase, str]:
    """The phase after a turn: exactly one decision per turn, caps checked last."""
    if record.gate is not None and record.gate.phase is not None:
        return record.gate.phase, record.gate.message
    if record.failure is not None:
        return Phase.MODEL_ERROR, record.failure.error
    decision = record.decision
    if isinstance(decision, Refusal):
        return Phase.REFUSED, decision.text
    if isinstance(decision, Final):
        return Phase.COMPLETED, "the model gave a final answer"
    if malformed and state.malformed_streak >= limits.malformed_limit:
        return Phase.INVALID_DECISION, (
            f"{state.malformed_streak} malformed turns in a row (limit {limits.malformed_limit})"
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


def advance(state: RunState, record: TurnRecord, limits: Limits) -> RunState:
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
    decision = record.decision
    invalid = sum(isinstance(c, InvalidCall) for c in record.calls)
    malformed = isinstance(decision, Malformed) or invalid > 0
    correction = correction_for(decision, record.calls) if decision is not None else None
    ran = sum(isinstance(c, CheckedCall) for c in record.calls) if record.gate is None else 0
    failures = sum(r.is_error for r in record.results)
    called = record.decision is not None or record.failure is not None
    answer = decision.content if isinstance(decision, Final) else None
    after = dataclasses.replace(
        state,
        messages=state.messages + _messages_of(record, correction),
        turn=state.turn + 1,
        steps=state.steps + (1 if called and record.failure is None else 0),
        tool_calls=state.tool_calls + ran,
        tool_failures=state.tool_failures + failures,
        corrections=state.corrections + (1 if malformed else 0),
        malformed_streak=state.malformed_streak + 1 if malformed else 0,
        usage=state.usage + record.usage,
        answer=answer,
        call_ids=state.call_ids | {c.id for c in record.calls},
    )
    phase, message = _decide(after, record, limits, malformed)
    return dataclasses.replace(after, phase=phase, message=message)


def stop(state: RunState, phase: Phase, message: str) -> RunState:
    """End a run from outside the turn (deadline, cancellation); a no-op on an ended run."""
    if state.phase.is_terminal:
        return state
    return dataclasses.replace(state, phase=phase, message=message)


def state_from_summary(summary: dict[str, Any]) -> RunState:
    """A state holding only counters (no messages), rebuilt from ``RunState.summary()``.

    The operator projects status from summaries and never needs the transcript.
    """
    return RunState(
        messages=(),
        turn=int(summary.get("turn", 0)),
        steps=int(summary.get("steps", 0)),
        tool_calls=int(summary.get("toolCalls", 0)),
        tool_failures=int(summary.get("toolFailures", 0)),
        corrections=int(summary.get("corrections", 0)),
        usage=Usage.from_dict(summary.get("usage") or {}),
        phase=Phase(summary.get("phase", "running")),
        answer=summary.get("answer"),
        message=str(summary.get("message", "")),
    )
