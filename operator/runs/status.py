"""Status projection: a run's latest event (or admission failure) → the ``.status`` body.

Pure. ``.status`` is a projection of the run's event stream; these functions are the only
place that shapes it (conditions: ``platform.conditions``), and they keep it within the
AgentRun CRD's bounds: ``message`` at ``MAX_MESSAGE_CHARS``, ``pendingApproval`` at
``MAX_PENDING_BYTES`` (the answer is bounded by the kernel, 128 KiB). What does not belong
here: writing it (``writer``).
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from agentrun import kernel, protocol

from ..platform.conditions import camel, condition, rfc3339

MAX_MESSAGE_CHARS = 32_768
"""``status.message``'s bound in the CRD (``maxLength``); a longer message is cut."""
MAX_PENDING_BYTES = 262_144
"""Bytes (compact JSON) ``status.pendingApproval`` may take: up to 128 held calls of 64 KiB of
arguments each would not fit an object the API server stores; past it the arguments of the
calls not being decided now are replaced by a note of their size (the run's events keep
them whole: ``kubectl agentrun logs``), then the current call's too."""
ARGUMENTS_ELIDED = "(arguments of {size} bytes elided from the status; see the run's events)"


def message_text(message: str) -> str:
    """``message`` within ``MAX_MESSAGE_CHARS`` (cut with ``…``)."""
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    return message[: MAX_MESSAGE_CHARS - 1] + "…"


def bounded_pending(pending: dict[str, Any] | None) -> dict[str, Any] | None:
    """``pending`` (``protocol.pending_approval_as_dict``) within ``MAX_PENDING_BYTES``."""
    if pending is None or _size(pending) <= MAX_PENDING_BYTES:
        return pending
    held = [dict(call) for call in pending.get("heldCalls") or []]
    pending = {**pending, "heldCalls": held}
    current = pending.get("toolCallID")
    for call in [c for c in held if c.get("toolCallID") != current] + [pending]:
        call["arguments"] = ARGUMENTS_ELIDED.format(size=len(str(call.get("arguments", ""))))
        if _size(pending) <= MAX_PENDING_BYTES:
            break
    return pending


def _size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def not_admitted(reason: str, message: str, *, at: float, generation: int) -> dict[str, Any]:
    """The ``Admitted=False`` condition of a run that waits or ended before admission."""
    return condition(
        "Admitted", status=False, reason=reason, message=message, at=at, generation=generation
    )


def usd_text(amount: Decimal) -> str:
    """``amount`` (USD) as a decimal string, exact — never rounded: the tenant's ledger is
    rebuilt from the runs' statuses, and the sum of their costs must be the ledger's to the
    last digit — with at least 6 places (``0.001715``, ``0.0017155``, ``0.000000``)."""
    places = max(6, -int(amount.normalize().as_tuple().exponent))
    return f"{amount:.{places}f}"


def usage_status(summary: kernel.RunSummary, *, wall_seconds: float) -> dict[str, Any]:
    """``.status.usage`` from a run's counters (``eventBytes``, the bytes its events take, is
    the dispatcher's: ``RunEvent.stored``)."""
    usage = summary.usage
    return {
        "steps": summary.steps,
        "toolCalls": summary.tool_calls,
        "toolFailures": summary.tool_failures,
        "toolCallsNotRun": summary.tool_calls_not_run,
        "corrections": summary.corrections,
        "inputTokens": usage.input_tokens,
        "outputTokens": usage.output_tokens,
        "cachedInputTokens": usage.cached_input_tokens,
        "reasoningTokens": usage.reasoning_tokens,
        "totalTokens": usage.total_tokens,
        "costUSD": usd_text(usage.cost_usd),
        "wallSeconds": round(wall_seconds, 3),
        "estimated": usage.estimated,
    }


def admitted_budget(config: protocol.RunConfig, *, start_time: float) -> dict[str, Any]:
    """``.status.budget``: the caps run ``config`` was admitted with, by ``spec.budget``'s field
    names, after its tenant's ``runBudget`` defaults and caps and the implicit defaults
    (``TenantPolicy.apply``): ``maxSteps``, ``maxToolCalls``, ``timeout`` (Go's duration text,
    to the millisecond, of its deadline's distance from ``start_time``, its admission in epoch
    seconds), and ``maxTokens`` and ``maxCostUSD`` (as written) when they are set. Every
    status projected from the run's events carries it (the same in each): its admission's
    write sets it, and a restart or a restored copy projects it again."""
    limits = config.limits
    budget: dict[str, Any] = {
        "maxSteps": limits.max_steps,
        "maxToolCalls": limits.max_tool_calls,
        "timeout": protocol.duration_text(max(0.0, config.deadline - start_time)),
    }
    if limits.max_tokens is not None:
        budget["maxTokens"] = limits.max_tokens
    if limits.max_cost_usd is not None:
        budget["maxCostUSD"] = format(limits.max_cost_usd, "f")
    return budget


def project(
    summary: kernel.RunSummary,
    *,
    seq: int,
    start_time: float,
    event_time: float,
    generation: int,
    tenant: str | None = None,
) -> dict[str, Any]:
    """The full ``.status`` after an event with this ``summary``.

    ``seq`` is the event's stream sequence; ``start_time`` (the run's admission) and
    ``event_time`` are epoch seconds; ``generation`` becomes ``observedGeneration``.
    """
    terminal = kernel.conclude(summary.phase, steps=summary.steps)
    waiting = summary.phase is kernel.Phase.AWAITING_APPROVAL
    status: dict[str, Any] = {
        "phase": (
            kernel.ResourcePhase.AWAITING_APPROVAL if waiting else kernel.ResourcePhase.RUNNING
        ).value,
        "queuePosition": None,  # admitted: out of the queue (merge patch removes it)
        "message": message_text(summary.message),
        "usage": usage_status(summary, wall_seconds=max(0.0, event_time - start_time)),
        "startTime": rfc3339(start_time),
        "observedGeneration": generation,
        "lastEventSequence": seq,
        # None removes it (merge patch)
        "pendingApproval": bounded_pending(protocol.pending_approval_as_dict(summary)),
    }
    if tenant is not None:
        status["tenant"] = tenant
    if terminal is not None:
        status.update(_ended(terminal, summary, event_time=event_time))
    admitted = condition(
        "Admitted",
        status=True,
        reason="Admitted",
        message="admitted and dispatched",
        at=start_time,
        generation=generation,
    )
    status["conditions"] = [
        admitted,
        _finished(
            summary, terminal, at=event_time if terminal else start_time, generation=generation
        ),
    ]
    return status


def _finished(
    summary: kernel.RunSummary, terminal: kernel.Terminal | None, *, at: float, generation: int
) -> dict[str, Any]:
    """The ``Finished`` condition: True with the terminal reason once the run ended, else False
    with ``Running`` or ``AwaitingApproval``."""
    if terminal is None:
        waiting = summary.phase is kernel.Phase.AWAITING_APPROVAL
        reason = "AwaitingApproval" if waiting else "Running"
    else:
        reason = camel(terminal.reason.value)
    return condition(
        "Finished",
        status=terminal is not None,
        reason=reason,
        message=summary.message,
        at=at,
        generation=generation,
    )


def _ended(
    terminal: kernel.Terminal, summary: kernel.RunSummary, *, event_time: float
) -> dict[str, Any]:
    """The fields a terminal status adds: phase, reason, outcome, completion time, answer."""
    fields: dict[str, Any] = {
        "phase": terminal.resource_phase.value,
        "terminalReason": terminal.reason.value,
        "outcome": terminal.outcome.value,
        "completionTime": rfc3339(event_time),
    }
    if summary.answer is not None:
        fields["answer"] = summary.answer
    return fields


def rejected(
    message: str,
    *,
    at: float,
    generation: int,
    phase: kernel.Phase = kernel.Phase.INVALID_SPEC,
    tenant: str | None = None,
) -> dict[str, Any]:
    """``.status`` of a run that ended without being admitted: ``invalid_spec`` by default;
    ``tenant_budget_exhausted`` (tenant policy ``whenExhausted: Fail``) or ``cancelled`` (while
    queued) otherwise."""
    terminal = kernel.conclude(phase, steps=0)  # never admitted: nothing was done
    assert terminal is not None
    reason = camel(terminal.reason.value)
    body: dict[str, Any] = {
        "phase": terminal.resource_phase.value,
        "terminalReason": terminal.reason.value,
        "outcome": terminal.outcome.value,
        "message": message_text(message),
        "observedGeneration": generation,
        "completionTime": rfc3339(at),
        "queuePosition": None,
        "conditions": [
            not_admitted(reason, message, at=at, generation=generation),
            condition(
                "Finished",
                status=True,
                reason=reason,
                message=message,
                at=at,
                generation=generation,
            ),
        ],
    }
    if tenant is not None:
        body["tenant"] = tenant
    return body


def handed_over(*, tenant: str, message: str, at: float, generation: int) -> dict[str, Any]:
    """``.status`` of a queued run handed to another operator shard (its namespace binds
    ``tenant``, that shard's, now): no ``phase`` and no ``queuePosition`` (a merge patch removes
    them), ``tenant`` naming the shard's tenant, ``Admitted=False`` (``TenantChanged``). So its
    new owner's kopf takes it for a run whose creation no process handled, and admits it
    (``handlers.admission``: ``runs.handled`` reads no phase as never handled)."""
    return {
        "phase": None,
        "tenant": tenant,
        "queuePosition": None,
        "message": message_text(message),
        "observedGeneration": generation,
        "conditions": [not_admitted("TenantChanged", message, at=at, generation=generation)],
    }


def queued(
    *, tenant: str, reason: str, message: str, position: int, at: float, generation: int
) -> dict[str, Any]:
    """``.status`` of a run waiting in its tenant's admission queue.

    ``reason`` is the ``Admitted=False`` condition's reason (``ConcurrencyLimit``,
    ``BudgetExhausted``, ``Waiting`` behind earlier runs); ``position`` is 1-based.
    """
    return {
        "phase": kernel.ResourcePhase.QUEUED.value,
        "tenant": tenant,
        "queuePosition": position,
        "message": message_text(message),
        "observedGeneration": generation,
        "conditions": [not_admitted(reason, message, at=at, generation=generation)],
    }
