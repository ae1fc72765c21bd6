"""The transcript a run's turns add to its history: assistant and tool messages, the corrective
notes (malformed replies, the output schema, the no-progress nudge), the summary request at a
cap, and the no-progress signature of the results a turn ran. Pure functions of records; the
phase is decided in ``loop``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from agentrun.kernel import records
from agentrun.kernel.decision import Decision, Final, Malformed, MalformedCause, ToolCalls
from agentrun.kernel.limits import Limits
from agentrun.kernel.state import Message
from agentrun.kernel.terminal import Phase
from agentrun.kernel.validate import CheckedCall, InvalidCall, stored_arguments

SIGNATURE_CLIP = 512
"""Characters of a result that count toward its no-progress signature."""


def assistant_message(record: records.Answered) -> Message | None:
    """The assistant message of an answered turn (``None`` for a refusal or a malformed reply),
    with its calls under their final ids."""
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


def tool_message(result: records.ToolResult) -> Message:
    """The tool message of one result (an error result's content starts with ``ERROR: ``)."""
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
            MalformedCause.OVERSIZED: "Give a shorter final answer.",
            MalformedCause.TOO_MANY_CALLS: "Make fewer tool calls in one reply, and spread "
            "the work over several turns.",
            MalformedCause.UNSTORABLE: "Make fewer tool calls in one reply, ask the tools for "
            "less output, and keep your text and arguments short.",
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


def nudge(window: int) -> str:
    """The no-progress nudge after ``window`` turns of results already seen."""
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
    return signature(ran_results(record), pollable)


def signature(ran: Sequence[records.ToolResult], pollable: frozenset[str]) -> str | None:
    """``turn_signature`` of the results ``ran`` (``None`` when none is of a non-pollable tool)."""
    items = sorted(
        f"{r.name}\x1f{'err' if r.is_error else 'ok'}\x1f{r.content[:SIGNATURE_CLIP]}"
        for r in ran
        if r.name not in pollable
    )
    if not items:
        return None
    return hashlib.sha256("\x1e".join(items).encode()).hexdigest()[:24]


def ran_results(record: records.Answered) -> list[records.ToolResult]:
    """Results of the valid calls that actually ran (not invalid, held or gated ones)."""
    if record.stopped is not None:
        return []
    valid = {c.id for c in record.calls if isinstance(c, CheckedCall)}
    valid -= {*record.held, *record.deferred}
    return [r for r in record.results if r.tool_call_id in valid]


def failed_count(record: records.Answered, ran: list[records.ToolResult]) -> int:
    """Failures a turn adds to ``tool_failures``: the calls in ``ran`` (``ran_results``) whose
    result is an error, plus the invalid calls (rejected before running). Calls that were not
    run (a stopped batch) are not failures: ``not_run_count`` counts them."""
    invalid = {c.id for c in record.calls if isinstance(c, InvalidCall)}
    rejected = sum(r.is_error for r in record.results if r.tool_call_id in invalid)
    return rejected + sum(r.is_error for r in ran)


def not_run_count(record: records.Answered) -> int:
    """Valid calls of a turn whose batch did not fit a budget (``record.stopped``): 0 or more."""
    if record.stopped is None:
        return 0
    return sum(isinstance(c, CheckedCall) for c in record.calls)


def correction_notes(
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
        corrections.append(nudge(limits.no_progress_window))
    return tuple({"role": "user", "content": c} for c in corrections if c is not None)


def messages_of(record: records.Answered) -> tuple[Message, ...]:
    """The history messages of an answered turn: its assistant message, then its results."""
    out: list[Message] = []
    assistant = assistant_message(record)
    if assistant is not None:
        out.append(assistant)
    out.extend(tool_message(r) for r in record.results)
    return tuple(out)
