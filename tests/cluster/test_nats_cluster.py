"""The chart's NATS as a three-server JetStream cluster on the node (``nats.install.replicas=3``),
driven with kubectl and helm as a user would: the three servers form one cluster over their
routes (closed bus: TLS, JWT auth, the routes' password), the operator keeps every stream and
KV bucket at R3 (the chart's default on a cluster), the example runs reach their terminal
reasons, and the server leading the run event stream force-deleted while runs are in flight
(its store on an emptyDir: lost with the pod, as with a lost node) leaves every run completed
with each turn committed once, the server back, and its replicas current again. The tests run
in file order on one release."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agentrun import protocol
from agentrun_dev import node, release
from agentrun_dev.kubectl import Kubectl, KubectlError
from cluster.runs_support import (
    REPO,
    assert_completed_once_per_turn,
    demo_release,
    ended,
    print_pods,
    start_slow_runs,
    wait_for,
)

NATS = f"{release.RELEASE_NAME}-nats"
SERVERS = [f"{NATS}-{i}" for i in range(3)]
STREAMS = [
    protocol.STREAM_EVENTS,
    protocol.STREAM_TURNS,
    protocol.kv_stream(protocol.LEDGER_BUCKET),
    protocol.kv_stream(protocol.EFFECTS_BUCKET),
]
pytestmark = [pytest.mark.e2e, pytest.mark.node, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def installed(
    cluster_node: node.Node, node_kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[release.Release]:
    """The chart installed with three NATS servers (no persistence) and the scripted model."""
    nats = {"install": {"enabled": True, "persistence": {"enabled": False}, "replicas": 3}}
    home = tmp_path_factory.mktemp("release")
    with demo_release(cluster_node, node_kubectl, home, "agentrun-natsr3", {"nats": nats}) as r:
        yield r


@pytest.fixture(scope="module")
def ns(installed: release.Release) -> str:
    """The release's namespace."""
    return installed.namespace


def stream_info(kubectl: Kubectl, ns: str, stream: str, *, server: str = SERVERS[0]) -> Any:
    """``nats stream info --json`` of ``stream``, asked with the image's ``nats`` CLI (the
    operator's identity) from the NATS pod ``server``."""
    found = kubectl("exec", "-n", ns, server, "-c", "nats", "--",
                    "nats", "stream", "info", stream, "--json", timeout=60)  # fmt: skip
    return json.loads(found.stdout)


def replicated(info: Any) -> bool:
    """Whether the stream has a leader and two replicas, both current."""
    cluster = info.get("cluster") or {}
    peers = cluster.get("replicas") or []
    return bool(cluster.get("leader")) and len(peers) == 2 and all(p.get("current") for p in peers)


def wait_replicated(kubectl: Kubectl, ns: str, stream: str, *, timeout: float = 180) -> Any:
    """The stream's info once ``replicated``; fails the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            info = stream_info(kubectl, ns, stream)
        except (KubectlError, subprocess.TimeoutExpired, json.JSONDecodeError) as err:
            info = {"error": str(err)}  # a server restarting, a leader being elected
        if replicated(info):
            return info
        assert time.monotonic() < deadline, f"{stream}: {info}"
        time.sleep(2.0)


def test_three_servers_form_one_cluster_and_keep_every_stream_at_r3(
    node_kubectl: Kubectl, ns: str
) -> None:
    selector = "app.kubernetes.io/component=nats"
    pods = json.loads(node_kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "json").stdout)
    ready = {
        p["metadata"]["name"]: all(c["ready"] for c in p["status"].get("containerStatuses", []))
        for p in pods["items"]
    }
    assert ready == dict.fromkeys(SERVERS, True)
    for stream in STREAMS:
        info = wait_replicated(node_kubectl, ns, stream)
        assert info["config"]["num_replicas"] == 3, stream
        assert {info["cluster"]["leader"], *(p["name"] for p in info["cluster"]["replicas"])} == (
            set(SERVERS)
        ), stream


def test_the_example_runs_reach_their_terminal_reasons(node_kubectl: Kubectl, ns: str) -> None:
    expected = {"rectangle": "completed", "collatz": "max_steps"}
    for name in expected:
        node_kubectl("apply", "-n", ns, "-f", str(REPO / "examples" / f"{name}.yaml"))
    reasons = {name: wait_for(node_kubectl, ns, name, ended)["terminalReason"] for name in expected}
    if reasons != expected:
        print_pods(node_kubectl, ns)
    assert reasons == expected


def test_the_event_stream_s_leader_force_deleted_mid_run_loses_no_turn(
    node_kubectl: Kubectl, ns: str
) -> None:
    names = [f"slow-nats-{i}" for i in range(3)]
    start_slow_runs(node_kubectl, ns, names)
    leader = wait_replicated(node_kubectl, ns, protocol.STREAM_EVENTS)["cluster"]["leader"]
    assert leader in SERVERS
    node_kubectl("delete", "pod", leader, "-n", ns, "--grace-period=0", "--force")
    assert_completed_once_per_turn(node_kubectl, ns, names)
    node_kubectl("wait", "pod", leader, "-n", ns, "--for=condition=Ready", "--timeout=180s",
                 timeout=190)  # fmt: skip
    for stream in STREAMS:  # the new server (an empty store) caught up on every stream
        wait_replicated(node_kubectl, ns, stream)
