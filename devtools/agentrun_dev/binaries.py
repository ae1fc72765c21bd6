"""Where the control-plane binaries (kube-apiserver, etcd, kubectl) and the node's binaries
(kube-controller-manager, kube-scheduler, kubelet, kube-proxy, coredns, kube-router) come from.

In order of preference:

1. ``KUBEBUILDER_ASSETS``: a directory holding kube-apiserver and etcd (and kubectl, else
   kubectl is looked up on PATH, then in the cache).
2. The per-machine cache, ``<user cache dir>/agentrun/controlplane/k8s-<v>-etcd-<v>/bin/``.
3. A build from the Go module proxy into that cache (see `gobuild`), once per machine: a file
   lock makes concurrent callers wait for a single build.

Kubernetes is pinned at `K8S_VERSION` and etcd at `ETCD_VERSION`; the build checks that the
etcd pin matches what that kubernetes release declares. The node's kubernetes binaries come
from the same cache directory and the same pinned module (`ensure_node_binaries` builds every
missing kubernetes command in one ``go build``); CoreDNS is pinned at `COREDNS_VERSION`, the
release kubernetes' ``build/dependencies.yaml`` names, and cached beside them; the
NetworkPolicy enforcer kube-router is pinned at `KUBE_ROUTER_VERSION` and cached the same way.

What belongs here: locating, caching and locking; not the build recipe, not running anything.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import platformdirs

from agentrun_dev import console, gobuild

K8S_VERSION = "v1.34.4"
ETCD_VERSION = "v3.6.5"
COREDNS_VERSION = "v1.12.1"
KUBE_ROUTER_VERSION = "v2.1.0"
"""kube-router, run on the node with only its NetworkPolicy controller (see `node`)."""
NATSCLI_VERSION = "v0.5.0"
"""The ``nats`` CLI (github.com/nats-io/natscli), shipped in the NATS image for runbooks and
backups (``nats stream backup``/``restore``); v0.5.1 is not taken."""
NATSCLI_SUM = "h1:3DTd7Lt3GmaOxrB9V1upxE28JSu9bqa3QmsvadOsAkM="
"""The natscli module's content hash at `NATSCLI_VERSION` (go.sum's ``h1:`` form): a module
proxy serving anything else fails the build."""
NAMES = ("etcd", "kube-apiserver", "kubectl")
NODE_NAMES = ("kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy")


class BinariesError(RuntimeError):
    """Binaries are not available and cannot be built; the message says what to do."""


@dataclasses.dataclass(frozen=True, slots=True)
class Binaries:
    """Absolute paths of the three executables."""

    etcd: Path
    kube_apiserver: Path
    kubectl: Path


@dataclasses.dataclass(frozen=True, slots=True)
class NodeBinaries:
    """Absolute paths of what a single-node cluster runs besides the control plane."""

    kube_controller_manager: Path
    kube_scheduler: Path
    kubelet: Path
    kube_proxy: Path
    coredns: Path
    kube_router: Path
    """The NetworkPolicy enforcer."""


def cache_root() -> Path:
    """The per-user cache root, ``platformdirs.user_cache_dir("agentrun")``."""
    return Path(platformdirs.user_cache_dir("agentrun"))


def cache_bin_dir(root: Path | None = None) -> Path:
    """The cache directory of the pinned binaries, under `root` (default `cache_root()`)."""
    base = cache_root() if root is None else root
    return base / "controlplane" / f"k8s-{K8S_VERSION}-etcd-{ETCD_VERSION}" / "bin"


def ensure_binaries(
    *, root: Path | None = None, log: console.Log = console.log_to_stderr
) -> Binaries:
    """The binaries from ``KUBEBUILDER_ASSETS`` or the cache, building them if needed.

    Args:
        root: cache root (default `cache_root()`); tests pass a temporary one.
        log: receives progress lines (a build takes minutes cold; Go's output is streamed).

    Raises:
        BinariesError: ``KUBEBUILDER_ASSETS`` lacks a binary, or no kubectl anywhere.
        gobuild.BuildError: no suitable Go, or the build failed.
    """
    assets = _assets_dir()
    if assets is not None:
        return _from_assets(assets, root=root)
    bin_dir = cache_bin_dir(root)
    missing = missing_in(bin_dir)
    if missing:
        with build_lock(bin_dir.parent, what="the control-plane binaries", log=log):
            missing = missing_in(bin_dir)  # another process may have built them meanwhile
            if missing:
                _build(bin_dir, names=missing, log=log)
    return Binaries(
        etcd=bin_dir / "etcd",
        kube_apiserver=bin_dir / "kube-apiserver",
        kubectl=bin_dir / "kubectl",
    )


def ensure_node_binaries(
    *, root: Path | None = None, log: console.Log = console.log_to_stderr
) -> tuple[Binaries, NodeBinaries]:
    """The control-plane and node binaries from the cache, building what is missing.

    Every missing kubernetes command (control plane and node) is built by one ``go build``
    under the control-plane build lock; coredns under its own lock. ``KUBEBUILDER_ASSETS`` is
    not consulted: the node's binaries must match the cached kube-apiserver's version.
    kube-router likewise under its own lock.

    Raises:
        gobuild.BuildError: no suitable Go, or a build failed.
    """
    bin_dir = cache_bin_dir(root)
    if missing_in(bin_dir, (*NAMES, *NODE_NAMES)):
        with build_lock(bin_dir.parent, what="the kubernetes binaries", log=log):
            missing = missing_in(bin_dir, (*NAMES, *NODE_NAMES))
            if missing:
                _build(bin_dir, names=missing, log=log)
    coredns = coredns_bin_dir(root) / "coredns"
    _ensure_one(
        coredns,
        version=COREDNS_VERSION,
        build=lambda: gobuild.build_coredns(
            coredns.parent, module_version=COREDNS_VERSION, log=log
        ),
        log=log,
    )
    kube_router = kube_router_bin_dir(root) / "kube-router"
    _ensure_one(
        kube_router,
        version=KUBE_ROUTER_VERSION,
        build=lambda: gobuild.build_kube_router(
            kube_router, module_version=KUBE_ROUTER_VERSION, log=log
        ),
        log=log,
    )
    control_plane = Binaries(
        etcd=bin_dir / "etcd",
        kube_apiserver=bin_dir / "kube-apiserver",
        kubectl=bin_dir / "kubectl",
    )
    node = NodeBinaries(
        kube_controller_manager=bin_dir / "kube-controller-manager",
        kube_scheduler=bin_dir / "kube-scheduler",
        kubelet=bin_dir / "kubelet",
        kube_proxy=bin_dir / "kube-proxy",
        coredns=coredns,
        kube_router=kube_router,
    )
    return control_plane, node


def _ensure_one(binary: Path, *, version: str, build: Callable[[], None], log: console.Log) -> None:
    """`build` `binary` (at `version`) unless it is there, under the lock of its version's
    cache directory (``<name>/<name>-<version>/``), checking again once the lock is held."""
    if is_executable(binary):
        return
    with build_lock(binary.parent.parent, what=binary.name, log=log):
        if is_executable(binary):
            return
        log(f"building {binary.name} {version} from the Go module proxy into {binary.parent}")
        started = time.monotonic()
        build()
        minutes, seconds = divmod(int(time.monotonic() - started), 60)
        log(f"built {binary.name} in {minutes}m{seconds:02d}s")


def _pinned_bin_dir(name: str, version: str, root: Path | None) -> Path:
    base = cache_root() if root is None else root
    return base / name / f"{name}-{version}" / "bin"


def coredns_bin_dir(root: Path | None = None) -> Path:
    """The cache directory of the pinned coredns, under `root` (default `cache_root()`)."""
    return _pinned_bin_dir("coredns", COREDNS_VERSION, root)


def kube_router_bin_dir(root: Path | None = None) -> Path:
    """The cache directory of the pinned kube-router, under `root` (default `cache_root()`)."""
    return _pinned_bin_dir("kube-router", KUBE_ROUTER_VERSION, root)


def natscli_bin_dir(root: Path | None = None) -> Path:
    """The cache directory of the pinned ``nats`` CLI, under `root` (default `cache_root()`)."""
    return _pinned_bin_dir("natscli", NATSCLI_VERSION, root)


def ensure_natscli(*, root: Path | None = None, log: console.Log = console.log_to_stderr) -> Path:
    """The ``nats`` CLI at `NATSCLI_VERSION` from the cache, built from the Go module proxy
    (its hash checked against `NATSCLI_SUM`) once per machine under a lock.

    Raises gobuild.BuildError: no suitable Go, a hash mismatch, or the build failed.
    """
    binary = natscli_bin_dir(root) / "nats"
    _ensure_one(
        binary,
        version=NATSCLI_VERSION,
        build=lambda: gobuild.build_natscli(
            binary, module_version=NATSCLI_VERSION, module_sum=NATSCLI_SUM, log=log
        ),
        log=log,
    )
    return binary


def find_kubectl(*, root: Path | None = None, log: console.Log = console.log_to_stderr) -> Path:
    """A kubectl for an existing cluster: ``KUBEBUILDER_ASSETS``, PATH, cache, else built.

    Raises like `ensure_binaries` when it has to build.
    """
    found = _kubectl_without_build(_assets_dir(), root=root)
    if found is not None:
        return found
    log("kubectl not found in KUBEBUILDER_ASSETS, on PATH or in the cache: building it")
    return ensure_binaries(root=root, log=log).kubectl


def _assets_dir() -> Path | None:
    value = os.environ.get("KUBEBUILDER_ASSETS", "").strip()
    return Path(value) if value else None


def _from_assets(assets: Path, *, root: Path | None) -> Binaries:
    missing = missing_in(assets, ("kube-apiserver", "etcd"))
    if missing:
        raise BinariesError(
            f"KUBEBUILDER_ASSETS={assets} lacks {' and '.join(missing)}: point it at a directory"
            " holding kube-apiserver and etcd, or unset it to build them from source"
        )
    kubectl = _kubectl_without_build(assets, root=root)
    if kubectl is None:
        raise BinariesError(
            f"kubectl is neither in KUBEBUILDER_ASSETS={assets}, on PATH nor in"
            f" {cache_bin_dir(root)}: install kubectl or unset KUBEBUILDER_ASSETS to build it"
        )
    return Binaries(etcd=assets / "etcd", kube_apiserver=assets / "kube-apiserver", kubectl=kubectl)


def _kubectl_without_build(assets: Path | None, *, root: Path | None) -> Path | None:
    if assets is not None and is_executable(assets / "kubectl"):
        return assets / "kubectl"
    on_path = shutil.which("kubectl")
    if on_path is not None:
        return Path(on_path)
    cached = cache_bin_dir(root) / "kubectl"
    return cached if is_executable(cached) else None


def missing_in(bin_dir: Path, names: Sequence[str] = NAMES) -> list[str]:
    """Which of ``names`` are not executables in ``bin_dir`` (also used for Prometheus)."""
    return [n for n in names if not is_executable(bin_dir / n)]


def is_executable(path: Path) -> bool:
    """Whether ``path`` is a file we may execute."""
    return path.is_file() and os.access(path, os.X_OK)


def _build(bin_dir: Path, *, names: list[str], log: console.Log) -> None:
    log(
        f"building {', '.join(names)} (kubernetes {K8S_VERSION}, etcd {ETCD_VERSION}) from the"
        f" Go module proxy into {bin_dir}; this takes a while once per machine"
    )
    started = time.monotonic()
    gobuild.build_binaries(
        bin_dir, k8s_version=K8S_VERSION, etcd_version=ETCD_VERSION, names=names, log=log
    )
    minutes, seconds = divmod(int(time.monotonic() - started), 60)
    log(f"built {', '.join(names)} in {minutes}m{seconds:02d}s")


@contextlib.contextmanager
def build_lock(directory: Path, *, what: str, log: console.Log) -> Iterator[None]:
    """Hold an exclusive flock on ``directory/build.lock`` while building ``what``; log if we
    have to wait for another process's build."""
    directory.mkdir(parents=True, exist_ok=True)
    lock_path = directory / "build.lock"
    with lock_path.open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"another process is building {what} ({lock_path}); waiting")
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
