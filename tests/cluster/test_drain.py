"""Rollouts and scale-in on a real node pay for nothing twice: the chart installed with helm,
runs whose turns take seconds (a slow scripted model) and write through an MCP tool server
(a counting ``write`` tool), and while they are in flight a ``helm upgrade`` that rolls the
workers, then a scale-in from three workers to one. Every stopping worker drains within its
grace period: every run completes (none ``effect_unknown``), the model is asked once per
(run, turn) (the scripted model counts), every write happens once, and the tenant is charged
nothing as abandoned.

The tool server runs on the host, listening on the node's pod gateway, where the pods reach it.
So does NATS: the release is installed as docs/install.md's "Bringing your own NATS" says, by a
platform team whose NATS runs outside the chart (``nats.install.enabled=false``): the users made
by ``agentrun nats bootstrap``, the server trusting them (their ``auth.conf``), its URL, its CA
and its store size given as values; the release renders no NATS of its own and no NATS hook,
and every turn of the drain tests goes through that server.
"""

from __future__ import annotations

import base64
import json
import re
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp_support
import pytest
import yaml
from bootstrap_support import bring_nats_credentials

from agentrun_dev import demo, natsserver, node, nodehost, release
from agentrun_dev.kubectl import Kubectl

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "agentrun"
RELEASE = release.RELEASE_NAME
LATENCY_MS = 4000
SCENARIO = {
    "name": "drain",
    "match": {"goal": "drain-slow-write"},
    "turns": [
        {
            "tool_calls": [{"id": "w{request}", "name": "ledger__count_slow",
                            "arguments": {"key": "drain", "seconds": 3}}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 10},
            "latency_ms": LATENCY_MS,
        },
        {
            "tool_calls": [{"name": "calculate", "arguments": {"expression": "6*7"}}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 10},
            "latency_ms": LATENCY_MS,
        },
        {"content": "drained", "usage": {"prompt_tokens": 100, "completion_tokens": 5},
         "latency_ms": LATENCY_MS},
    ],
}  # fmt: skip
MODEL_TURNS = 3
"""Model calls per run, and its steps: the write's decision, the calculation, the answer (the
write itself runs in a resume turn of its own, with no model call and no step)."""
GRACE, MARGIN = 90, 20
OWN_NATS = "platform-nats"
"""The prefix of the platform's NATS credentials' Secrets (``agentrun nats bootstrap``)."""
RUN_IN_GOAL = re.compile(r"drain-slow-write ([a-z0-9-]+)")
pytestmark = [pytest.mark.e2e, pytest.mark.node, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[mcp_support.McpProcess]:
    """The counting MCP server on the host, on the node's pod gateway."""
    work = tmp_path_factory.mktemp("drain-tools")
    server = mcp_support.McpProcess(
        mcp_support.free_port(), "streamable-http", work / "counts.json", work / "mcp.log",
        host=nodehost.GATEWAY,
    )  # fmt: skip
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def release_namespace(node_kubectl: Kubectl) -> str:
    namespace = f"agentrun-drain-{uuid.uuid4().hex[:6]}"
    node_kubectl("create", "namespace", namespace)
    return namespace


@pytest.fixture(scope="module")
def own_nats(
    release_namespace: str, node_kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[natsserver.NatsServer]:
    """The platform's own NATS (docs/install.md, "Bringing your own NATS"): its agentrun users
    made by ``agentrun nats bootstrap`` in the release's namespace, a closed server on the
    host (on the node's pod gateway) trusting them through their ``auth.conf``, its CA in a
    Secret beside them."""
    bring_nats_credentials(node_kubectl, release_namespace, OWN_NATS)
    auth_conf = node_kubectl("get", "secret", f"{OWN_NATS}-server", "-n", release_namespace,
                             "-o", "jsonpath={.data.auth\\.conf}").stdout  # fmt: skip
    server = natsserver.start_given_server(
        tmp_path_factory.mktemp("platform-nats"), host=nodehost.GATEWAY,
        auth_conf=base64.b64decode(auth_conf).decode(),
    )  # fmt: skip
    try:
        assert server.auth_dir is not None
        node_kubectl("create", "secret", "generic", f"{OWN_NATS}-ca", "-n", release_namespace,
                     f"--from-file=ca.crt={server.auth_dir / 'ca.crt'}")  # fmt: skip
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def installed(
    cluster_node: node.Node, node_kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory,
    release_namespace: str, own_nats: natsserver.NatsServer,
) -> Iterator[release.Release]:  # fmt: skip
    """The chart on the platform's NATS (no NATS of its own), the scripted model with the
    drain scenario, three workers that drain for GRACE - MARGIN seconds, in a namespace under
    Pod Security ``restricted``."""
    release.import_project_images(cluster_node.directory, project=REPO, log=print)
    scenarios = yaml.safe_load((REPO / "examples" / "scenarios.yaml").read_text())
    scenarios["scenarios"].append(SCENARIO)
    values = release.demo_values(default_tenant=demo.TENANT_NAME, worker_replicas=3)
    values["nats"] = {
        "install": {"enabled": False},
        "url": own_nats.url,
        "storeBytes": own_nats.store_bytes,
        "auth": {"operatorSecret": f"{OWN_NATS}-operator", "workerSecret": f"{OWN_NATS}-worker"},
        "tls": {"existingSecret": f"{OWN_NATS}-ca"},
    }
    values["mockModel"]["scenarios"] = scenarios
    values["turnAckWaitSeconds"] = 5  # a heartbeat every 5/3 s keeps a long turn with its worker
    values["worker"]["terminationGracePeriodSeconds"] = GRACE
    values["worker"]["drainMarginSeconds"] = MARGIN
    installed = release.install_chart(
        node_kubectl, chart=CHART, values=values, home=tmp_path_factory.mktemp("drain-release"),
        namespace=release_namespace, log=print,
    )  # fmt: skip
    yield installed
    installed.helm("uninstall", installed.name, "-n", installed.namespace,
                   "--ignore-not-found", "--wait", check=False, timeout=300)  # fmt: skip


@pytest.fixture(scope="module")
def team(
    installed: release.Release, node_kubectl: Kubectl, tool_server: mcp_support.McpProcess
) -> Iterator[str]:
    """A namespace of runs, its own AgentTenant (so its ledger shows what was abandoned) and
    the AgentToolServer of the counting server."""
    namespace = f"drain-team-{uuid.uuid4().hex[:6]}"
    node_kubectl("create", "namespace", namespace)
    tenant = {
        "apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentTenant",
        "metadata": {"name": namespace},
        "spec": {"namespaces": [namespace], "budget": {"tokens": 10_000_000},
                 "maxConcurrentRuns": 50,
                 "toolServers": {"allow": [{"host": nodehost.GATEWAY, "privateNetwork": True}]}},
    }  # fmt: skip
    tools = {
        "apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentToolServer",
        "metadata": {"name": "ledger", "namespace": namespace},
        "spec": {"url": tool_server.url, "tools": [{"name": "count_slow", "effect": "write"}]},
    }  # fmt: skip
    node_kubectl("apply", "-f", "-", input=yaml.safe_dump_all([tenant, tools]))
    yield namespace
    node_kubectl("delete", "agenttenant", namespace, "--ignore-not-found", "--wait=false")
    node_kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def run(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": name},
        "spec": {"model": "mock", "goal": f"drain-slow-write {name}",
                 "tools": ["ledger/count_slow", "calculate"],
                 "budget": {"maxSteps": 10, "timeout": "10m"}},
    }  # fmt: skip


def statuses(kubectl: Kubectl, namespace: str) -> dict[str, dict[str, Any]]:
    listed = json.loads(kubectl("get", "agentruns", "-n", namespace, "-o", "json").stdout)
    return {r["metadata"]["name"]: r.get("status") or {} for r in listed["items"]}


def start_runs(kubectl: Kubectl, namespace: str, names: list[str]) -> None:
    """Apply `names` and wait until every one is past its first model call (in flight)."""
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all([run(n) for n in names]))
    deadline = time.monotonic() + 180
    while True:
        shown = statuses(kubectl, namespace)
        if all((shown.get(n, {}).get("usage") or {}).get("steps", 0) >= 1 for n in names):
            return
        assert time.monotonic() < deadline, shown
        time.sleep(1.0)


def wait_all_ended(kubectl: Kubectl, namespace: str, names: list[str]) -> dict[str, Any]:
    deadline = time.monotonic() + 600
    while True:
        shown = statuses(kubectl, namespace)
        if all(shown.get(n, {}).get("terminalReason") for n in names):
            return {n: shown[n] for n in names}
        assert time.monotonic() < deadline, shown
        time.sleep(2.0)


def model_requests(kubectl: Kubectl, namespace: str) -> Counter[tuple[str, int]]:
    """Requests the scripted model answered for the drain scenario, per (run, turn)."""
    script = (
        "import urllib.request;"
        "print(urllib.request.urlopen('http://127.0.0.1:8000/_mock/requests').read().decode())"
    )
    pod = kubectl("get", "pods", "-n", namespace, "-l", "app.kubernetes.io/component=mock-model",
                  "-o", "jsonpath={.items[0].metadata.name}").stdout  # fmt: skip
    raw = json.loads(kubectl("exec", "-n", namespace, pod, "--", "python3.11", "-c", script).stdout)
    requests = raw["requests"] if isinstance(raw, dict) else raw
    counted: Counter[tuple[str, int]] = Counter()
    for request in requests:
        if request.get("scenario") != "drain":
            continue
        found = RUN_IN_GOAL.search(json.dumps(request["body"]["messages"]))
        assert found is not None, request
        counted[(found.group(1), int(request["turn"]))] += 1
    return counted


def worker_pods(kubectl: Kubectl, namespace: str, *, terminating: bool = False) -> set[str]:
    """The worker pods (with `terminating`, only those still draining after their deletion)."""
    listed = kubectl("get", "pods", "-n", namespace, "-l", "app.kubernetes.io/component=worker",
                     "-o", "json").stdout  # fmt: skip
    return {
        p["metadata"]["name"]
        for p in json.loads(listed)["items"]
        if (p["metadata"].get("deletionTimestamp") is not None) == terminating
    }


def wait_drained(kubectl: Kubectl, namespace: str) -> None:
    """Until no worker pod is terminating (each stopped one drained and exited in its grace)."""
    deadline = time.monotonic() + GRACE + 30
    while stopping := worker_pods(kubectl, namespace, terminating=True):
        assert time.monotonic() < deadline, f"still terminating after the grace: {stopping}"
        time.sleep(1.0)


def assert_paid_once(
    kubectl: Kubectl, release_ns: str, team: str, names: list[str], ends: dict[str, Any]
) -> None:
    summary = {
        n: (s["terminalReason"], s.get("answer"), s["usage"]["steps"]) for n, s in ends.items()
    }
    assert summary == dict.fromkeys(names, ("completed", "drained", MODEL_TURNS))
    asked = model_requests(kubectl, release_ns)
    assert {key: count for key, count in asked.items() if key[0] in names and count != 1} == {}
    assert {(n, t) for n in names for t in range(MODEL_TURNS)} <= set(asked)


def tenant_abandoned(kubectl: Kubectl, team: str) -> tuple[int, str]:
    status = json.loads(kubectl("get", "agenttenant", team, "-o", "json").stdout)["status"]
    return status["budget"]["tokens"]["abandoned"], status["budget"]["costUSD"]["abandoned"]


def test_a_helm_upgrade_that_rolls_the_workers_pays_for_nothing_twice(
    installed: release.Release, node_kubectl: Kubectl, team: str,
    tool_server: mcp_support.McpProcess,
) -> None:  # fmt: skip
    names = [f"upgrade-{i}" for i in range(4)]
    start_runs(node_kubectl, team, names)
    before = worker_pods(node_kubectl, installed.namespace)
    installed.helm(
        "upgrade", installed.name, str(installed.chart), "-n", installed.namespace,
        "--reuse-values", "--set", "worker.podAnnotations.agentrun\\.dev/rolled=yes",
        "--wait", "--timeout", "10m", timeout=660,
    )  # fmt: skip
    # every worker replaced; a replaced one may still be finishing the turns it held
    assert not before & worker_pods(node_kubectl, installed.namespace)
    ends = wait_all_ended(node_kubectl, team, names)
    wait_drained(node_kubectl, installed.namespace)
    assert_paid_once(node_kubectl, installed.namespace, team, names, ends)
    assert tool_server.counts() == {"drain": len(names)}  # each run wrote once
    assert tenant_abandoned(node_kubectl, team) == (0, "0")


def test_a_scale_in_while_runs_are_in_flight_pays_for_nothing_twice(
    installed: release.Release, node_kubectl: Kubectl, team: str,
    tool_server: mcp_support.McpProcess,
) -> None:  # fmt: skip
    written = tool_server.counts().get("drain", 0)
    names = [f"scale-in-{i}" for i in range(6)]
    start_runs(node_kubectl, team, names)
    node_kubectl("scale", "deployment", f"{RELEASE}-worker", "-n", installed.namespace,
                 "--replicas=1")  # fmt: skip
    ends = wait_all_ended(node_kubectl, team, names)
    assert_paid_once(node_kubectl, installed.namespace, team, names, ends)
    assert tool_server.counts() == {"drain": written + len(names)}
    assert tenant_abandoned(node_kubectl, team) == (0, "0")
    wait_drained(node_kubectl, installed.namespace)
    assert len(worker_pods(node_kubectl, installed.namespace)) == 1


def monitored(server: natsserver.NatsServer, path: str) -> dict[str, Any]:
    """``server``'s monitoring endpoint ``path`` (``connz``, ``jsz``, with their query)."""
    with urllib.request.urlopen(f"{server.monitor_url}/{path}", timeout=10) as answer:
        found: dict[str, Any] = json.load(answer)
    return found


def test_the_release_ran_on_the_nats_the_platform_brought(
    installed: release.Release, node_kubectl: Kubectl, own_nats: natsserver.NatsServer
) -> None:
    """After the drain tests: the release made no NATS of its own (no StatefulSet, no NATS
    bootstrap hook, no NATS Secret but the platform's), the operator and the workers are
    connected to the platform's server from their pods, and the runs' events are stored
    there."""
    namespace = installed.namespace
    assert node_kubectl("get", "statefulsets,jobs", "-n", namespace, "-o", "name").stdout == ""
    secrets = node_kubectl("get", "secrets", "-n", namespace, "-o", "name").stdout.split()
    assert {s for s in secrets if "nats" in s} == {
        f"secret/{OWN_NATS}-{part}" for part in ("keys", "server", "operator", "worker", "ca")
    }
    connz = monitored(own_nats, "connz?limit=1024")
    pods = {c["name"].rpartition("-")[0] for c in connz["connections"] if c["ip"] != "127.0.0.1"}
    assert {"agentrun-operator", "agentrun-worker"} <= pods, connz["connections"]
    jsz = monitored(own_nats, "jsz?accounts=true&streams=true")
    streams = {
        stream["name"]: stream["state"]["messages"]
        for account in jsz["account_details"]
        for stream in account.get("stream_detail") or []
    }
    assert streams.get("AGENTRUN_EVENTS", 0) > 0, streams
