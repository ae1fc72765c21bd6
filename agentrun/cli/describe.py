"""``kubectl agentrun describe``: a run as ``kubectl describe`` shows an object.

Its spec and the Agent it resolved, the budget it works under (with the defaults that apply),
its usage, the held call waiting for a person, its answer, its conditions and the Kubernetes
Events about it. Every line is ``display.printable``: model and tool text cannot steer the
terminal.

What belongs here: those lines and the command reading what they show. What does not: the
parser and the other commands (``kubectl``). ``kubectl`` imports this module only when
``describe`` runs: the kernel's and the trajectory's views are this command's alone.
"""

from __future__ import annotations

import argparse
import asyncio
import decimal
import json
from typing import Any

from agentrun import display, kernel, protocol
from agentrun.cli import control, kubeflags, trajectory


def describe_lines(obj: dict[str, Any], events: list[dict[str, Any]] | None) -> list[str]:
    """``kubectl describe``-like text of an AgentRun and its Kubernetes Events (None: the
    caller may not list them, said in their place); every line ``display.printable`` (model
    and tool text cannot steer the terminal)."""
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    lines = [
        f"Name:          {meta.get('name')}",
        f"Namespace:     {meta.get('namespace')}",
        f"Created:       {meta.get('creationTimestamp')}",
        f"Tenant:        {status.get('tenant', '-')}",
        f"Phase:         {status.get('phase', 'Pending')}",
    ]
    if status.get("terminalReason"):
        lines.append(f"Reason:        {status['terminalReason']} (outcome {status.get('outcome')})")
    if status.get("reruns"):
        lines.append(f"Reruns:        {status['reruns']} (started again from turn 0)")
    if status.get("queuePosition"):
        lines.append(f"Queue:         position {status['queuePosition']}")
    if status.get("message"):
        lines.append(f"Message:       {trajectory.truncate(status['message'], 300)}")
    lines = [
        *lines,
        *_definition_lines(obj.get("spec") or {}, status, meta),
        *_progress_lines(str(meta.get("name")), str(meta.get("namespace")), status),
        *_events_lines(events),
    ]
    return [display.printable(line, newlines=False) for line in lines]


def _definition_lines(
    spec: dict[str, Any], status: dict[str, Any], meta: dict[str, Any]
) -> list[str]:
    """The Agent (if any), model, tools, goal, approval list and budget the run executes
    (``meta``: the run's name and namespace, for the command showing its admitted caps)."""
    run_spec = status.get("resolvedSpec") or spec
    lines = []
    unadmitted = bool(status.get("terminalReason")) and not (
        status.get("startTime") or status.get("lastEventSequence")
    )  # it ended before its admission (a spec refused, its tenant's queue full, …)
    if spec.get("agentRef"):
        ref, agent = spec["agentRef"], status.get("agent") or {}
        unread = "never resolved" if unadmitted else "not resolved yet"
        lines.append(
            f"Agent:         {ref.get('name')} (generation {agent.get('generation', '?')}, "
            f"{agent.get('digest', unread)})"
        )
        for key, value in sorted((ref.get("parameters") or {}).items()):
            lines.append(f"  {key}: {trajectory.truncate(str(value), 100)}")
    lines += [
        f"Model:         {run_spec.get('model', '-')}",
        f"Tools:         {', '.join(run_spec.get('tools') or []) or '-'}",
        f"Goal:          {trajectory.truncate(str(run_spec.get('goal', '')), 300)}",
    ]
    if run_spec.get("approval", {}).get("tools"):
        lines.append(f"Approval:      {', '.join(run_spec['approval']['tools'])}")
    if spec.get("agentRef") and not status.get("resolvedSpec"):
        said = "none: it ended before its Agent was resolved" if unadmitted else "its Agent's"
        return [*lines, f"Budget:        {said} (with the run's own spec.budget on top)"]
    logs: str | None = f"kubectl agentrun logs {meta.get('name')} -n {meta.get('namespace')}"
    if status.get("phase") in (None, "Pending", "Queued"):
        logs = None  # not admitted yet: its caps show in status.budget once it is
    budget = run_spec.get("budget") or {}
    if unadmitted:  # no caps were ever applied: neither where they show nor when they will
        return [
            *lines,
            *budget_lines(budget, tenant=None),
            "               it ended before it was admitted: none of these applied",
        ]
    tenant, admitted = status.get("tenant"), status.get("budget")
    return lines + budget_lines(budget, tenant=tenant, logs=logs, admitted=admitted)


CAPS = ("maxSteps", "maxToolCalls", "maxTokens", "maxCostUSD", "timeout")
"""``spec.budget``'s caps (and ``status.budget``'s fields), in the order they are shown."""


def budget_lines(
    budget: dict[str, Any],
    *,
    tenant: str | None,
    logs: str | None = None,
    admitted: dict[str, Any] | None = None,
) -> list[str]:
    """The caps a run works under: each set in ``budget`` (``spec.budget``) as written, the
    unset ones with an implicit default as that default, then the other settings; and that
    the tenant's ``runBudget`` may set (when a default shows) or cap them; then the caps it
    was admitted with (``admitted``: ``status.budget``), each its tenant lowered marked
    (``overMax: Clamp`` lowers one without an error), or, for a run with a tenant whose
    status has none, admitted by an operator before ``status.budget``, where its admitted
    caps show (``logs``: the command), or, not admitted yet (``logs`` None), that they will
    show here."""
    implicit = kernel.Limits()
    defaults = {
        "maxSteps": implicit.max_steps,
        "maxToolCalls": implicit.max_tool_calls,
        "timeout": protocol.DEFAULT_RUN_TIMEOUT,
    }
    shown = [f"{k} {budget[k]}" for k in CAPS if k in budget]
    shown += [f"{k} {v} (default)" for k, v in defaults.items() if k not in budget]
    unset = [k for k in ("maxTokens", "maxCostUSD") if k not in budget]
    rest = sorted((k, v) for k, v in budget.items() if k not in CAPS and not isinstance(v, dict))
    shown += [f"{k} {v}" for k, v in rest]
    lines = ["Budget:        " + ", ".join(shown)]
    if unset:
        lines.append(f"               no {' or '.join(unset)} cap of the run's own")
    who = f"AgentTenant {tenant}" if tenant else "the run's AgentTenant"
    if any(k not in budget for k in defaults):
        lines.append(
            f"               defaults apply unless {who} sets runBudget.default; "
            "its runBudget.max caps every run"
        )
    elif tenant:
        lines.append(f"               {who}'s runBudget.max caps every run")
    if admitted:
        lines.append(admitted_line(budget, admitted))
    elif tenant and logs:
        lines.append(f"               the caps it was admitted with: {logs} (its first lines)")
    elif tenant:
        lines.append("               the caps it is admitted with show here once it is admitted")
    return lines


def admitted_line(budget: dict[str, Any], admitted: dict[str, Any]) -> str:
    """``Admitted with:`` and each cap of ``admitted`` (``status.budget``), one below what
    ``budget`` (``spec.budget``) asked marked as lowered by the tenant's ``runBudget.max``:
    ``maxSteps 3 (10 asked; the tenant's runBudget.max)``."""
    shown = []
    for name in (k for k in CAPS if k in admitted):
        value, asked = admitted[name], budget.get(name)
        lowered = asked is not None and _below(name, value, asked)
        shown.append(
            f"{name} {value} ({asked} asked; the tenant's runBudget.max)"
            if lowered
            else f"{name} {value}"
        )
    return "Admitted with: " + ", ".join(shown)


def _below(name: str, value: Any, asked: Any) -> bool:
    """Whether cap ``name``'s admitted ``value`` is below the ``asked`` one (a timeout by
    more than a second: one admitted before its deadline counted from its admission can be a
    few milliseconds short of its spec's); ``False`` for a value that does not read as a
    number or duration."""
    try:
        if name == "timeout":
            seconds = protocol.duration_seconds(str(value))
            return seconds < protocol.duration_seconds(str(asked)) - 1.0
        return decimal.Decimal(str(value)) < decimal.Decimal(str(asked))
    except (ValueError, ArithmeticError):
        return False


def _counted(usage: dict[str, Any], field: str, noun: str) -> str:
    """``usage[field]`` (0 when absent) and ``noun`` in words: ``1 step``, ``2 steps``."""
    return display.counted(int(usage.get(field) or 0), noun)


def _progress_lines(name: str, namespace: str, status: dict[str, Any]) -> list[str]:
    """Usage, the pending approval (its command naming the run's ``namespace``), the answer
    and the conditions."""
    usage = status.get("usage") or {}
    lines = []
    if usage:
        lines.append(
            f"Usage:         {_counted(usage, 'steps', 'step')}, "
            f"{_counted(usage, 'toolCalls', 'tool call')} ({usage.get('toolFailures', 0)} "
            f"failed), {usage.get('toolCallsNotRun', 0)} not run, "
            f"{_counted(usage, 'corrections', 'correction')}, "
            f"{_counted(usage, 'totalTokens', 'token')}, {usage.get('costUSD', '0')} USD, "
            f"{usage.get('wallSeconds', 0)}s"
        )
    pending = status.get("pendingApproval")
    if pending:
        lines.extend(_pending_lines(name, namespace, pending))
    if status.get("answer"):
        lines.append(f"Answer:        {trajectory.truncate(status['answer'], 500)}")
    lines.append("Conditions:")
    for condition in status.get("conditions") or []:
        lines.append(
            f"  {condition.get('type')}={condition.get('status')} {condition.get('reason')}: "
            f"{trajectory.truncate(str(condition.get('message', '')), 200)}"
        )
    return lines


def _pending_lines(name: str, namespace: str, pending: dict[str, Any]) -> list[str]:
    """The call to decide now and, for a batch, every held call with its decision: each is
    approved or denied in turn, one ``approve``/``deny`` per call. The call to decide is
    shown with its arguments in full and the digest that approves exactly it; the command
    names the run's ``namespace``, so that it works as shown from any current context."""
    held = pending.get("heldCalls") or [{**pending, "decision": "pending"}]
    lines = [
        f"Pending:       call {pending.get('call', 1)} of {pending.get('of', len(held))} held "
        f"for approval, decided in turn: kubectl agentrun approve|deny {name} -n {namespace} "
        f"--digest {pending.get('digest')}"
    ]
    for number, call in enumerate(held, start=1):
        now = call.get("toolCallID") == pending.get("toolCallID")
        lines.append(
            f"  {'→' if now else ' '} {number}. {call.get('tool')} call {call.get('toolCallID')}:"
            f" {call.get('decision', 'pending')}"
        )
        if now:
            shown = trajectory.held_lines(
                str(call.get("tool")), call.get("arguments"), digest=str(pending.get("digest"))
            )
            lines += [f"       {line}" for line in shown]
        else:
            lines[-1] += f" ({trajectory.arguments_text(call.get('arguments'))})"
    return lines


def _events_lines(events: list[dict[str, Any]] | None) -> list[str]:
    if events is None:
        return ["Events:        <not shown: you may not list Events in this namespace>"]
    lines = ["Events:" if events else "Events:        <none>"]
    for event in events:
        lines.append(
            f"  {event.get('type', ''):<8} {event.get('reason', ''):<18} "
            f"x{event.get('count') or 1:<3} {display.printable(str(event.get('message', '')))}"
        )
    return lines


def cmd_describe(args: argparse.Namespace) -> int:
    """``describe RUN``: the run and its Events (``-o json``: ``{"object", "events"}``, the
    events null when the caller may not list them)."""

    async def describe() -> tuple[dict[str, Any], list[dict[str, Any]] | None]:
        async with control.RunClient(args.namespace, kubeflags.KubeOptions.from_args(args)) as runs:
            obj = await runs.get(args.run)
            return obj, await runs.events_of(obj["metadata"]["uid"])

    obj, events = asyncio.run(describe())
    if args.output == "json":
        print(json.dumps({"object": obj, "events": events}, indent=2))
    else:
        print("\n".join(describe_lines(obj, events)))
    return 0
