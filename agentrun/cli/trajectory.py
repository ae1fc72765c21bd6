"""A run's trajectory as a person reads it: one block of lines per committed run event.

What belongs here: turning ``RunEvent`` values (admission, model turns with their tool calls
and results, corrections, approvals, stops, the end) into short, readable lines, with long
arguments, results and texts truncated — except the arguments of a call held for a person's
approval, shown in full (indented JSON) with the digest that approves exactly them. Every line
is safe to print: model and tool text has its terminal controls written as visible escapes
(``agentrun.display``). Pure: no I/O; ``kubectl agentrun logs`` prints what this returns.
What does not: reading the events (``bus``), the command line (``kubectl``).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from typing import Any, assert_never

from agentrun import display, kernel
from agentrun.kernel import decision as dec
from agentrun.protocol import RunEvent

TEXT_LIMIT = 200
"""Characters of model text, tool results and answers shown before ``…``."""
ARGUMENTS_LIMIT = 120
"""Characters of a tool call's JSON arguments shown before ``…``."""


def truncate(text: str, limit: int) -> str:
    """``text`` on one line, cut to ``limit`` characters with ``…`` (and the total) if longer."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    return f"{flat[: limit - 1]}… ({len(flat)} chars)"


def arguments_text(arguments: Mapping[str, Any] | Any) -> str:
    """A call's arguments as compact JSON, truncated to ``ARGUMENTS_LIMIT``."""
    try:
        text = json.dumps(arguments, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        text = str(arguments)
    return truncate(text, ARGUMENTS_LIMIT)


def clock(epoch: float) -> str:
    """``HH:MM:SS`` (UTC) of an event's time."""
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%H:%M:%S")


def usage_text(usage: kernel.Usage) -> str:
    """``usage 100 in (40 cached) + 20 out tokens, 0.000450 USD`` (``~`` when estimated)."""
    mark = "~" if usage.estimated else ""
    cached = f" ({usage.cached_input_tokens} cached)" if usage.cached_input_tokens else ""
    return (
        f"usage {mark}{usage.input_tokens} in{cached} + {usage.output_tokens} out tokens, "
        f"{usage.cost_usd:.6f} USD"
    )


def event_lines(event: RunEvent) -> list[str]:
    """The lines of one event: a headed first line, indented details, and an ``end`` line
    when the event ends the run; each line ``display.printable`` (one line, no control
    character)."""
    at = clock(event.time) if event.time else "--:--:--"
    lines = [
        f"{at} {line}" if i == 0 else f"         {line}" for i, line in enumerate(_body(event))
    ]
    terminal = kernel.conclude(event.summary.phase, steps=event.summary.steps)
    if terminal is not None:
        lines.append(f"{at} {end_line(event.summary)}")
    return [display.printable(line, newlines=False) for line in lines]


def held_lines(name: str, arguments: Mapping[str, Any] | Any, *, digest: str) -> list[str]:
    """A call held for approval as a person decides it: its digest (what ``approve --digest``
    names) and its arguments in full, indented JSON with terminal controls neutralised."""
    return [
        f"digest {digest}",
        f"{name} arguments (in full):",
        *(f"  {line}" for line in display.arguments_block(arguments).splitlines()),
    ]


def end_line(summary: kernel.RunSummary) -> str:
    """``end  Succeeded completed (ok): 2 steps, 1 tool call, 390 tokens, 0.000975 USD``, and
    the answer or the message."""
    terminal = kernel.conclude(summary.phase, steps=summary.steps)
    assert terminal is not None
    usage = summary.usage
    line = (
        f"end   {terminal.resource_phase.value} {terminal.reason.value} "
        f"({terminal.outcome.value}): {display.counted(summary.steps, 'step')}, "
        f"{display.counted(summary.tool_calls, 'tool call')}, "
        f"{usage.total_tokens} tokens, {usage.cost_usd:.6f} USD"
    )
    if summary.answer is not None:
        return f"{line}; answer: {truncate(summary.answer, TEXT_LIMIT)}"
    if summary.message:
        return f"{line}; {truncate(summary.message, TEXT_LIMIT)}"
    return line


def _body(event: RunEvent) -> list[str]:
    match event.kind:
        case "admitted":
            return _admitted(event)
        case "turn":
            return _turn(event.record) if event.record is not None else ["turn"]
        case "stop":
            return [f"stop  {truncate(event.summary.message, TEXT_LIMIT)}"]
        case "approval":
            approval = event.approval
            if approval is None:
                return ["approval"]
            verdict = "approved" if approval.approved else "denied"
            return [f"review {verdict} held call {approval.digest}"]
        case _:
            assert_never(event.kind)


def _admitted(event: RunEvent) -> list[str]:
    config = event.config
    if config is None:
        return ["admitted"]
    limits = config.limits
    caps = [f"maxSteps {limits.max_steps}", f"maxToolCalls {limits.max_tool_calls}"]
    if limits.max_tokens is not None:
        caps.append(f"maxTokens {limits.max_tokens}")
    if limits.max_cost_usd is not None:
        caps.append(f"maxCostUSD {limits.max_cost_usd}")
    return [
        f"admitted in tenant {config.tenant}: model {config.model.name} "
        f"({config.model.model}), tools {', '.join(config.tools) or 'none'}",
        f"budget {', '.join(caps)}",
        f"goal: {truncate(config.goal, TEXT_LIMIT)}",
    ]


def _turn(record: kernel.TurnRecord) -> list[str]:
    match record:
        case kernel.Stopped(turn, ending):
            return [f"turn {turn}: stopped before the model call: {ending.message}"]
        case kernel.ModelFailed(turn, error):
            return [f"turn {turn}: model call failed: {truncate(error, TEXT_LIMIT)}"]
        case kernel.Answered():
            return _answered(record)
        case kernel.Summarized(turn, decision, usage, error):
            if decision is None:
                return [f"turn {turn}: no summary at the cap: {truncate(error, TEXT_LIMIT)}"]
            return [f"turn {turn}: summary at the cap", *_decision(decision), usage_text(usage)]
        case kernel.Resumed(turn, results, stopped):
            lines = [f"turn {turn}: pending calls settled (after review, or committed first)"]
            lines += [_result(result) for result in results]
            if stopped is not None:
                lines.append(f"stopped: {stopped.message}")
            return lines
        case _:
            assert_never(record)


def _answered(record: kernel.Answered) -> list[str]:
    lines = [f"turn {record.turn}: model", *_decision(record.decision)]
    results = {r.tool_call_id: r for r in record.results}
    for call in record.calls:
        if isinstance(call, kernel.CheckedCall):
            if call.id in record.held:
                lines.append(f"⏸ {call.name} [{call.id}] held for approval")
                digest = kernel.digest_of(call.name, call.arguments)
                lines += held_lines(call.name, call.arguments, digest=digest)
                continue
            lines.append(f"→ {call.name}({arguments_text(call.arguments)}) [{call.id}]")
            if call.id in record.deferred:
                lines.append(f"⏸ {call.name} [{call.id}] committed; runs next turn")
        else:
            lines.append(f"✗ {call.name} [{call.id}] rejected: {truncate(call.error, TEXT_LIMIT)}")
        result = results.get(call.id)
        if result is not None and isinstance(call, kernel.CheckedCall):
            lines.append(_result(result))
    if record.stopped is not None:
        lines.append(f"stopped: {record.stopped.message}")
    lines.append(usage_text(record.usage))
    return lines


def _decision(decision: dec.Decision) -> list[str]:
    match decision:
        case dec.Final(content):
            return [f"answer: {truncate(content, TEXT_LIMIT)}"]
        case dec.ToolCalls(_, content):
            return [f"says: {truncate(content, TEXT_LIMIT)}"] if content else []
        case dec.Refusal(text):
            return [f"refused: {truncate(text, TEXT_LIMIT)}"]
        case dec.Malformed(cause, detail, _):
            return [f"correction ({cause.value}): {truncate(detail, TEXT_LIMIT)}"]
        case _:
            assert_never(decision)


def _result(result: kernel.ToolResult) -> str:
    mark = "✗" if result.is_error else "←"
    return f"{mark} {result.name} [{result.tool_call_id}]: {truncate(result.content, TEXT_LIMIT)}"
