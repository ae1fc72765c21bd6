"""The chart installed for real on the node: ``helm install`` runs the operator, the workers
and the scripted model as pods (against an existing NATS, itself a pod of the project's NATS
image); the example AgentRuns reach their terminal reasons; the
workers scale to three and all of them execute turns; a worker force-deleted mid-run loses no
turn; ``helm uninstall`` keeps the CRDs and the AgentRuns."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun_dev import demo, helm, image, node
from agentrun_dev.kubectl import Kubectl

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "agentrun"
RELEASE = "agentrun"
EXAMPLES = {"rectangle": "completed", "collatz": "max_steps", "inventory": "tool_budget_exhausted"}
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
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]


def agent_run(name: str, goal: str, **budget: Any) -> dict[str, Any]:
    return {
        "apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": name},
        "spec": {"model": "mock", "goal": goal, "tools": ["calculate"],
                 "budget": {"maxSteps": 20, "timeout": "5m", **budget}},
    }  # fmt: skip


def run_status(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    found = json.loads(kubectl("get", "agentrun", name, "-n", namespace, "-o", "json").stdout)
    status: dict[str, Any] = found.get("status") or {}
    return status


def wait_for(
    kubectl: Kubectl, namespace: str, name: str, done: Callable[[dict[str, Any]], bool],
    *, timeout: float = 240.0,
) -> dict[str, Any]:  # fmt: skip
    deadline = time.monotonic() + timeout
    while True:
        status = run_status(kubectl, namespace, name)
        if done(status):
            return status
        assert time.monotonic() < deadline, f"{name}: {status}"
        time.sleep(1.0)


def ended(status: dict[str, Any]) -> bool:
    return bool(status.get("terminalReason"))


def worker_pods(kubectl: Kubectl, namespace: str) -> list[str]:
    selector = "app.kubernetes.io/component=worker"
    output = kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
    return [
        p["metadata"]["name"]
        for p in json.loads(output)["items"]
        if p["metadata"].get("deletionTimestamp") is None
    ]


def turns_committed(kubectl: Kubectl, namespace: str, pod: str) -> float:
    """The worker's ``agentrun_turns_total`` (all tenants), read from its own /metrics."""
    script = (
        "import urllib.request;"
        "print(urllib.request.urlopen('http://127.0.0.1:9090/metrics').read().decode())"
    )
    text = kubectl("exec", "-n", namespace, pod, "--", "python3.11", "-c", script).stdout
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("agentrun_turns_total{")
    )


@pytest.fixture(scope="module")
def release(
    cluster_node: node.Node, node_kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The chart installed (the scripted model and the chart's own NATS included) in a
    namespace under Pod Security ``restricted``, its images imported into the node; returns
    the namespace."""
    images = image.build_project_images(REPO, log=print)
    for built in (images.agentrun, images.nats):
        cluster_node.import_image(built.archive, log=print)
    namespace = f"agentrun-helm-{uuid.uuid4().hex[:6]}"
    node_kubectl("create", "namespace", namespace)
    node_kubectl("label", "namespace", namespace,
                 "pod-security.kubernetes.io/enforce=restricted",
                 "pod-security.kubernetes.io/enforce-version=latest")  # fmt: skip
    home = tmp_path_factory.mktemp("helm")
    scenarios = yaml.safe_load((REPO / "examples" / "scenarios.yaml").read_text())
    scenarios["scenarios"].append(SLOW_SCENARIO)
    values = home / "values.yaml"
    values.write_text(yaml.safe_dump({
        # the chart's JetStream StatefulSet; emptyDir storage (the node has no StorageClass)
        "nats": {"install": {"enabled": True, "persistence": {"enabled": False}}},
        "mockModel": {"enabled": True, "scenarios": scenarios},
        "operator": {"defaultTenant": demo.TENANT_NAME},
        "turnAckWaitSeconds": 5,
        "worker": {"terminationGracePeriodSeconds": 5},
    }))  # fmt: skip
    runner = helm.Helm(
        helm.ensure_helm(log=print), home=home, kubeconfig=node_kubectl.env["KUBECONFIG"]
    )
    started = time.monotonic()
    runner("install", RELEASE, str(CHART), "-n", namespace, "-f", str(values),
           "--wait", "--timeout", "5m", timeout=330)  # fmt: skip
    print(f"helm install --wait: {time.monotonic() - started:.1f} s")
    node_kubectl("apply", "-f", "-", input=yaml.safe_dump(demo.default_tenant()))
    yield namespace
    runner("uninstall", RELEASE, "-n", namespace, "--ignore-not-found", check=False)


def test_the_operator_and_the_workers_run_as_ready_pods(
    node_kubectl: Kubectl, release: str
) -> None:
    output = node_kubectl("get", "pods", "-n", release, "-o", "json").stdout
    ready = {
        p["metadata"]["labels"].get("app.kubernetes.io/component"): all(
            c["ready"] for c in p["status"].get("containerStatuses", [])
        )
        for p in json.loads(output)["items"]
    }
    components = ("operator", "worker", "mock-model", "nats")
    assert {k: ready.get(k) for k in components} == dict.fromkeys(components, True)


def test_the_example_runs_reach_their_terminal_reasons(node_kubectl: Kubectl, release: str) -> None:
    for name in EXAMPLES:
        node_kubectl("apply", "-n", release, "-f", str(REPO / "examples" / f"{name}.yaml"))
    reasons = {
        name: wait_for(node_kubectl, release, name, ended)["terminalReason"] for name in EXAMPLES
    }
    assert reasons == EXAMPLES


def test_three_workers_all_execute_turns(node_kubectl: Kubectl, release: str) -> None:
    node_kubectl("scale", "deployment", f"{RELEASE}-worker", "-n", release, "--replicas=3")
    node_kubectl("rollout", "status", f"deployment/{RELEASE}-worker", "-n", release,
                 "--timeout=180s", timeout=190)  # fmt: skip
    workers = worker_pods(node_kubectl, release)
    assert len(workers) == 3
    before = {pod: turns_committed(node_kubectl, release, pod) for pod in workers}
    names = [f"spread-{i}" for i in range(12)]
    for name in names:
        run = agent_run(name, "Follow the Collatz sequence", maxSteps=4)
        node_kubectl("apply", "-n", release, "-f", "-", input=yaml.safe_dump(run))
    for name in names:
        assert wait_for(node_kubectl, release, name, ended)["terminalReason"] == "max_steps"
    executed = {pod: turns_committed(node_kubectl, release, pod) - before[pod] for pod in workers}
    assert all(count > 0 for count in executed.values()), executed
    assert sum(executed.values()) >= 12 * 4


def test_a_worker_force_deleted_mid_run_loses_no_turn(node_kubectl: Kubectl, release: str) -> None:
    node_kubectl("apply", "-n", release, "-f", "-",
                 input=yaml.safe_dump(agent_run("slow", "slow-steps")))  # fmt: skip
    wait_for(node_kubectl, release, "slow",
             lambda s: (s.get("usage") or {}).get("steps", 0) >= 1, timeout=120)  # fmt: skip
    victim = worker_pods(node_kubectl, release)[0]
    node_kubectl("delete", "pod", victim, "-n", release, "--grace-period=0", "--force")
    status = wait_for(node_kubectl, release, "slow", ended, timeout=300)
    assert (status["terminalReason"], status["usage"]["steps"]) == ("completed", SLOW_STEPS + 1)
    assert status["answer"] == "done"


def test_helm_uninstall_keeps_the_crds_and_the_agentruns(
    node_kubectl: Kubectl, release: str, tmp_path: Path
) -> None:
    runner = helm.Helm(helm.ensure_helm(log=print), home=tmp_path / "helm",
                       kubeconfig=node_kubectl.env["KUBECONFIG"])  # fmt: skip
    runner("uninstall", RELEASE, "-n", release, "--wait", timeout=300)
    assert node_kubectl("get", "crd", "agentruns.agentrun.dev").returncode == 0
    kept = node_kubectl("get", "agentruns", "-n", release, "-o", "name").stdout.split()
    assert "agentrun.agentrun.dev/rectangle" in kept
    owned = f"app.kubernetes.io/instance={RELEASE}"
    kinds = "deploy,statefulset,service,configmap,serviceaccount"
    left = node_kubectl("get", kinds, "-n", release, "-l", owned, "-o", "name")
    assert left.stdout == ""
