"""``agentrun check``: one AgentRun end to end on an install, the chart's ``helm test``.

What belongs here: creating one small run (``generateName: agentrun-check-``) on a named
AgentModel in one namespace, waiting for its terminal reason, printing what it did, deleting it,
and the exit status a test hook reads (0: it ended with the expected reason; 1: another reason,
no end within the timeout, or the API server refused). What does not: the run commands shared
with ``kubectl agentrun`` (``control``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any, TypeAlias

from agentrun import display
from agentrun.cli import control, kubeflags

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"  # no public name

CHECK_GOAL = "agentrun install check: reply with the single word ok, calling no tool."
"""The run's goal by default: any model completes it in one turn (the chart's scripted model
has a scenario for it)."""
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
"""Where a pod finds its own namespace (the default namespace of a check run in a pod)."""
POLL_SECONDS = 1.0


def register_check(subparsers: Subparsers) -> None:
    """``agentrun check --model MODEL [-n NS] [--goal G] [--expect R] [--timeout S] [--keep]``."""
    check = subparsers.add_parser(
        "check",
        help="run one AgentRun end to end and report its end (the chart's helm test)",
        description="Create one AgentRun on --model in the namespace, wait for its terminal "
        "reason, print phase, reason, steps and tokens, delete it (unless --keep). Exit 0 when "
        "it ended with --expect, 1 otherwise. The namespace must be bound to an AgentTenant (or "
        "the operator have a default tenant). Uses KUBECONFIG, else the pod's credentials.",
    )
    check.add_argument("--model", required=True, help="AgentModel the run uses")
    check.add_argument(
        "-n", "--namespace", default=None,
        help="namespace (default: the pod's own in a pod, else `default`)",
    )  # fmt: skip
    check.add_argument("--goal", default=CHECK_GOAL, help="the run's goal")
    check.add_argument(
        "--expect", default="completed", help="terminal reason that passes (default: completed)"
    )
    check.add_argument(
        "--timeout", type=float, default=300.0, help="seconds to wait for its end (default 300)"
    )
    check.add_argument("--keep", action="store_true", help="keep the run afterwards")
    check.set_defaults(handler=cmd_check)


def check_run(model: str, goal: str, timeout: float) -> dict[str, Any]:
    """The AgentRun ``agentrun check`` creates: one goal, no tools, small budgets that end it
    within ``timeout`` seconds (``spec.budget.timeout``) if the model never answers."""
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"generateName": "agentrun-check-", "labels": {"agentrun.dev/check": "true"}},
        "spec": {
            "model": model,
            "goal": goal,
            "budget": {"maxSteps": 3, "maxTokens": 4000, "timeout": f"{max(1, int(timeout))}s"},
        },
    }


def default_namespace() -> str:
    """The pod's own namespace when run in a pod, else ``default``."""
    with contextlib.suppress(OSError):
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    return os.environ.get("POD_NAMESPACE") or "default"


def cmd_check(args: argparse.Namespace) -> int:
    """Run the check; 0 when the run ended with ``args.expect``, else 1 (what it saw printed)."""
    namespace = args.namespace or default_namespace()

    async def check() -> int:
        async with control.RunClient(namespace, kubeflags.KubeOptions.from_args(args)) as runs:
            created = await runs.create(check_run(args.model, args.goal, args.timeout))
            name = created["metadata"]["name"]
            print(f"agentrun.agentrun.dev/{name} created in {namespace} (model {args.model})")
            try:
                status = await _until_ended(runs, name, timeout=args.timeout + 30)
            finally:
                if not args.keep:
                    with contextlib.suppress(control.RunAccessError):
                        await runs.delete(name)
        return _report(name, status, expect=args.expect)

    return asyncio.run(check())


async def _until_ended(
    runs: control.RunClient, name: str, *, timeout: float
) -> dict[str, Any] | None:
    """The run's status once it has a terminal reason; None after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = await runs.status(name)
        if status.get("terminalReason"):
            return status
        await asyncio.sleep(POLL_SECONDS)
    return None


def _report(name: str, status: dict[str, Any] | None, *, expect: str) -> int:
    """Print the run's end; 0 when its terminal reason is ``expect``."""
    if status is None:
        print(f"{name}: no terminal reason in time (is the operator running, the namespace bound "
              "to a tenant, the model reachable?)")  # fmt: skip
        return 1
    usage = status.get("usage") or {}
    print(f"{name}: {status.get('phase')} / {status.get('terminalReason')}, "
          f"{display.counted(int(usage.get('steps', 0)), 'step')}, "
          f"{display.counted(int(usage.get('totalTokens', 0)), 'token')}")  # fmt: skip
    if status.get("message"):  # a provider's or a tool's words: no terminal control passes
        print(display.printable(f"message: {status['message']}", newlines=False))
    if status.get("terminalReason") == expect:
        return 0
    print(f"expected terminal reason {expect!r}")
    return 1
