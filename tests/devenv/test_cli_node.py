"""``agentrun dev demo --chart --down`` (``make demo-cluster``): a Ready node from the CLI, the
chart installed on it, the examples' terminal reasons printed, then every process stopped by
pid and the host as it was.

Root only. Runs after tests/cluster (whose node must be gone: one node per machine)."""

from __future__ import annotations

import collections
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml

from agentrun_dev import node, nodehost, procs, release, stack, state

REPO = Path(__file__).resolve().parents[2]
NODE_WAIT = 900
"""Seconds the demo waits for another test run's node on this machine to stop."""
pytestmark = [pytest.mark.e2e, pytest.mark.node, pytest.mark.timeout(3 * NODE_WAIT + 900)]


def agentrun(*args: str, timeout: float = 2000) -> subprocess.CompletedProcess[str]:
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


def quiet_snapshot(dev_dir: Path) -> nodehost.HostSnapshot:
    """The host while no node runs on it, for the demo's node in `dev_dir`: the machine's node
    claim taken (waiting for another test run's node to stop; after a dead one, cleaned up as a
    node would), the snapshot, the claim released. Unclaimed, a node of another test run that
    starts the moment the demo's stops would count as the demo's leftovers."""
    claim_dir = dev_dir.parent / "host-claim"
    me = psutil.Process(os.getpid())
    owner = procs.record_of("test", me.pid, claim_dir / "claim.log")
    stale = nodehost.claim_host(claim_dir, owner=owner, wait=NODE_WAIT, log=print)
    try:
        if stale is not None:
            node.clean_stale(stale, log=print)
        return nodehost.take_snapshot(dev_dir / "node")
    finally:
        nodehost.release_host(claim_dir)


def test_demo_with_the_chart_runs_the_examples_on_pods_then_down_leaves_the_host_clean(
    dev_dir: Path,
) -> None:
    """``make demo-cluster``: ``agentrun dev demo --chart --down``."""
    before = quiet_snapshot(dev_dir)

    shown = agentrun("dev", "demo", "--chart", "--down", "--dir", str(dev_dir),
                     "--node-wait", str(NODE_WAIT))  # fmt: skip
    print(shown.stdout)
    assert shown.returncode == 0, shown.stderr
    pods_table, runs_table = shown.stdout.split("$ kubectl get agentruns", 1)
    pods = [line.split() for line in pods_table.splitlines()[2:] if line.strip()]
    running = collections.Counter(
        name.split("-")[1]
        for name, ready, status, *_, node_name, _nominated, _gates in pods
        if (ready, status, node_name) == ("1/1", "Running", node.NODE_NAME)
    )
    defaults = yaml.safe_load((REPO / release.CHART_DIR / "values.yaml").read_text())
    operators = defaults["operator"]["replicas"]
    expected = {"mock": 1, "nats": 1, "operator": operators, "worker": 2, "trajectory": 1}
    assert running == expected, pods_table
    rows = {line.split()[0]: line.split()[1:3] for line in runs_table.splitlines()[2:5]}
    assert rows == {
        "rectangle": ["Succeeded", "completed"],
        "collatz": ["Failed", "max_steps"],
        "inventory": ["Failed", "tool_budget_exhausted"],
    }

    assert f"helm install {release.RELEASE_NAME}" in shown.stderr
    assert "deleting the node's pods" in shown.stderr
    assert "left behind" not in shown.stderr
    stopped = dict(re.findall(r"agentrun dev: (\S+) \(pid (\d+)\): stopped", shown.stderr))
    assert set(stopped) == {"etcd", "kube-apiserver", *node.COMPONENT_NAMES}
    assert not any(psutil.pid_exists(int(pid)) for pid in stopped.values())
    assert state.load_state(dev_dir) is None
    assert nodehost.leftovers(before, quiet_snapshot(dev_dir)) == []
    assert nodehost.claim_holder() != (dev_dir / "node").resolve()
