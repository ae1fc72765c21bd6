"""The local control plane answers kubectl, enforces RBAC and serves our CRDs."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from agentrun_dev import binaries, components, controlplane, probes, procs
from agentrun_dev.kubectl import Kubectl, KubectlError

local_only = pytest.mark.skipif(
    controlplane.existing_cluster_requested(), reason="tests the local control plane"
)


def test_kubectl_lists_the_default_namespaces(kubectl: Kubectl) -> None:
    names = kubectl("get", "ns", "-o", "name").stdout.split()
    assert {"namespace/default", "namespace/kube-system"} <= set(names)


@local_only
def test_the_kubeconfig_user_is_a_cluster_admin(kubectl: Kubectl) -> None:
    review = json.loads(kubectl("auth", "whoami", "-o", "json").stdout)
    assert "system:masters" in review["status"]["userInfo"]["groups"]
    assert kubectl("auth", "can-i", "*", "*").stdout.strip() == "yes"


def test_rbac_denies_an_unbound_user(kubectl: Kubectl) -> None:
    answer = kubectl("auth", "can-i", "list", "pods", "--as=nobody", check=False)
    assert answer.stdout.strip() == "no"


def test_the_crds_are_established(kubectl: Kubectl, crds: list[str]) -> None:
    assert "customresourcedefinition.apiextensions.k8s.io/agentruns.agentrun.dev" in crds
    assert kubectl("get", "agentruns", "-A").returncode == 0


def test_each_test_gets_a_fresh_namespace(kubectl: Kubectl, test_namespace: str) -> None:
    namespace = json.loads(kubectl("get", "ns", test_namespace, "-o", "json").stdout)
    assert namespace["status"]["phase"] == "Active"
    kubectl("create", "configmap", "hello", "-n", test_namespace, "--from-literal=a=b")


def test_a_failing_kubectl_call_raises_with_its_stderr(kubectl: Kubectl) -> None:
    with pytest.raises(KubectlError, match=r"NotFound|not found"):
        kubectl("get", "configmap", "absent", "-n", "default")


@local_only
def test_the_kubeconfig_is_self_contained(control_plane: controlplane.Cluster) -> None:
    config = yaml.safe_load(control_plane.kubeconfig.read_text())
    user = config["users"][0]["user"]
    assert {"client-certificate-data", "client-key-data"} <= set(user)
    assert config["clusters"][0]["cluster"]["server"].startswith("https://127.0.0.1:")
    assert control_plane.env == {"KUBECONFIG": str(control_plane.kubeconfig)}


def _second_plane(tmp_path: Path, executables: binaries.Binaries) -> controlplane.ControlPlane:
    """A control plane of the test's own beside the session's."""
    launch = components.Launch(log_dir=tmp_path / "logs", die_with_parent=True, log=print)
    return controlplane.start_control_plane(tmp_path, executables=executables, launch=launch)


@local_only
def test_a_second_control_plane_starts_and_stops_by_pid(
    tmp_path: Path, devenv_binaries: binaries.Binaries
) -> None:
    plane = _second_plane(tmp_path, devenv_binaries)
    assert [c.name for c in plane.components] == ["etcd", "kube-apiserver"]
    assert all(c.is_alive() for c in plane.components)

    plane.stop()

    assert not any(c.is_alive() for c in plane.components)


@local_only
def test_an_apiserver_with_a_watch_open_stops_on_sigterm(
    tmp_path: Path, devenv_binaries: binaries.Binaries
) -> None:
    plane = _second_plane(tmp_path, devenv_binaries)
    watcher = subprocess.Popen(
        [str(plane.kubectl), "--kubeconfig", str(plane.kubeconfig), "get", "ns", "-w"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert watcher.stdout is not None
        assert watcher.stdout.readline()  # the watch is open (its first listing arrived)
        apiserver = plane.components[-1]  # etcd, then kube-apiserver
        started = time.monotonic()
        outcome = components.stop_component(apiserver)
        assert outcome is procs.StopOutcome.STOPPED  # not SIGKILLed after the 10 s
        assert time.monotonic() - started < controlplane.WATCH_DRAIN_SECONDS + 5
    finally:
        watcher.kill()
        watcher.wait()
        plane.stop()


@local_only
def test_an_apiserver_that_cannot_start_reports_its_log(
    tmp_path: Path, devenv_binaries: binaries.Binaries
) -> None:
    broken = binaries.Binaries(
        etcd=devenv_binaries.etcd,
        kube_apiserver=Path("/bin/false"),
        kubectl=devenv_binaries.kubectl,
    )
    launch = components.Launch(log_dir=tmp_path / "logs", die_with_parent=True, log=print)

    with pytest.raises(probes.NotReadyError, match="kube-apiserver exited with status 1"):
        controlplane.start_control_plane(tmp_path, executables=broken, launch=launch)

    etcd_log = (tmp_path / "logs" / "etcd.log").read_text()
    assert etcd_log.startswith("--- agentrun: start etcd")
