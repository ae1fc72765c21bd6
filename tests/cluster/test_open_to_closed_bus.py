"""``helm upgrade`` from the open bus to the closed bus on the node, as docs/closed-bus.md
("Upgrading a running install from the open bus") tells a user to do it: the chart installed
with ``nats.auth.enabled=false`` / ``nats.tls.enabled=false`` (its JetStream store on a
PersistentVolume, so it outlives the NATS pod), runs in flight and one finished run, then one
``helm upgrade`` with the chart's defaults. The NATS pod is replaced and its init container
adopts the open server's store; every run in flight ends ``completed`` with each turn committed
once, the finished run keeps its status, the tenant's usage is the sum of its runs (and of the
calls abandoned as the bus changed), and a run created after the upgrade completes. The tests
share one release and one upgrade."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun_dev import demo, node, release
from agentrun_dev.kubectl import Kubectl
from cluster.runs_support import agent_run, ended, run_status, wait_for

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "agentrun"
RELEASE = release.RELEASE_NAME
NATS_POD = f"{RELEASE}-nats-0"
IN_FLIGHT = [f"in-flight-{i}" for i in range(3)]
FINISHED = "finished"
STEPS = 8
CALL_TOKENS = 110
"""What one of the scenario's tool-calling turns reports (100 prompt, 10 completion)."""
PROMPT_CAP = 2_000
"""More than the prompt bound a worker reserves for any call of the scenario (its goal, the
``calculate`` tool's schema and at most 8 short turns; its calls' bounds read 1,175 at their
early turns), and than what an answered call reports (``CALL_TOKENS``)."""
GOAL = "slower-steps"
SCENARIO = {
    "name": "slower",
    "match": {"goal": GOAL},
    "turns": [
        *(
            {
                "content": "step {turn}",
                "tool_calls": [{"name": "calculate", "arguments": {"expression": "{turn}+1"}}],
                "usage": {"prompt_tokens": 100, "completion_tokens": CALL_TOKENS - 100},
                "latency_ms": 4000,
            }
            for _ in range(STEPS)
        ),
        {"content": "done", "usage": {"prompt_tokens": 100, "completion_tokens": 5}},
    ],
}
"""Runs of ~35 s: they outlast the pre-upgrade hook and the NATS pod's replacement."""
pytestmark = [pytest.mark.e2e, pytest.mark.node, pytest.mark.timeout(900)]


def chart_values(scenarios: dict[str, Any]) -> dict[str, Any]:
    """The upgrade's values: the demo install, the store on a PersistentVolume (an emptyDir
    would not outlive the NATS pod), the slow scenario, quick redelivery; the bus closed."""
    values = release.demo_values(default_tenant=demo.TENANT_NAME)
    values["nats"]["install"]["persistence"] = {"enabled": True, "size": "1Gi"}
    values["mockModel"]["scenarios"] = scenarios
    values["turnAckWaitSeconds"] = 5
    values["worker"]["terminationGracePeriodSeconds"] = 5
    values["worker"]["drainMarginSeconds"] = 2
    return values


def store_volume(name: str, namespace: str, path: Path) -> dict[str, Any]:
    """A PersistentVolume on the node's disk (the node has no StorageClass), bound ahead to
    the NATS StatefulSet's claim ``data-<release>-nats-0``."""
    return {
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
            "hostPath": {"path": str(path), "type": "Directory"},
            "claimRef": {"namespace": namespace, "name": f"data-{NATS_POD}"},
        },
    }  # fmt: skip


def tenant(namespace: str) -> dict[str, Any]:
    """An AgentTenant binding the release's namespace alone, so its usage is these runs'."""
    return {
        "apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentTenant",
        "metadata": {"name": namespace},
        "spec": {"namespaces": [namespace], "window": "24h",
                 "budget": {"tokens": 10_000_000, "costUSD": "100.00"}},
    }  # fmt: skip


def nats_pod(kubectl: Kubectl, namespace: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(
        kubectl("get", "pod", NATS_POD, "-n", namespace, "-o", "json").stdout
    )
    return found


@dataclasses.dataclass
class Upgraded:
    """What the module's one upgrade saw."""

    namespace: str
    nats_uid_before: str
    finished_before: dict[str, Any]
    """The finished run's status before the upgrade."""
    in_flight_before: dict[str, dict[str, Any]]
    """Each in-flight run's status when ``helm upgrade`` started."""


@pytest.fixture(scope="module")
def upgraded(
    cluster_node: node.Node, node_kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Upgraded]:
    """The chart installed with the open bus, a finished run and runs in flight, then
    ``helm upgrade`` with the chart's defaults (the closed bus)."""
    release.import_project_images(cluster_node.directory, project=REPO, log=print)
    scenarios = yaml.safe_load((REPO / "examples" / "scenarios.yaml").read_text())
    scenarios["scenarios"].append(SCENARIO)
    closed = chart_values(scenarios)
    open_bus = json.loads(json.dumps(closed))
    open_bus["nats"]["auth"] = {"enabled": False}
    open_bus["nats"]["tls"] = {"enabled": False}
    namespace = f"agentrun-otc-{uuid.uuid4().hex[:6]}"
    store = tmp_path_factory.mktemp("nats-store")
    store.chmod(0o777)  # the NATS pod runs as 65532; hostPath volumes are not chowned
    volume = store_volume(namespace, namespace, store)
    node_kubectl("apply", "-f", "-", input=yaml.safe_dump(volume))
    home = tmp_path_factory.mktemp("release")
    installed = release.install_chart(
        node_kubectl, chart=CHART, values=open_bus, home=home, namespace=namespace, log=print
    )
    try:
        node_kubectl("apply", "-f", "-", input=yaml.safe_dump(tenant(namespace)))
        # the operator binds the namespace to it before a run is admitted there
        wait_tenant(node_kubectl, namespace, lambda s: "activeRuns" in s)
        yield run_and_upgrade(installed, node_kubectl, closed, home / "closed.yaml")
    finally:
        installed.helm("uninstall", installed.name, "-n", namespace,
                       "--ignore-not-found", "--wait", check=False, timeout=300)  # fmt: skip
        node_kubectl("delete", "pvc", f"data-{NATS_POD}", "-n", namespace,
                     "--ignore-not-found", check=False)  # fmt: skip
        node_kubectl("delete", "pv", namespace, "--ignore-not-found", check=False)
        node_kubectl("delete", "agenttenant", namespace, "--ignore-not-found", check=False)


def run_and_upgrade(
    installed: release.Release, kubectl: Kubectl, closed: dict[str, Any], values_file: Path
) -> Upgraded:
    """Finish one run and start `IN_FLIGHT` on the open bus, then upgrade to `closed`."""
    ns = installed.namespace
    kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(agent_run(FINISHED, GOAL)))
    finished = wait_for(kubectl, ns, FINISHED, ended)
    for name in IN_FLIGHT:
        kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(agent_run(name, GOAL)))
    for name in IN_FLIGHT:
        wait_for(kubectl, ns, name, lambda s: (s.get("usage") or {}).get("steps", 0) >= 1)
    uid = nats_pod(kubectl, ns)["metadata"]["uid"]
    values_file.write_text(yaml.safe_dump(closed, sort_keys=False))
    in_flight = {name: run_status(kubectl, ns, name) for name in IN_FLIGHT}
    installed.helm(
        "upgrade", installed.name, str(installed.chart), "-n", ns, "-f", str(values_file),
        "--wait", "--timeout", "5m", timeout=330,
    )  # fmt: skip
    return Upgraded(ns, uid, finished, in_flight)


def moment(stamp: str) -> datetime:
    """An RFC 3339 timestamp of the API (``2026-12-02T01:02:03Z``, maybe with fractions)."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def trajectory(kubectl: Kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    """The run's events, read through the trajectory API (served on the closed bus only; its
    APIService may answer 503 for a few seconds after its pod became Ready)."""
    path = (
        f"/apis/trajectory.agentrun.dev/v1alpha1/namespaces/{namespace}/agentruntrajectories/{name}"
    )
    deadline = time.monotonic() + 60
    while (read := kubectl("get", "--raw", path, check=False)).returncode != 0:
        assert time.monotonic() < deadline, read.stderr
        time.sleep(2.0)
    events: list[dict[str, Any]] = json.loads(read.stdout)["events"]
    return events


def test_the_runs_were_in_flight_and_the_finished_run_had_ended(upgraded: Upgraded) -> None:
    assert upgraded.finished_before["terminalReason"] == "completed"
    assert [ended(s) for s in upgraded.in_flight_before.values()] == [False] * len(IN_FLIGHT)


def test_the_nats_pod_was_replaced_and_adopted_the_open_store(
    upgraded: Upgraded, node_kubectl: Kubectl
) -> None:
    ns = upgraded.namespace
    pod = nats_pod(node_kubectl, ns)
    assert pod["metadata"]["uid"] != upgraded.nats_uid_before
    [init] = pod["spec"]["initContainers"]
    assert init["name"] == "adopt-store"
    log = node_kubectl("logs", NATS_POD, "-n", ns, "-c", "adopt-store").stdout
    assert "moved /data/jetstream/$G to A" in log, log


def test_every_run_in_flight_completes_with_each_turn_committed_once(
    upgraded: Upgraded, node_kubectl: Kubectl
) -> None:
    ns = upgraded.namespace
    ends = {name: wait_for(node_kubectl, ns, name, ended, timeout=300) for name in IN_FLIGHT}
    summary = {
        n: (s["terminalReason"], s["usage"]["steps"], s.get("answer")) for n, s in ends.items()
    }
    assert summary == dict.fromkeys(IN_FLIGHT, ("completed", STEPS + 1, "done"))
    # each ended after the new NATS pod started: it was in flight while the old one stopped
    started = moment(nats_pod(node_kubectl, ns)["status"]["startTime"])
    assert all(moment(s["completionTime"]) > started for s in ends.values()), (started, ends)
    for name in IN_FLIGHT:
        turns = [e["summary"]["turn"] for e in trajectory(node_kubectl, ns, name)
                 if e["kind"] == "turn"]  # fmt: skip
        assert turns == list(range(1, STEPS + 2)), (name, turns)


def test_the_finished_run_keeps_its_status(upgraded: Upgraded, node_kubectl: Kubectl) -> None:
    after = run_status(node_kubectl, upgraded.namespace, FINISHED)
    keys = ("terminalReason", "phase", "answer", "usage")
    assert {k: after.get(k) for k in keys} == {k: upgraded.finished_before.get(k) for k in keys}


def test_a_run_created_after_the_upgrade_completes(
    upgraded: Upgraded, node_kubectl: Kubectl
) -> None:
    ns = upgraded.namespace
    run = agent_run("after-upgrade", GOAL)
    node_kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(run))
    status = wait_for(node_kubectl, ns, "after-upgrade", ended)
    assert (status["terminalReason"], status["usage"]["steps"]) == ("completed", STEPS + 1)


def test_the_tenants_usage_is_the_sum_of_its_runs(
    upgraded: Upgraded, node_kubectl: Kubectl
) -> None:
    ns = upgraded.namespace
    runs = json.loads(node_kubectl("get", "agentruns", "-n", ns, "-o", "json").stdout)["items"]
    assert all(ended(r.get("status") or {}) for r in runs)
    usages = [r["status"]["usage"] for r in runs]
    tokens = sum(u.get("inputTokens", 0) + u.get("outputTokens", 0) for u in usages)
    assert tokens == len(runs) * (STEPS * CALL_TOKENS + 105)

    def used(status: dict[str, Any]) -> bool:
        """Every call charged once: the runs' committed calls, plus each call a worker made
        whose turn another worker then ran again — its event or its answer lost as the NATS
        pod was replaced, or its request cut unanswered as the upgrade's rollout drained the
        worker and handed the turn back: the provider billed it, so it is charged as
        abandoned (``used`` counts it too) what it used, or cut before its answer its prompt's
        bound; at most two a run in flight, each at most ``PROMPT_CAP``."""
        charged = (status.get("budget") or {}).get("tokens") or {}
        abandoned = charged.get("abandoned", 0)
        return (
            charged.get("used") == tokens + abandoned
            and abandoned <= len(IN_FLIGHT) * 2 * PROMPT_CAP
        )

    wait_tenant(node_kubectl, ns, used)


def wait_tenant(kubectl: Kubectl, name: str, done: Any, timeout: float = 60.0) -> None:
    """Poll the AgentTenant `name`'s status until `done(status)`; AssertionError after
    `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = json.loads(kubectl("get", "agenttenant", name, "-o", "json").stdout)
        status = found.get("status") or {}
        if done(status):
            return
        assert time.monotonic() < deadline, f"AgentTenant {name}: {status}"
        time.sleep(1.0)
