"""A real single node for the cluster tests: its own control plane (started for a node), the
node's components (see `agentrun_dev.node`), and the busybox test image imported into it.

- `cluster_node`: a Ready node, started once for the tests under tests/cluster and stopped
  when they are done (the rest of the suite does not pay for its processes). Its teardown
  asserts that the host is as it was: no mounts, veths, bridge, iptables rules or sysctl
  changes left behind.
- `node_kubectl`: admin kubectl of the node's control plane; `node_namespace`: a fresh
  namespace per test module (the node's controller-manager really deletes it afterwards).
- `import_image`: load an image archive into the node's containerd; `busybox`: the name of
  the locally built busybox image, imported.

The node owns machine-wide names (bridge, pod subnet, kube-proxy chains), so a second test
run on this machine waits for the first one's node to stop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agentrun_dev import binaries, components, controlplane, node, nodeimages
from agentrun_dev.kubectl import Kubectl, create_namespace, delete_namespace

CLAIM_WAIT = 900.0
"""Seconds to wait for another test run's node on this machine to stop."""


@pytest.fixture(scope="package")
def cluster_node(
    tmp_path_factory: pytest.TempPathFactory, devenv_launch: components.Launch
) -> Iterator[node.Node]:
    """A Ready node with its own control plane; stopped (and the host checked) afterwards."""
    executables, node_executables = binaries.ensure_node_binaries(log=print)
    plane = controlplane.start_control_plane(
        tmp_path_factory.mktemp("node-controlplane"),
        executables=executables,
        launch=devenv_launch,
        node=True,
    )
    try:
        started = node.start_node(
            tmp_path_factory.mktemp("node"),
            cluster=plane,
            executables=node_executables,
            launch=devenv_launch,
            claim_wait=CLAIM_WAIT,
        )
        left = ["the node was not started"]
        try:
            yield started
        finally:
            left = started.stop(log=print)
    finally:
        plane.stop()
    assert left == [], "the stopped node left host state behind:\n" + "\n".join(left)


@pytest.fixture(scope="package")
def node_kubectl(cluster_node: node.Node) -> Kubectl:
    """``kubectl(*args, input=None, check=True, timeout=60)`` against the node's cluster."""
    return cluster_node.kubectl


@pytest.fixture(scope="module")
def node_namespace(node_kubectl: Kubectl) -> Iterator[str]:
    """A fresh namespace ``agentrun-node-<8 hex>`` for one test module."""
    name = create_namespace(node_kubectl, prefix="agentrun-node-")
    yield name
    delete_namespace(node_kubectl, name)


@pytest.fixture(scope="package")
def import_image(cluster_node: node.Node) -> Callable[[Path], None]:
    """``import_image(archive)``: load an image archive into the node's containerd."""
    return lambda archive: cluster_node.import_image(archive, log=print)


@pytest.fixture(scope="package")
def busybox(import_image: Callable[[Path], None]) -> str:
    """The busybox image (built here from Debian's busybox-static), imported; its name."""
    image = nodeimages.busybox_image(log=print)
    import_image(image.archive)
    return image.name
