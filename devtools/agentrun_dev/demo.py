"""The demo: the local stack, a ``mock`` AgentModel, the example runs, and their terminal reasons.

What belongs here: what ``agentrun dev demo`` (the README's first command) does on top of
``stack.up``. It drives the cluster with kubectl, as a user would.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from agentrun import display
from agentrun_dev import console, kubectl, state

MODEL_NAME = "mock"
TENANT_NAME = "default"
"""The dev stack's default AgentTenant (``AGENTRUN_DEFAULT_TENANT``): runs in namespaces no
other AgentTenant binds are charged to it."""
DEFAULT_EXAMPLES = (
    Path("examples") / "rectangle.yaml",
    Path("examples") / "collatz.yaml",
    Path("examples") / "inventory.yaml",
)


def mock_model(
    base_url: str,
    *,
    name: str = MODEL_NAME,
    max_output_tokens: int = 4096,
    context_window: int = 128000,
) -> dict[str, Any]:
    """The cluster-scoped AgentModel ``name`` (default ``mock``): the scripted server at
    ``base_url``, with real-looking prices (USD per million tokens: 2.50 input, 1.25 cached
    input, 10 output), allowing ``max_output_tokens`` a call within ``context_window``."""
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentModel",
        "metadata": {"name": name},
        "spec": {
            "baseURL": base_url,
            "model": "scripted",
            "pricing": {
                "inputPerMillionUSD": "2.50",
                "cachedInputPerMillionUSD": "1.25",
                "outputPerMillionUSD": "10.00",
            },
            "contextWindow": context_window,
            "maxOutputTokens": max_output_tokens,
        },
    }


def default_tenant() -> dict[str, Any]:
    """The cluster-scoped AgentTenant ``default``: binds namespace ``default`` and, as the
    operator's default tenant, every namespace no other tenant binds; a generous daily budget;
    MCP tool servers on this machine's loopback (where the dev stack's run)."""
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentTenant",
        "metadata": {"name": TENANT_NAME},
        "spec": {
            "namespaces": ["default"],
            "window": "24h",
            "budget": {"tokens": 100_000_000, "costUSD": "1000.00"},
            # the local stack's MCP servers listen on loopback
            "toolServers": {
                "allow": [
                    {"host": "127.0.0.1", "privateNetwork": True},
                    {"host": "localhost", "privateNetwork": True},
                ]
            },
        },
    }


def kubectl_for(current: state.StackState) -> kubectl.Kubectl:
    """A kubectl bound to the stack's cluster."""
    if current.kubectl is None or current.kubeconfig is None:
        raise RuntimeError("the stack has no cluster yet: run `agentrun dev up` first")
    return kubectl.Kubectl(current.kubectl, kubeconfig=current.kubeconfig)


def apply_mock_model(current: state.StackState) -> None:
    """Create or update the ``mock`` AgentModel for the stack's mock model URL, and the
    ``default`` AgentTenant. A stack running the chart (``release_namespace``) has its mock
    model as a pod, whose AgentModel the chart created: only the tenant is applied.

    Raises RuntimeError if the stack has neither a mock model nor a release.
    """
    items = [default_tenant()]
    if current.release_namespace is None:
        if current.model_url is None:
            raise RuntimeError("the stack has no mock model: run `agentrun dev up` first")
        items.insert(0, mock_model(current.model_url))
    objects = {"kind": "List", "apiVersion": "v1", "items": items}
    kubectl_for(current)("apply", "-f", "-", input=yaml.safe_dump(objects))


def run_examples(
    current: state.StackState,
    *,
    examples: Sequence[Path] = DEFAULT_EXAMPLES,
    namespace: str = "default",
    timeout: float = 180.0,
    log: console.Log = console.log_to_stderr,
) -> list[dict[str, Any]]:
    """Apply the examples afresh (deleting earlier copies), wait for every terminal reason.

    Returns the AgentRun objects. Raises ``TimeoutError`` naming the runs still going.
    """
    kc = kubectl_for(current)
    names = [yaml.safe_load(path.read_text())["metadata"]["name"] for path in examples]
    kc(
        "delete",
        "agentruns",
        "-n",
        namespace,
        "--ignore-not-found",
        "--wait=true",
        *names,
        timeout=120,
    )
    for path in examples:
        log(f"kubectl apply -f {path}")
        kc("apply", "-n", namespace, "-f", str(path))
    deadline = time.monotonic() + timeout
    while True:
        out = kc("get", "agentruns", "-n", namespace, "-o", "json", *names).stdout
        items: list[dict[str, Any]] = json.loads(out).get("items", [])
        pending = [
            i["metadata"]["name"]
            for i in items
            if not (i.get("status") or {}).get("terminalReason")
        ]
        if not pending and len(items) == len(names):
            return items
        if time.monotonic() > deadline:
            raise TimeoutError(f"runs still going after {timeout:.0f}s: {', '.join(pending)}")
        time.sleep(0.5)


def tenant_use(current: state.StackState) -> tuple[str | None, int]:
    """The ``default`` AgentTenant's window (``status.windowStart``, None before the operator
    wrote one) and the tokens it shows used in it: what runs before the demo's spent."""
    status = _tenant_status(kubectl_for(current))
    return status.get("windowStart"), _tokens_used(status)


def _tenant_status(kc: kubectl.Kubectl) -> dict[str, Any]:
    out = kc("get", "agenttenant", TENANT_NAME, "-o", "json").stdout
    status: dict[str, Any] = json.loads(out).get("status") or {}
    return status


def _tokens_used(status: dict[str, Any]) -> int:
    return int(((status.get("budget") or {}).get("tokens") or {}).get("used", 0))


def wait_tenant_settled(
    current: state.StackState,
    *,
    items: Sequence[dict[str, Any]],
    before: tuple[str | None, int] = (None, 0),
    timeout: float = 15.0,
) -> None:
    """Wait until the ``default`` AgentTenant's status shows no active run and charges at least
    the tokens the runs in `items` used on top of what it showed ``before`` they were applied
    (``tenant_use``; counted only while the window is the same: a second demo on a stack still
    up adds to the first's), so what the demo prints is the settled use, not a status written
    before the runs were admitted, nor the use of an earlier demo.

    Returns after `timeout` seconds regardless (the demo then prints what there is).
    """
    spent = sum(
        int(((item.get("status") or {}).get("usage") or {}).get("totalTokens", 0)) for item in items
    )
    kc = kubectl_for(current)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = _tenant_status(kc)
        earlier = before[1] if status.get("windowStart") == before[0] else 0
        if status.get("activeRuns") == 0 and _tokens_used(status) >= earlier + spent:
            return
        time.sleep(0.5)


def usage_summary(items: Sequence[dict[str, Any]]) -> list[str]:
    """One line per run: phase, reason, outcome, steps, tool calls, tokens, cost, time, answer
    (the answer and the message are model text: terminal controls shown as escapes)."""
    lines = []
    for item in items:
        status = item.get("status") or {}
        usage = status.get("usage") or {}
        answer = display.printable(str(status.get("answer") or ""), newlines=False)
        message = display.printable(str(status.get("message") or ""), newlines=False)
        lines.append(
            f"{item['metadata']['name']}: {status.get('phase')} / {status.get('terminalReason')} "
            f"({status.get('outcome')}) — {usage.get('steps', 0)} steps, "
            f"{usage.get('toolCalls', 0)} tool calls, {usage.get('totalTokens', 0)} tokens "
            f"({usage.get('cachedInputTokens', 0)} cached), ${usage.get('costUSD', '0')}, "
            f"{usage.get('wallSeconds', 0)}s"
            + (f' — answer: "{answer}"' if answer else f" — {message}")
        )
    return lines
