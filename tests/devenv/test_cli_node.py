"""``agentrun dev up --node`` / ``down``: a Ready node from the CLI, and a clean host after.

Root only. Runs after tests/cluster (whose node must be gone: one node per machine)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrun_dev import node, nodehost, procs, stack, state
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


def test_up_with_a_node_runs_a_ready_node_and_down_leaves_the_host_clean(
    dev_dir: Path, tmp_path: Path
) -> None:
    d = ("--dir", str(dev_dir))
    before = nodehost.take_snapshot(dev_dir / "node")

    up = agentrun("dev", "up", "--node", "--workers", "0", *d)
    assert up.returncode == 0, up.stderr
    running = state.load_state(dev_dir)
    assert running is not None and running.complete and running.kubectl is not None
    assert running.node_dir == dev_dir / "node"
    names = [c.name for c in running.components]
    assert names[2 : 2 + len(node.COMPONENT_NAMES)] == list(node.COMPONENT_NAMES)
    admin = Kubectl(running.kubectl, kubeconfig=str(running.kubeconfig), cache_dir=tmp_path)
    found = admin("get", "node", node.NODE_NAME, "-o", "json")
    conditions = {c["type"]: c["status"] for c in json.loads(found.stdout)["status"]["conditions"]}
    assert conditions["Ready"] == "True"
    assert nodehost.leftovers(before, nodehost.take_snapshot(dev_dir / "node")) != []

    down = agentrun("dev", "down", *d)
    assert down.returncode == 0, down.stderr
    assert "deleting the node's pods" in down.stderr
    assert "left behind" not in down.stderr
    assert not any(procs.is_alive(c.record) for c in running.components)
    assert nodehost.leftovers(before, nodehost.take_snapshot(dev_dir / "node")) == []
    assert nodehost.claim_holder() != (dev_dir / "node").resolve()
