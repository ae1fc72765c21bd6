"""Session fixtures that start real services, through the same code as ``agentrun dev up``.

- `control_plane`: etcd + kube-apiserver from `agentrun_dev.controlplane` (or the cluster
  of ``KUBECONFIG`` when ``AGENTRUN_USE_EXISTING_CLUSTER=1``); `kubectl` drives it; `crds`
  installs ``crds/*.yaml``; `test_namespace` gives each test a fresh namespace.
- `nats_server`: nats-server with JetStream from `agentrun_dev.natsserver`.
- `nats_cluster`: three nats-servers routed as one JetStream cluster (`agentrun_dev.natscluster`),
  one per test module.
- `devenv_binaries`: the control-plane executables (see `agentrun_dev.binaries`).
- `helm_binary`, `natscli_binary`, `syft_binary`: the pinned helm, ``nats`` CLI and syft (with
  ``prometheus_binaries`` of `prometheus_support`, the tools that `TOOL_FIXTURES` name).
- `devenv_launch`: where fixtures' processes log (a pytest temp dir, kept for the last three
  sessions) and the rule that they die with the pytest process.

Every process is stopped by pid at session end, and is SIGKILLed by the kernel if pytest
itself dies. The control-plane binaries and the tools are built (once per machine) right after
collection when a selected test needs them, with progress on the terminal and outside per-test
timeouts. A test using one of them is marked (``binaries``, ``toolbinaries``) so that
``.ci/pytest-tiers`` runs it only once its builds are done: a test reaching a Go-built binary
asks for it by fixture, never by calling its ``ensure_*`` itself.
Higher-level fixtures (mock model, operator, workers) belong in the suites that need them,
built on `agentrun_dev.stack`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from clock_support import pause_before_test
from cluster_nats_support import jetstream_usable

from agentrun_dev import (
    binaries,
    components,
    controlplane,
    dist,
    helm,
    natscluster,
    natsserver,
    probes,
    prometheus,
)
from agentrun_dev.kubectl import Kubectl, apply_crds, create_namespace, delete_namespace

pytest_plugins = ["prometheus_support"]

REPO = Path(__file__).resolve().parent.parent
CRD_DIR = REPO / "crds"


BINARY_FIXTURES = frozenset({"control_plane", "devenv_binaries", "cluster_node"})
"""The fixtures that need the Go-built control-plane (or node) binaries."""

TOOL_FIXTURES = frozenset({"helm_binary", "natscli_binary", "syft_binary", "prometheus_binaries"})
"""The fixtures that need the Go-built tools: helm, the nats CLI, syft, Prometheus and
promtool (built after the control plane; the tests using them have a tier of their own)."""


def pytest_configure(config: pytest.Config) -> None:
    """In a pytest-xdist worker (``.ci/pytest-tiers`` runs every tier but the node's with
    ``-n``), the fixtures' services take their ports from a slice of this worker's own
    (`probes.port_slice`): two workers starting stacks at once never pick the same port."""
    worker = getattr(config, "workerinput", {}).get("workerid", "")  # "gw0", "gw1", …
    if worker.startswith("gw") and not os.environ.get(probes.PORT_RANGE_ENV):
        os.environ[probes.PORT_RANGE_ENV] = probes.port_slice(int(worker.removeprefix("gw")))


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the markers are selectable
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses one of `BINARY_FIXTURES` ``binaries`` and every test that uses
    one of `TOOL_FIXTURES` ``toolbinaries``, so ``-m 'not binaries and not toolbinaries'``
    selects what runs while the binaries build (the first tier of ``.ci/pytest-tiers``).
    Then the tests of modules marked ``long`` go first, each module's in its own order: the
    tiers' pytest-xdist workers take a module at a time in this order
    (``--no-loadscope-reorder``), so no module of minutes starts last and ends a tier alone."""
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if BINARY_FIXTURES & used:
            item.add_marker(pytest.mark.binaries)
        if TOOL_FIXTURES & used:
            item.add_marker(pytest.mark.toolbinaries)
    items.sort(key=lambda item: item.get_closest_marker("long") is None)  # stable


_MODULE_RUN_LAST: list[object] = [None]
"""The module of the test this process ran last (a test of another module is its first)."""


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outside pytest-timeout's per-test clock
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Before a test of real processes (``clock_support.REAL_CLOCK_FIXTURES``) and its
    fixtures' set-up, wait into the next UTC day when too little of this one is left: a
    tenant's default window ends at 00:00 UTC, and a test that charged runs before it and read
    the window's usage after it would find part of its charges gone (a CI run at midnight
    failed two e2e tests so). A node module (its tests share one cluster) waits before its
    first test only (``clock_support.pause_before_test``). At most one wait per process and
    day."""
    module = getattr(item, "module", None)
    first, _MODULE_RUN_LAST[0] = module is not _MODULE_RUN_LAST[0], module
    pause = pause_before_test(
        getattr(item, "fixturenames", ()),
        time.time(),
        whole_module=item.get_closest_marker("node") is not None,
        first_in_module=first,
    )
    if pause:
        reporter = item.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"agentrun: waiting {pause:.0f}s for the next UTC day")
        print(f"agentrun: waiting {pause:.0f}s for the next UTC day", file=sys.stderr)
        time.sleep(pause)
    yield


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build or locate the control-plane (and node) binaries, helm, the nats CLI and syft
    before the first test needing them (``prometheus_support`` does Prometheus'). Nothing is
    built for ``--collect-only``: a listing runs no test, and must not wait minutes for a
    build another process holds (the suite's own tests list tiers while the builds run)."""
    if session.config.option.collectonly:
        return
    used = set().union(*(getattr(item, "fixturenames", ()) for item in session.items))
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")

    def show(line: str) -> None:
        if reporter is not None:
            reporter.write_line(f"agentrun devenv: {line}")

    if BINARY_FIXTURES & used:
        if "cluster_node" in used:  # the node's binaries too, in the same go build
            binaries.ensure_node_binaries(log=show)
        if controlplane.existing_cluster_requested():
            binaries.find_kubectl(log=show)
        else:
            binaries.ensure_binaries(log=show)
    if "helm_binary" in used:
        helm.ensure_helm(log=show)
    if "natscli_binary" in used:
        binaries.ensure_natscli(log=show)
    if "syft_binary" in used:
        dist.syft_binary(log=show)


TOOL_LOOKUPS = (
    (helm, "ensure_helm", "helm_binary"),
    (prometheus, "ensure_prometheus", "prometheus_binaries"),
    (binaries, "ensure_natscli", "natscli_binary"),
    (dist, "syft_binary", "syft_binary"),
)
"""(module, function, fixture): how the tools are looked up in the machine's cache, and the
fixture a test asks for instead."""
AFTER_EVERY_BUILD = ("toolbinaries", "node", "nodebinaries", "realmodel")
"""Markers of the tiers that run once the tools are built."""


@pytest.fixture(autouse=True)
def _tools_only_by_fixture(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a test of a tier that does not wait for the tools' build (marked none of
    `AFTER_EVERY_BUILD`), looking a tool up in the shared cache fails the test, naming the
    fixture to ask for: on a cold machine it would wait there for that build. Lookups in a
    cache root of the test's own (``root=…``) go through."""
    if any(request.node.get_closest_marker(marker) for marker in AFTER_EVERY_BUILD):
        return
    for module, name, fixture in TOOL_LOOKUPS:
        monkeypatch.setattr(module, name, _refused(getattr(module, name), fixture))


def _refused(lookup: Callable[..., Any], fixture: str) -> Callable[..., Any]:
    @functools.wraps(lookup)
    def refuse(*, root: Path | None = None, **options: Any) -> Any:
        if root is None:
            pytest.fail(
                f"{lookup.__name__} reached without the {fixture} fixture: ask for it, so the"
                " test is marked toolbinaries and runs after the tools' build (.ci/pytest-tiers)"
            )
        return lookup(root=root, **options)

    return refuse


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
def helm_binary() -> Path:
    """The pinned helm (already built or located after collection)."""
    return helm.ensure_helm(log=print)


@pytest.fixture(scope="session")
def natscli_binary() -> Path:
    """The pinned ``nats`` CLI (already built or located after collection)."""
    return binaries.ensure_natscli(log=print)


@pytest.fixture(scope="session")
def syft_binary() -> Path:
    """The pinned syft, the release's SBOM tool (already built or located after collection)."""
    return dist.syft_binary(log=print)


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
