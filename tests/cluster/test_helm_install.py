"""The chart installed for real on the node, driven with kubectl and helm as a user would:
``helm install`` runs the operator, the workers, the scripted model and the chart's own NATS
as pods under Pod Security ``restricted``; the example AgentRuns reach their terminal
reasons; the workers scale to three and all of them execute turns; every worker pod
force-deleted mid-run, the operator pod deleted mid-run, and a ``helm upgrade`` that rolls
both Deployments while runs are in flight each leave every run completed with each turn
committed once; ``helm uninstall`` removes what it installed but keeps the CRDs and the
AgentRuns. The tests run in file order on one release."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun_dev import demo, node, release
from agentrun_dev.kubectl import Kubectl

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "agentrun"
RELEASE = release.RELEASE_NAME
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
pytestmark = [pytest.mark.e2e, pytest.mark.node, pytest.mark.timeout(1800)]


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
def installed(
    cluster_node: node.Node, node_kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[release.Release]:
    """The chart installed (the scripted model and the chart's own NATS included) in a
    namespace under Pod Security ``restricted``, its images imported into the node."""
    release.import_project_images(cluster_node.directory, project=REPO, log=print)
    scenarios = yaml.safe_load((REPO / "examples" / "scenarios.yaml").read_text())
    scenarios["scenarios"].append(SLOW_SCENARIO)
    values = release.demo_values(default_tenant=demo.TENANT_NAME)
    values["mockModel"]["scenarios"] = scenarios
    values["turnAckWaitSeconds"] = 5
    values["worker"]["terminationGracePeriodSeconds"] = 5
    values["worker"]["drainMarginSeconds"] = 2
    installed = release.install_chart(
        node_kubectl,
        chart=CHART,
        values=values,
        home=tmp_path_factory.mktemp("release"),
        namespace=f"agentrun-helm-{uuid.uuid4().hex[:6]}",
        log=print,
    )
    node_kubectl("apply", "-f", "-", input=yaml.safe_dump(demo.default_tenant()))
    yield installed
    installed.helm("uninstall", installed.name, "-n", installed.namespace,
                   "--ignore-not-found", check=False, timeout=300)  # fmt: skip


@pytest.fixture(scope="module")
def ns(installed: release.Release) -> str:
    """The release's namespace."""
    return installed.namespace


def test_the_operator_and_the_workers_run_as_ready_pods(node_kubectl: Kubectl, ns: str) -> None:
    output = node_kubectl("get", "pods", "-n", ns, "-o", "json").stdout
    ready = {
        p["metadata"]["labels"].get("app.kubernetes.io/component"): all(
            c["ready"] for c in p["status"].get("containerStatuses", [])
        )
        for p in json.loads(output)["items"]
    }
    components = ("operator", "worker", "mock-model", "nats")
    assert {k: ready.get(k) for k in components} == dict.fromkeys(components, True)


def test_the_example_runs_reach_their_terminal_reasons(node_kubectl: Kubectl, ns: str) -> None:
    for name in EXAMPLES:
        node_kubectl("apply", "-n", ns, "-f", str(REPO / "examples" / f"{name}.yaml"))
    reasons = {name: wait_for(node_kubectl, ns, name, ended)["terminalReason"] for name in EXAMPLES}
    assert reasons == EXAMPLES


def test_three_workers_all_execute_turns(node_kubectl: Kubectl, ns: str) -> None:
    node_kubectl("scale", "deployment", f"{RELEASE}-worker", "-n", ns, "--replicas=3")
    node_kubectl("rollout", "status", f"deployment/{RELEASE}-worker", "-n", ns,
                 "--timeout=180s", timeout=190)  # fmt: skip
    workers = worker_pods(node_kubectl, ns)
    assert len(workers) == 3
    before = {pod: turns_committed(node_kubectl, ns, pod) for pod in workers}
    names = [f"spread-{i}" for i in range(12)]
    for name in names:
        run = agent_run(name, "Follow the Collatz sequence", maxSteps=4)
        node_kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(run))
    for name in names:
        assert wait_for(node_kubectl, ns, name, ended)["terminalReason"] == "max_steps"
    # a worker counts a turn after its commit and settlement, so the last counts may land
    # after the runs' ends are written: poll for them
    deadline = time.monotonic() + 30
    while True:
        executed = {pod: turns_committed(node_kubectl, ns, pod) - before[pod] for pod in workers}
        if sum(executed.values()) >= 12 * 4 or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert all(count > 0 for count in executed.values()), executed
    assert sum(executed.values()) >= 12 * 4


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


def test_force_deleted_workers_mid_run_lose_no_turn(node_kubectl: Kubectl, ns: str) -> None:
    # every worker pod, so the one holding the turn in flight is among them
    start_slow_runs(node_kubectl, ns, ["slow-worker"])
    victims = worker_pods(node_kubectl, ns)
    node_kubectl("delete", "pod", *victims, "-n", ns, "--grace-period=0", "--force")
    assert_completed_once_per_turn(node_kubectl, ns, ["slow-worker"])
    assert not set(victims) & set(worker_pods(node_kubectl, ns))


def test_the_operator_pod_deleted_mid_run_and_the_run_completes(
    node_kubectl: Kubectl, ns: str
) -> None:
    selector = "app.kubernetes.io/component=operator"
    before = node_kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "name").stdout.split()
    start_slow_runs(node_kubectl, ns, ["slow-operator"])
    node_kubectl("delete", "pods", "-n", ns, "-l", selector, "--wait=false")
    assert_completed_once_per_turn(node_kubectl, ns, ["slow-operator"])
    # the old pod is listed (Terminating) until its process has stopped, which may end after
    # the run did: poll for it to go, within its 30 s grace period and then some
    deadline = time.monotonic() + 90
    while True:
        after = node_kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "name").stdout.split()
        if (after and not set(before) & set(after)) or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert after and not set(before) & set(after)


def test_helm_upgrade_while_runs_are_in_flight_loses_none(
    installed: release.Release, node_kubectl: Kubectl, ns: str
) -> None:
    def revisions() -> dict[str, str]:
        deployments = json.loads(node_kubectl("get", "deploy", "-n", ns, "-o", "json").stdout)
        return {
            d["metadata"]["name"]: d["metadata"]["annotations"]["deployment.kubernetes.io/revision"]
            for d in deployments["items"]
        }

    names = [f"slow-upgrade-{i}" for i in range(4)]
    start_slow_runs(node_kubectl, ns, names)
    before = revisions()
    installed.helm(
        "upgrade", installed.name, str(installed.chart), "-n", ns, "--reuse-values",
        "--set", "worker.concurrency=16",
        "--set", "operator.podAnnotations.agentrun\\.dev/upgraded=yes",
        "--wait", "--timeout", "5m", timeout=330,
    )  # fmt: skip
    after = revisions()
    rolled = {f"{RELEASE}-worker", f"{RELEASE}-operator"}
    assert all(after[name] != before[name] for name in rolled), (before, after)
    assert_completed_once_per_turn(node_kubectl, ns, names)


def test_helm_uninstall_keeps_the_crds_and_the_agentruns(
    installed: release.Release, node_kubectl: Kubectl, ns: str
) -> None:
    installed.helm("uninstall", installed.name, "-n", ns, "--wait", timeout=300)
    assert node_kubectl("get", "crd", "agentruns.agentrun.dev").returncode == 0
    kept = node_kubectl("get", "agentruns", "-n", ns, "-o", "name").stdout.split()
    assert "agentrun.agentrun.dev/rectangle" in kept
    owned = f"app.kubernetes.io/instance={RELEASE}"
    kinds = "deploy,statefulset,service,configmap,serviceaccount"
    left = node_kubectl("get", kinds, "-n", ns, "-l", owned, "-o", "name")
    assert left.stdout == ""
    # the pods go with their ReplicaSets (garbage collection, after their grace period)
    deadline = time.monotonic() + 120
    while pods := node_kubectl("get", "pods", "-n", ns, "-l", owned, "-o", "name").stdout:
        assert time.monotonic() < deadline, f"pods left after helm uninstall:\n{pods}"
        time.sleep(1.0)
    cluster_kinds = "clusterrole,clusterrolebinding,agentmodel"
    assert node_kubectl("get", cluster_kinds, "-l", owned, "-o", "name").stdout == ""
