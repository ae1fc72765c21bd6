"""Runs on the node's installed chart, as the cluster tests drive them with kubectl: an AgentRun
manifest on the scripted ``mock`` model, its status polled until a condition holds, and slow
runs (``SLOW_STEPS`` tool turns of 1.5 s each, then ``done``) that stay in flight long enough to
break something under them and then end ``completed`` with each turn committed once."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from agentrun_dev import demo, node, release
from agentrun_dev.kubectl import Kubectl

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "agentrun"

SLOW_STEPS = 6
SLOW_SCENARIO = {
    "name": "slow",
    "match": {"goal": "slow-steps"},
    "turns": [
        *(
            {
                "content": "step {turn}",
                "tool_calls": [{"name": "calculate", "arguments": {"expression": "{turn}+1"}}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 10},
                "latency_ms": 1500,
            }
            for _ in range(SLOW_STEPS)
        ),
        {"content": "done", "usage": {"prompt_tokens": 100, "completion_tokens": 5}},
    ],
}


def agent_run(name: str, goal: str, **budget: Any) -> dict[str, Any]:
    """An AgentRun ``name`` on the ``mock`` model with the ``calculate`` tool; ``budget``
    overrides its budget (20 steps, 5 minutes)."""
    return {
        "apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": name},
        "spec": {"model": "mock", "goal": goal, "tools": ["calculate"],
                 "budget": {"maxSteps": 20, "timeout": "5m", **budget}},
    }  # fmt: skip


def run_status(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    """The run's ``.status`` (empty before the operator writes one)."""
    found = json.loads(kubectl("get", "agentrun", name, "-n", namespace, "-o", "json").stdout)
    status: dict[str, Any] = found.get("status") or {}
    return status


def wait_for(
    kubectl: Kubectl, namespace: str, name: str, done: Callable[[dict[str, Any]], bool],
    *, timeout: float = 240.0,
) -> dict[str, Any]:  # fmt: skip
    """The run's status once ``done(status)``; after ``timeout`` seconds, prints the run
    (``print_run``), the pods and their logs (``print_pods``) and fails the test."""
    deadline = time.monotonic() + timeout
    while True:
        status = run_status(kubectl, namespace, name)
        if done(status):
            return status
        if time.monotonic() >= deadline:
            print_run(kubectl, namespace, name)
            print_pods(kubectl, namespace)
            raise AssertionError(f"{name}: {status}")
        time.sleep(1.0)


def print_run(kubectl: Kubectl, namespace: str, name: str) -> None:
    """Print run ``name`` whole (its annotations carry kopf's progress: a handler's retries and
    last error) and the namespace's Events, for a failed test's report."""
    print(kubectl("get", "agentrun", name, "-n", namespace, "-o", "yaml", check=False).stdout)
    print(kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False).stdout)


FIRST_IN_REPORT = ("operator", "worker")
"""Components whose logs a failed test's report prints first (a report may be cut short)."""


def print_pods(kubectl: Kubectl, namespace: str, *, tail: int = 60) -> None:
    """Print the namespace's pods and the last ``tail`` log lines of each container (previous
    run too, after a restart), the operator's and the workers' first, for a failed test's
    report."""
    print(kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout)
    listed = kubectl("get", "pods", "-n", namespace, "-o", "json", check=False).stdout or "{}"
    pods = json.loads(listed).get("items", [])

    def rank(pod: dict[str, Any]) -> int:
        component = pod["metadata"].get("labels", {}).get("app.kubernetes.io/component", "")
        return FIRST_IN_REPORT.index(component) if component in FIRST_IN_REPORT else 99

    for pod in sorted(pods, key=rank):
        name = pod["metadata"]["name"]
        for container in pod["spec"]["containers"]:
            for previous in ("--previous=false", "--previous=true"):
                logs = kubectl("logs", "-n", namespace, name, "-c", container["name"],
                               previous, f"--tail={tail}", check=False)  # fmt: skip
                if logs.stdout.strip():
                    print(f"--- {name}/{container['name']} {previous}\n{logs.stdout}")


def ended(status: dict[str, Any]) -> bool:
    """Whether the run has a terminal reason."""
    return bool(status.get("terminalReason"))


def start_slow_runs(kubectl: Kubectl, ns: str, names: list[str]) -> None:
    """Apply `names` as slow runs and wait until each has committed its first turn."""
    for name in names:
        kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(agent_run(name, "slow-steps")))
    for name in names:
        wait_for(kubectl, ns, name, lambda s: (s.get("usage") or {}).get("steps", 0) >= 1)


def assert_completed_once_per_turn(kubectl: Kubectl, ns: str, names: list[str]) -> None:
    """Each run ends ``completed`` with exactly one committed step per scripted turn."""
    ends = {name: wait_for(kubectl, ns, name, ended, timeout=300) for name in names}
    summary = {
        n: (s["terminalReason"], s["usage"]["steps"], s.get("answer")) for n, s in ends.items()
    }
    assert summary == dict.fromkeys(names, ("completed", SLOW_STEPS + 1, "done"))


@contextlib.contextmanager
def demo_release(
    cluster_node: node.Node, kubectl: Kubectl, home: Path, prefix: str, values: dict[str, Any]
) -> Iterator[release.Release]:
    """The chart installed (its images imported into the node) in a new namespace
    ``<prefix>-<6 hex>`` under Pod Security ``restricted``, with ``release.demo_values``, the
    example scenarios plus ``SLOW_SCENARIO`` on the scripted model, 5 s ack wait, and ``values``
    merged over them (one level deep per top-key); the default tenant applied. Uninstalled
    after."""
    release.import_project_images(cluster_node.directory, project=REPO, log=print)
    scenarios = yaml.safe_load((REPO / "examples" / "scenarios.yaml").read_text())
    scenarios["scenarios"].append(SLOW_SCENARIO)
    merged = release.demo_values(default_tenant=demo.TENANT_NAME)
    merged["mockModel"]["scenarios"] = scenarios
    merged["turnAckWaitSeconds"] = 5
    for key, value in values.items():
        merged[key] = {**merged.get(key, {}), **value} if isinstance(value, dict) else value
    installed = release.install_chart(
        kubectl, chart=CHART, values=merged, home=home,
        namespace=f"{prefix}-{uuid.uuid4().hex[:6]}", log=print,
    )  # fmt: skip
    kubectl("apply", "-f", "-", input=yaml.safe_dump(demo.default_tenant()))
    try:
        yield installed
    finally:
        installed.helm("uninstall", installed.name, "-n", installed.namespace,
                       "--ignore-not-found", check=False, timeout=300)  # fmt: skip
