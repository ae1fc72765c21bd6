"""The loop kernel: purely computational, no I/O.

What belongs here: the immutable run state and its summary, the typed decision a model response
is classified into, tool-call validation, the bounded checks of users' and tool servers'
schemas and patterns (``schemas``: RE2 and a work budget), budget gates, the bounds of what one
turn may hold (``bounds``: its event must fit the bus's message cap), the planning of each
turn (``plan``: what the worker does next, and every record a turn can end in), and the one
function that decides a run's phase after each turn (``advance``). What does not: anything
that waits, sends or reads (asyncio, NATS, HTTP, Kubernetes), or any JSON shape
(``agentrun.protocol``). The worker and the operator call these functions; nothing else
decides a phase. An import contract (``pyproject.toml``, run by ``make lint``) keeps this
package free of I/O imports.
"""

from agentrun.kernel.approval import (
    DENIED,
    HeldCall,
    HoldReason,
    PendingBatch,
    digest_of,
    held_calls,
)
from agentrun.kernel.bounds import (
    MESSAGE_CAP,
    bound_results,
    clip_result,
    results_budget,
    shrink_record,
)
from agentrun.kernel.context import fit_context
from agentrun.kernel.decision import (
    MAX_CALLS_PER_REPLY,
    PLACEHOLDER_CHARS,
    Decision,
    Final,
    Malformed,
    MalformedCause,
    Refusal,
    ToolCall,
    ToolCalls,
    classify,
)
from agentrun.kernel.faults import ToolFault, backoff, may_retry, next_unavailable
from agentrun.kernel.gates import admit_model_call, admit_tool_batch
from agentrun.kernel.limits import MIN_SHRUNK_OUTPUT_TOKENS, Limits, OnExhausted, Pricing
from agentrun.kernel.loop import (
    advance,
    resolve_approval,
    state_from_summary,
    stop,
)
from agentrun.kernel.plan import (
    CallModel,
    EndRun,
    ModelFault,
    Offer,
    ResumeHeld,
    RunTools,
    Timing,
    TurnPlan,
    model_failed,
    not_run,
    plan_answer,
    plan_turn,
    refused_by_tenant,
)
from agentrun.kernel.records import (
    Answered,
    Ending,
    Gate,
    ModelFailed,
    Resumed,
    Stopped,
    Summarized,
    ToolResult,
    TurnRecord,
    record_results,
    record_usage,
)
from agentrun.kernel.state import RunState, RunSummary, initial_state
from agentrun.kernel.terminal import (
    Outcome,
    Phase,
    ResourcePhase,
    Terminal,
    TerminalReason,
    conclude,
)
from agentrun.kernel.transcript import summary_request
from agentrun.kernel.usage import (
    LEAST_ASCII_CHARS,
    LEAST_OTHER_CHARS,
    Delivered,
    Usage,
    completion_texts,
    estimate_tokens,
    implausible_usage,
    least_tokens,
    most_billable,
    output_estimate,
    prompt_texts,
    prompt_token_bound,
    read_usage,
)
from agentrun.kernel.validate import CheckedCall, InvalidCall, ToolSchema, check_calls

__all__ = [
    "DENIED",
    "LEAST_ASCII_CHARS",
    "LEAST_OTHER_CHARS",
    "MAX_CALLS_PER_REPLY",
    "MESSAGE_CAP",
    "MIN_SHRUNK_OUTPUT_TOKENS",
    "PLACEHOLDER_CHARS",
    "Answered",
    "CallModel",
    "CheckedCall",
    "Decision",
    "Delivered",
    "EndRun",
    "Ending",
    "Final",
    "Gate",
    "HeldCall",
    "HoldReason",
    "InvalidCall",
    "Limits",
    "Malformed",
    "MalformedCause",
    "ModelFailed",
    "ModelFault",
    "Offer",
    "OnExhausted",
    "Outcome",
    "PendingBatch",
    "Phase",
    "Pricing",
    "Refusal",
    "ResourcePhase",
    "ResumeHeld",
    "Resumed",
    "RunState",
    "RunSummary",
    "RunTools",
    "Stopped",
    "Summarized",
    "Terminal",
    "TerminalReason",
    "Timing",
    "ToolCall",
    "ToolCalls",
    "ToolFault",
    "ToolResult",
    "ToolSchema",
    "TurnPlan",
    "TurnRecord",
    "Usage",
    "admit_model_call",
    "admit_tool_batch",
    "advance",
    "backoff",
    "bound_results",
    "check_calls",
    "classify",
    "clip_result",
    "completion_texts",
    "conclude",
    "digest_of",
    "estimate_tokens",
    "fit_context",
    "held_calls",
    "implausible_usage",
    "initial_state",
    "least_tokens",
    "may_retry",
    "model_failed",
    "most_billable",
    "next_unavailable",
    "not_run",
    "output_estimate",
    "plan_answer",
    "plan_turn",
    "prompt_texts",
    "prompt_token_bound",
    "read_usage",
    "record_results",
    "record_usage",
    "refused_by_tenant",
    "resolve_approval",
    "results_budget",
    "shrink_record",
    "state_from_summary",
    "stop",
    "summary_request",
]
