"""``agentrun dev demo --chart`` (``make demo-cluster``) / ``down``: a Ready node from the CLI,
the chart installed on it, the examples' terminal reasons printed, and a clean host after.

Root only. Runs after tests/cluster (whose node must be gone: one node per machine)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrun_dev import node, nodehost, procs, release, stack, state
from agentrun_dev.kubectl import Kubectl

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]


def agentrun(*args: str, timeout: float = 1100) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(stack.script_path("agentrun")), *args],
        cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


@pytest.fixture
def dev_dir(tmp_path: Path) -> Iterator[Path]:
    """A state directory; whatever a test leaves up in it is brought down afterwards."""
    directory = tmp_path / "dev"
    yield directory
    if state.load_state(directory) is not None:
        agentrun("dev", "down", "--dir", str(directory))


def test_demo_with_the_chart_runs_the_examples_on_pods_and_down_leaves_the_host_clean(
    dev_dir: Path, tmp_path: Path
) -> None:
    d = ("--dir", str(dev_dir))
    before = nodehost.take_snapshot(dev_dir / "node")

    shown = agentrun("dev", "demo", "--chart", *d)
    assert shown.returncode == 0, shown.stderr
    running = state.load_state(dev_dir)
    assert running is not None and running.complete and running.kubectl is not None
    assert running.node_dir == dev_dir / "node"
    assert running.release_namespace == release.RELEASE_NAMESPACE
    names = [c.name for c in running.components]
    assert names[2:] == list(node.COMPONENT_NAMES)  # no local nats, model, operator, workers
    admin = Kubectl(running.kubectl, kubeconfig=str(running.kubeconfig), cache_dir=tmp_path)
    found = admin("get", "node", node.NODE_NAME, "-o", "json")
    conditions = {c["type"]: c["status"] for c in json.loads(found.stdout)["status"]["conditions"]}
    assert conditions["Ready"] == "True"
    pods = json.loads(admin("get", "pods", "-n", release.RELEASE_NAMESPACE, "-o", "json").stdout)
    running_pods = {
        p["metadata"]["labels"]["app.kubernetes.io/component"]: p["status"]["phase"]
        for p in pods["items"]
    }
    expected = dict.fromkeys(("operator", "worker", "mock-model", "nats"), "Running")
    assert running_pods == expected
    table = shown.stdout.split("$ kubectl get agentruns", 1)[1]
    rows = {line.split()[0]: line.split()[1:3] for line in table.splitlines()[2:5]}
    assert rows == {
        "rectangle": ["Succeeded", "completed"],
        "collatz": ["Failed", "max_steps"],
        "inventory": ["Failed", "tool_budget_exhausted"],
    }
    assert nodehost.leftovers(before, nodehost.take_snapshot(dev_dir / "node")) != []

    down = agentrun("dev", "down", *d)
    assert down.returncode == 0, down.stderr
    assert "deleting the node's pods" in down.stderr
    assert "left behind" not in down.stderr
    assert not any(procs.is_alive(c.record) for c in running.components)
    assert nodehost.leftovers(before, nodehost.take_snapshot(dev_dir / "node")) == []
    assert nodehost.claim_holder() != (dev_dir / "node").resolve()
