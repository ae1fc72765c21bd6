"""Control-plane binaries come from KUBEBUILDER_ASSETS, the cache, or a build from source.

The full build runs only with ``AGENTRUN_TEST_GO_BUILD=1`` (minutes on a warm Go cache, much
longer cold); it builds into a temporary cache root, as a fresh machine would.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentrun_dev import binaries, gobuild

K8S_GO_MOD = """\
module k8s.io/kubernetes

require (
\tk8s.io/api v0.0.0
\tk8s.io/apiserver v0.0.0
\tk8s.io/utils v0.0.0-20250604170112-4c0f3b243397
\tsigs.k8s.io/yaml v1.4.0
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
)
"""


def test_staging_modules_at_v0_0_0_are_replaced_but_pseudo_versions_are_not() -> None:
    replaces = gobuild.staging_replaces(K8S_GO_MOD, k8s_version="v1.34.4")

    assert replaces == [
        "replace k8s.io/api => k8s.io/api v0.34.4",
        "replace k8s.io/apiserver => k8s.io/apiserver v0.34.4",
    ]


def test_kubernetes_binaries_get_their_version_stamped_at_link_time() -> None:
    flags = gobuild.version_ldflags("v1.34.4").split()

    assert "k8s.io/component-base/version.gitVersion=v1.34.4" in flags
    assert "k8s.io/client-go/pkg/version.gitMinor=34" in flags
    assert flags.count("-X") == len(flags) // 2


def test_the_etcd_pin_is_read_from_build_dependencies_yaml(tmp_path: Path) -> None:
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "dependencies.yaml").write_text(
        textwrap.dedent(
            """
            dependencies:
              - name: "golang: upstream version"
                version: 1.24.9
              - name: "etcd"
                version: 3.6.5
              - name: "etcd-image"
                version: 3.6.5-0
            """
        )
    )
    assert gobuild.etcd_version_of(tmp_path) == "v3.6.5"


def test_a_tree_without_an_etcd_pin_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "dependencies.yaml").write_text("dependencies: []\n")
    with pytest.raises(gobuild.BuildError, match="no 'etcd' dependency"):
        gobuild.etcd_version_of(tmp_path)


def test_without_go_the_error_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(gobuild.BuildError, match=r"go not found on PATH: install Go ≥1\.24"):
        gobuild.find_go()


def test_the_cache_is_versioned_under_the_user_cache_dir(tmp_path: Path) -> None:
    assert binaries.cache_bin_dir(tmp_path) == (
        tmp_path / "controlplane" / "k8s-v1.34.4-etcd-v3.6.5" / "bin"
    )


@pytest.mark.parametrize("kubectl_in_assets", [True, False], ids=["kubectl-in-assets", "on-path"])
def test_kubebuilder_assets_are_used_as_they_are(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    devenv_binaries: binaries.Binaries,
    kubectl_in_assets: bool,
) -> None:
    assets, on_path = tmp_path / "assets", tmp_path / "path"
    assets.mkdir()
    on_path.mkdir()
    (assets / "etcd").symlink_to(devenv_binaries.etcd)
    (assets / "kube-apiserver").symlink_to(devenv_binaries.kube_apiserver)
    kubectl_dir = assets if kubectl_in_assets else on_path
    (kubectl_dir / "kubectl").symlink_to(devenv_binaries.kubectl)
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(assets))
    monkeypatch.setenv("PATH", str(on_path))

    found = binaries.ensure_binaries(root=tmp_path / "empty-cache", log=lambda _: None)

    assert found == binaries.Binaries(
        etcd=assets / "etcd",
        kube_apiserver=assets / "kube-apiserver",
        kubectl=kubectl_dir / "kubectl",
    )


def test_incomplete_kubebuilder_assets_are_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path))
    with pytest.raises(binaries.BinariesError, match="lacks kube-apiserver and etcd"):
        binaries.ensure_binaries(log=lambda _: None)


BUILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from agentrun_dev import binaries
    def show(line): print(line, flush=True)
    found = binaries.ensure_binaries(root=Path(sys.argv[1]), log=show)
    print("RESULT", found.etcd, found.kube_apiserver, found.kubectl)
    """
)


@pytest.mark.binaries  # after the session's build: Go's cache warm, not compiling beside it
@pytest.mark.timeout(7200)  # with Go's build cache warm (the session built once) ~30 s
def test_two_concurrent_callers_share_one_build_into_an_empty_cache(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "KUBEBUILDER_ASSETS"}
    callers = [
        subprocess.Popen(
            [sys.executable, "-c", BUILD, str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [caller.communicate(timeout=7000)[0] for caller in callers]

    assert [caller.returncode for caller in callers] == [0, 0], outputs
    assert sum("[4/4] building kube-apiserver, kubectl" in out for out in outputs) == 1, outputs
    assert sum("another process is building" in out for out in outputs) <= 1
    bin_dir = binaries.cache_bin_dir(tmp_path)
    assert sorted(p.name for p in bin_dir.iterdir()) == ["etcd", "kube-apiserver", "kubectl"]
    version = subprocess.run(
        [str(bin_dir / "kube-apiserver"), "--version"], capture_output=True, text=True, check=True
    )
    assert version.stdout.strip() == "Kubernetes v1.34.4"
    etcd = subprocess.run(
        [str(bin_dir / "etcd"), "--version"], capture_output=True, text=True, check=True
    )
    assert "etcd Version: 3.6.5" in etcd.stdout


def test_node_binaries_come_from_the_cache_without_a_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir, coredns_dir = binaries.cache_bin_dir(tmp_path), binaries.coredns_bin_dir(tmp_path)
    router_dir = binaries.kube_router_bin_dir(tmp_path)
    for directory, names in ((bin_dir, binaries.NAMES + binaries.NODE_NAMES),
                             (coredns_dir, ("coredns",)),
                             (router_dir, ("kube-router",))):  # fmt: skip
        directory.mkdir(parents=True)
        for name in names:
            (directory / name).write_text("#!/bin/sh\n")
            (directory / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "no-go-here"))  # a build would fail: no go

    control_plane, node = binaries.ensure_node_binaries(root=tmp_path, log=lambda _: None)

    assert control_plane.kube_apiserver == bin_dir / "kube-apiserver"
    assert node == binaries.NodeBinaries(
        kube_controller_manager=bin_dir / "kube-controller-manager",
        kube_scheduler=bin_dir / "kube-scheduler",
        kubelet=bin_dir / "kubelet",
        kube_proxy=bin_dir / "kube-proxy",
        coredns=tmp_path / "coredns" / f"coredns-{binaries.COREDNS_VERSION}" / "bin" / "coredns",
        kube_router=tmp_path
        / "kube-router"
        / f"kube-router-{binaries.KUBE_ROUTER_VERSION}"
        / "bin"
        / "kube-router",
    )


def test_a_missing_node_binary_is_built_and_without_go_the_error_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "no-go-here"))
    with pytest.raises(gobuild.BuildError, match="go not found on PATH"):
        binaries.ensure_node_binaries(root=tmp_path, log=lambda _: None)


@pytest.mark.nodebinaries  # after the node's build, not waiting for it
def test_the_node_s_network_policy_enforcer_is_the_pinned_kube_router() -> None:
    """kube-router built from the Go module proxy (or cached), stamped with its version."""
    _, node = binaries.ensure_node_binaries(log=print)
    version = subprocess.run(
        [str(node.kube_router), "--version"], capture_output=True, text=True, check=True
    )
    assert f"version {binaries.KUBE_ROUTER_VERSION}," in version.stdout + version.stderr
    assert node.kube_router == binaries.kube_router_bin_dir() / "kube-router"


def test_the_nats_cli_is_the_pinned_natscli_built_static(natscli_binary: Path) -> None:
    """natscli built from the Go module proxy (or cached), its module hash checked, stamped
    with its version, linked statically (it runs in the FROM-scratch NATS image)."""
    nats = natscli_binary
    assert nats == binaries.natscli_bin_dir() / "nats"
    assert binaries.NATSCLI_VERSION == "v0.5.0"
    version = subprocess.run([str(nats), "--version"], capture_output=True, text=True, check=True)
    assert (version.stdout + version.stderr).strip() == binaries.NATSCLI_VERSION
    assert nats.read_bytes()[:4] == b"\x7fELF"
    file_type = subprocess.run(["file", str(nats)], capture_output=True, text=True, check=False)
    if file_type.returncode == 0:
        assert "statically linked" in file_type.stdout, file_type.stdout


def test_a_natscli_module_with_another_hash_is_refused(tmp_path: Path) -> None:
    """The module proxy serving other content than the pinned hash fails the build before
    anything is compiled or cached."""
    out = tmp_path / "bin" / "nats"
    with pytest.raises(gobuild.BuildError, match="not the pinned"):
        gobuild.build_natscli(
            out,
            module_version=binaries.NATSCLI_VERSION,
            module_sum="h1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
            log=lambda _: None,
        )
    assert not out.exists()


def test_without_go_the_nats_cli_error_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "no-go-here"))
    with pytest.raises(gobuild.BuildError, match="go not found on PATH"):
        binaries.ensure_natscli(root=tmp_path, log=lambda _: None)
