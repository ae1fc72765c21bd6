"""Session fixtures that start real services, through the same code as ``agentrun dev up``.

- `control_plane`: etcd + kube-apiserver from `agentrun_dev.controlplane` (or the cluster
  of ``KUBECONFIG`` when ``AGENTRUN_USE_EXISTING_CLUSTER=1``); `kubectl` drives it; `crds`
  installs ``crds/*.yaml``; `test_namespace` gives each test a fresh namespace.
- `nats_server`: nats-server with JetStream from `agentrun_dev.natsserver`.
- `nats_cluster`: three nats-servers routed as one JetStream cluster (`agentrun_dev.natscluster`),
  one per test module.
- `devenv_binaries`: the control-plane executables (see `agentrun_dev.binaries`).
- `devenv_launch`: where fixtures' processes log (a pytest temp dir, kept for the last three
  sessions) and the rule that they die with the pytest process.

Every process is stopped by pid at session end, and is SIGKILLed by the kernel if pytest
itself dies. The control-plane binaries are built (once per machine) right after collection
when a selected test needs them, with progress on the terminal and outside per-test timeouts.
Higher-level fixtures (mock model, operator, workers) belong in the suites that need them,
built on `agentrun_dev.stack`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_nats_support import jetstream_usable

from agentrun_dev import binaries, components, controlplane, natscluster, natsserver
from agentrun_dev.kubectl import Kubectl, apply_crds, create_namespace, delete_namespace

pytest_plugins = ["prometheus_support"]

REPO = Path(__file__).resolve().parent.parent
CRD_DIR = REPO / "crds"


BINARY_FIXTURES = frozenset({"control_plane", "devenv_binaries", "cluster_node"})
"""The fixtures that need the Go-built control-plane (or node) binaries."""


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the marker is selectable
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses one of `BINARY_FIXTURES` ``binaries``, so ``-m 'not binaries'``
    selects what runs while the binaries build (the Makefile's first tier)."""
    for item in items:
        if BINARY_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.binaries)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build or locate the control-plane (and node) binaries before the first test needing them."""
    used = set().union(*(getattr(item, "fixturenames", ()) for item in session.items))
    if not BINARY_FIXTURES & used:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")

    def show(line: str) -> None:
        if reporter is not None:
            reporter.write_line(f"agentrun devenv: {line}")

    if "cluster_node" in used:  # the node's binaries too, in the same go build
        binaries.ensure_node_binaries(log=show)
    if controlplane.existing_cluster_requested():
        binaries.find_kubectl(log=show)
    else:
        binaries.ensure_binaries(log=show)


@pytest.fixture(scope="session")
def devenv_launch(tmp_path_factory: pytest.TempPathFactory) -> components.Launch:
    """Launch settings for fixture processes: logs in a temp dir, killed if pytest dies."""
    return components.Launch(
        log_dir=tmp_path_factory.mktemp("devenv-logs"), die_with_parent=True, log=print
    )


@pytest.fixture(scope="session")
def devenv_binaries() -> binaries.Binaries:
    """etcd, kube-apiserver and kubectl (already built or located after collection)."""
    return binaries.ensure_binaries(log=print)


@pytest.fixture(scope="session")
def control_plane(
    tmp_path_factory: pytest.TempPathFactory, devenv_launch: components.Launch
) -> Iterator[controlplane.Cluster]:
    """A started local control plane (or the existing cluster); stopped at session end."""
    cluster = controlplane.open_cluster(
        tmp_path_factory.mktemp("controlplane"), launch=devenv_launch
    )
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def kubectl(control_plane: controlplane.Cluster) -> Kubectl:
    """``kubectl(*args, input=None, check=True, timeout=60) -> CompletedProcess[str]``."""
    return Kubectl.for_cluster(control_plane)


@pytest.fixture(scope="session")
def crds(kubectl: Kubectl) -> list[str]:
    """Applies ``crds/*.yaml`` and waits until Established; the CRD resource names."""
    return apply_crds(kubectl, CRD_DIR)


def _nats_server(
    tmp_path_factory: pytest.TempPathFactory, launch: components.Launch
) -> Iterator[natsserver.NatsServer]:
    server = natsserver.start_nats_server(tmp_path_factory.mktemp("nats"), launch=launch)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def nats_server(
    tmp_path_factory: pytest.TempPathFactory, devenv_launch: components.Launch
) -> Iterator[natsserver.NatsServer]:
    """A started nats-server with JetStream (``.url``); stopped at session end."""
    yield from _nats_server(tmp_path_factory, devenv_launch)


@pytest.fixture(scope="module")
def own_nats_server(
    tmp_path_factory: pytest.TempPathFactory, devenv_launch: components.Launch
) -> Iterator[natsserver.NatsServer]:
    """A nats-server of one test module's own, stopped after it: no other test's operator or
    workers (the e2e stack shares ``nats_server``) can take the turns it publishes."""
    yield from _nats_server(tmp_path_factory, devenv_launch)


@pytest.fixture(scope="module")
def nats_cluster(
    tmp_path_factory: pytest.TempPathFactory, devenv_launch: components.Launch
) -> Iterator[natscluster.NatsCluster]:
    """Three closed nats-servers forming one JetStream cluster (``.servers``, ``.url``,
    ``.auth(identity)``), of one test module's own; stopped after it."""
    cluster = natscluster.start_nats_cluster(
        tmp_path_factory.mktemp("natscluster"), launch=devenv_launch
    )
    try:
        # in a thread of its own: this session's event loop stays the current one here
        with concurrent.futures.ThreadPoolExecutor(1) as thread:
            thread.submit(asyncio.run, jetstream_usable(cluster)).result()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def test_namespace(kubectl: Kubectl) -> Iterator[str]:
    """A fresh namespace ``agentrun-test-<8 hex>``; deletion is requested afterwards.

    Without a controller-manager the local control plane leaves it Terminating, which is
    harmless: names never repeat.
    """
    name = create_namespace(kubectl)
    yield name
    delete_namespace(kubectl, name)
