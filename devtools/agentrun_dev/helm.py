"""helm, built once per machine like the control plane, and a runner for the chart.

The binary, in order of preference:

1. ``HELM_BINARY``: the path of a helm v3 executable.
2. The per-machine cache, ``<user cache dir>/agentrun/helm/<version>/bin/helm``.
3. A build from the Go module proxy into that cache (see `gobuild.build_helm`), once per
   machine, under the same kind of file lock as the control-plane binaries.

helm is pinned at `HELM_VERSION`. `Helm` runs it with a configuration, cache and data home of
its own (no ``~/.config/helm`` or repository index is read or written) against one kubeconfig,
or none for offline rendering.

What belongs here: locating, caching and running helm. The chart itself lives in
``charts/agentrun``; what it renders is tested in the suite.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from agentrun_dev import binaries, console, gobuild, procs

HELM_VERSION = "v3.22.0"
"""The ``helm.sh/helm/v3`` module version built and cached."""


class HelmError(subprocess.CalledProcessError):
    """helm exited non-zero; `str()` includes its stderr (where helm names the bad field)."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{self.stderr or ''}".rstrip()


def cache_binary(root: Path | None = None) -> Path:
    """Where the pinned build is cached, under `root` (default `binaries.cache_root()`)."""
    base = binaries.cache_root() if root is None else root
    return base / "helm" / HELM_VERSION / "bin" / "helm"


def ensure_helm(*, root: Path | None = None, log: console.Log = console.log_to_stderr) -> Path:
    """The helm executable from ``HELM_BINARY`` or the cache, built if needed.

    Args:
        root: cache root (default `binaries.cache_root()`); tests pass a temporary one.
        log: receives progress lines (a cold build takes a few minutes; Go's output is
            streamed).

    Raises:
        binaries.BinariesError: ``HELM_BINARY`` is set but is not an executable.
        gobuild.BuildError: no suitable Go, or the build failed.
    """
    override = os.environ.get("HELM_BINARY", "").strip()
    if override:
        if not binaries.is_executable(Path(override)):
            raise binaries.BinariesError(
                f"HELM_BINARY={override} is not an executable: point it at helm v3, or unset"
                " it to build helm from source"
            )
        return Path(override)
    binary = cache_binary(root)
    if not binaries.is_executable(binary):
        with binaries.build_lock(binary.parent.parent, what=f"helm {HELM_VERSION}", log=log):
            if not binaries.is_executable(binary):  # another process may have built it
                log(f"building helm {HELM_VERSION} from the Go module proxy into {binary}")
                started = time.monotonic()
                gobuild.build_helm(binary, module_version=HELM_VERSION, log=log)
                minutes, seconds = divmod(int(time.monotonic() - started), 60)
                log(f"built helm in {minutes}m{seconds:02d}s")
    return binary


class Helm:
    """Runs helm with private homes: ``Helm(path, home=tmp)("lint", "--strict", chart)``."""

    def __init__(self, binary: Path, *, home: Path, kubeconfig: str | None = None) -> None:
        """Args:
        binary: the helm executable (see `ensure_helm`).
        home: a directory for helm's config, cache and data homes (created if needed).
        kubeconfig: value for ``KUBECONFIG``; None renders offline only (``template``,
            ``lint``), with no cluster configured at all.
        """
        self.binary = binary
        home.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("HELM_")}
        env.pop("KUBECONFIG", None)
        for name in ("CONFIG", "CACHE", "DATA"):
            env[f"HELM_{name}_HOME"] = str(home / name.lower())
        env["KUBECONFIG"] = kubeconfig if kubeconfig is not None else str(home / "no-cluster")
        self.env = env

    def __call__(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run ``helm *args`` in text mode, capturing stdout and stderr.

        Raises:
            HelmError: non-zero exit and `check`.
            subprocess.TimeoutExpired: it ran longer than `timeout` seconds.
        """
        return procs.run_captured(
            [str(self.binary), *args],
            env=self.env,
            input=input,
            timeout=timeout,
            error=HelmError if check else None,
        )

    def template(
        self,
        chart: Path,
        *,
        namespace: str = "agentrun",
        values: Mapping[str, str] | None = None,
        extra: Sequence[str] = (),
    ) -> str:
        """``helm template agentrun <chart> --namespace <namespace> --set k=v …``: the manifests.

        `values` are ``--set`` pairs (``{"nats.install": "true"}``); `extra` more arguments
        (``--kube-version``, ``--api-versions``, ``-f file``). Raises HelmError like `__call__`.
        """
        sets = [arg for key, value in (values or {}).items() for arg in ("--set", f"{key}={value}")]
        args = ["template", "agentrun", str(chart), "--namespace", namespace, *sets, *extra]
        return self(*args).stdout
