"""kubectl, driven as a user would: a callable runner, CRD installation, test namespaces.

What belongs here: kubectl invocations against a cluster named by a kubeconfig. Starting the
cluster is `controlplane`'s job.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

from agentrun_dev import console, controlplane, procs


class KubectlError(subprocess.CalledProcessError):
    """kubectl exited non-zero; `str()` includes its stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{self.stderr or ''}".rstrip()


class Kubectl:
    """Runs kubectl against one cluster: ``kubectl("get", "ns", "-o", "name").stdout``."""

    def __init__(self, binary: Path, *, kubeconfig: str, cache_dir: Path | None = None) -> None:
        """Args:
        binary: the kubectl executable.
        kubeconfig: value for ``KUBECONFIG`` (a path, or several joined by ':').
        cache_dir: kubectl's discovery cache (``KUBECACHEDIR``); None keeps ``~/.kube/cache``.
        """
        self.binary = binary
        self.env = {**os.environ, "KUBECONFIG": kubeconfig}
        if cache_dir is not None:
            self.env["KUBECACHEDIR"] = str(cache_dir)

    @classmethod
    def for_cluster(cls, cluster: controlplane.Cluster) -> Kubectl:
        """A runner for `cluster`; a local control plane gets a discovery cache of its own."""
        cache = (
            cluster.kubeconfig.parent / "kubectl-cache"
            if isinstance(cluster, controlplane.ControlPlane)
            else None
        )
        return cls(cluster.kubectl, kubeconfig=cluster.env["KUBECONFIG"], cache_dir=cache)

    def __call__(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run ``kubectl *args`` in text mode, capturing stdout and stderr.

        Args:
            args: kubectl arguments, e.g. ``("apply", "-f", "-")``.
            input: text fed to stdin.
            check: raise on a non-zero exit.
            timeout: seconds before the call is killed.

        Raises:
            KubectlError: non-zero exit and `check` (a `subprocess.CalledProcessError`).
            subprocess.TimeoutExpired: it ran longer than `timeout`.
        """
        return procs.run_captured(
            [str(self.binary), *args],
            env=self.env,
            input=input,
            timeout=timeout,
            error=KubectlError if check else None,
        )


def crd_files(crd_dir: Path) -> list[Path]:
    """The ``*.yaml`` / ``*.yml`` files of `crd_dir`, sorted by name."""
    return sorted(p for p in crd_dir.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())


def apply_crds(
    kubectl: Kubectl, crd_dir: Path, *, timeout: float = 60, log: console.Log = console.discard
) -> list[str]:
    """Apply every YAML file in `crd_dir` and wait until its CRDs are Established.

    Uses server-side apply (large CRD schemas overflow the client-side annotation).
    Returns the CRD resource names, e.g. ``["customresourcedefinition.apiextensions.k8s.io/
    agentruns.agentrun.dev"]``.

    Raises:
        FileNotFoundError: `crd_dir` has no YAML file.
        KubectlError: apply failed, or a CRD was not Established within `timeout` seconds.
    """
    files = crd_files(crd_dir) if crd_dir.is_dir() else []
    if not files:
        raise FileNotFoundError(f"no CRD YAML files in {crd_dir}")
    names: list[str] = []
    for path in files:
        log(f"applying {path}")
        result = kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            "-o",
            "name",
            "-f",
            str(path),
            timeout=timeout,
        )
        names += [n for n in result.stdout.split() if n.startswith("customresourcedefinition")]
    if names:
        kubectl(
            "wait",
            "--for=condition=Established",
            f"--timeout={int(timeout)}s",
            *names,
            timeout=timeout + 10,
        )
        log(f"established: {', '.join(n.split('/', 1)[1] for n in names)}")
    return names


def create_namespace(kubectl: Kubectl, *, prefix: str = "agentrun-test-") -> str:
    """Create a namespace with a fresh unique name (`prefix` + 8 hex digits); return the name.

    Raises KubectlError if kubectl fails.
    """
    name = f"{prefix}{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", name)
    return name


def delete_namespace(kubectl: Kubectl, name: str) -> None:
    """Request deletion without waiting (without a controller-manager it stays Terminating).

    Raises KubectlError if kubectl fails for another reason than the namespace being gone.
    """
    kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")
