"""The Kubernetes Events of a run: their wording, in one place.

What belongs here: the AgentRun as an Event's object and the run-level occasions (a run ended;
a held call waits for a person). What does not: when they happen (the dispatcher, the queue
status), the throttle and the poster (``platform.events``).
"""

from __future__ import annotations

from agentrun import display, kernel

from ..platform.events import EventRecorder, EventType, Involved
from .keys import RunKey

MODEL_CALLS_FAILING = (
    "a run on this model ended model_error (the Event's count says how many); the cause is in "
    "that run's own Events and status, and agentrun_model_call_errors_total{model,error_type} "
    "counts the errors by type"
)
"""The message of ``ModelCallsFailing``. An AgentModel is cluster-scoped, so its Events are in
``default``, readable by people of every tenant: the message names no run, namespace or
tenant and quotes no provider text (which may echo a prompt)."""


def involved(key: RunKey) -> Involved:
    """The AgentRun ``key`` as the object of an Event."""
    return Involved("AgentRun", key.name, key.namespace, key.uid)


def usage_line(summary: kernel.RunSummary) -> str:
    """``3 steps, 1 tool call, 390 tokens, 0.000975 USD``."""
    usage = summary.usage
    return (
        f"{display.counted(summary.steps, 'step')}, "
        f"{display.counted(summary.tool_calls, 'tool call')}, "
        f"{display.counted(usage.total_tokens, 'token')}, {usage.cost_usd:.6f} USD"
    )


def record_end(
    recorder: EventRecorder, key: RunKey, summary: kernel.RunSummary, *, model: str | None
) -> None:
    """The run ended: ``reason`` is its terminal reason in CamelCase (``Completed``,
    ``MaxSteps``...), Normal for completed and cancelled, Warning otherwise; a ``model_error``
    end also warns on its AgentModel (``ModelCallsFailing``, once per model per interval,
    saying nothing of the run: ``MODEL_CALLS_FAILING``)."""
    terminal = kernel.conclude(summary.phase, steps=summary.steps)
    if terminal is None:
        return
    value = terminal.reason.value
    reason = "".join(part.capitalize() for part in value.split("_"))
    fine = value in (kernel.TerminalReason.COMPLETED.value, kernel.TerminalReason.CANCELLED.value)
    message = f"ended {value} (outcome {terminal.outcome.value}) after {usage_line(summary)}"
    if summary.message:
        message += f": {summary.message}"
    recorder.record(
        involved(key),
        type=EventType.NORMAL if fine else EventType.WARNING,
        reason=reason,
        message=message,
    )
    if value == kernel.TerminalReason.MODEL_ERROR.value and model:
        recorder.record(
            Involved("AgentModel", model),
            type=EventType.WARNING,
            reason="ModelCallsFailing",
            message=MODEL_CALLS_FAILING,
        )


def record_approval_requested(recorder: EventRecorder, key: RunKey, held: kernel.HeldCall) -> None:
    """The run waits for a person to decide ``held`` (once per held call); the command the
    message shows names the run's namespace, so that it works as shown from any context."""
    recorder.record(
        involved(key),
        type=EventType.NORMAL,
        reason="ApprovalRequested",
        message=(
            f"tool call {held.id} ({held.name}) waits for a person: kubectl agentrun approve "
            f"{key.name} -n {key.namespace} (or deny); digest {held.digest}"
        ),
        key=(key.uid, "ApprovalRequested", held.digest),
    )
