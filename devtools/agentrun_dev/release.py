"""The Helm chart installed on the dev node, as a platform team would install it.

`install_chart` builds (or reuses) the project's images (see `image.build_project_images`),
imports them into the node's containerd, creates the release namespace under Pod Security
``restricted`` and runs ``helm install --wait`` of ``charts/agentrun``; `demo_values` are the
values ``agentrun dev demo --chart`` installs with: the chart's own NATS (JetStream on an
emptyDir: the node has no StorageClass), the scripted model as a pod with its ``mock``
AgentModel, and the ``default`` AgentTenant as the operator's default tenant.

What belongs here: the steps from a Ready node to a Ready release. Starting the node is
`node`'s job, running helm `helm`'s, building the images `image`'s.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from agentrun_dev import console, containerd, helm, image, kubectl

RELEASE_NAME = "agentrun"
RELEASE_NAMESPACE = "agentrun"
CHART_DIR = Path("charts") / "agentrun"
"""The chart, relative to the project checkout."""
POD_SECURITY_LABELS = (
    "pod-security.kubernetes.io/enforce=restricted",
    "pod-security.kubernetes.io/enforce-version=latest",
)


@dataclasses.dataclass(frozen=True, slots=True)
class Release:
    """An installed release of the chart."""

    name: str
    namespace: str
    chart: Path
    helm: helm.Helm
    """helm bound to the release's cluster (private homes)."""
    install_seconds: float
    """Wall time of ``helm install --wait`` (pods Ready), in seconds."""


def demo_values(*, default_tenant: str, worker_replicas: int = 2) -> dict[str, Any]:
    """Chart values for a self-contained install on the dev node.

    The chart's NATS StatefulSet (no persistence), the scripted model (the chart's copy of
    the example scenarios) and its ``mock`` AgentModel, `worker_replicas` workers, and
    `default_tenant` charged for runs in namespaces no AgentTenant binds.
    """
    return {
        "nats": {"install": {"enabled": True, "persistence": {"enabled": False}}},
        "mockModel": {"enabled": True},
        "operator": {"defaultTenant": default_tenant},
        "worker": {"replicas": worker_replicas},
    }


def project_chart(project: Path) -> Path:
    """``charts/agentrun`` of the checkout at `project`. Raises FileNotFoundError if absent."""
    chart = project / CHART_DIR
    if not (chart / "Chart.yaml").is_file():
        raise FileNotFoundError(f"no chart at {chart}: run from the repository root")
    return chart


def import_project_images(
    node_dir: Path, *, project: Path, log: console.Log = console.log_to_stderr
) -> image.ProjectImages:
    """Build (or reuse) the agentrun and NATS images of `project` and import both into the
    containerd of the node whose state directory is `node_dir`.

    Raises image.ImageError (build) or containerd.ContainerdError (import).
    """
    images = image.build_project_images(project, log=log)
    for built in (images.agentrun, images.nats):
        containerd.import_image(node_dir, built.archive, log=log)
    return images


def install_chart(
    admin: kubectl.Kubectl,
    *,
    chart: Path,
    values: Mapping[str, Any],
    home: Path,
    namespace: str = RELEASE_NAMESPACE,
    log: console.Log = console.log_to_stderr,
) -> Release:
    """``helm install <RELEASE_NAME> <chart> -n <namespace> -f values --wait`` (5 minutes).

    The namespace is created (if missing) and labelled for Pod Security ``restricted``
    first; the images must already be on the node (`import_project_images`). `home` holds
    helm's private homes and the values file.

    Raises helm.HelmError (with helm's stderr: the field a bad value names, or what was not
    Ready) or kubectl.KubectlError.
    """
    existing = admin("get", "namespace", namespace, "-o", "name", check=False)
    if existing.returncode != 0:
        admin("create", "namespace", namespace)
    admin("label", "--overwrite", "namespace", namespace, *POD_SECURITY_LABELS)
    home.mkdir(parents=True, exist_ok=True)
    values_file = home / "values.yaml"
    values_file.write_text(yaml.safe_dump(dict(values), sort_keys=False))
    runner = helm.Helm(
        helm.ensure_helm(log=log), home=home / "helm", kubeconfig=admin.env["KUBECONFIG"]
    )
    log(f"helm install {RELEASE_NAME} {chart} -n {namespace} -f {values_file} --wait")
    started = time.monotonic()
    runner(
        "install", RELEASE_NAME, str(chart), "-n", namespace, "-f", str(values_file),
        "--wait", "--timeout", "5m", timeout=330,
    )  # fmt: skip
    seconds = time.monotonic() - started
    log(f"release {RELEASE_NAME} Ready in {seconds:.1f} s")
    return Release(RELEASE_NAME, namespace, chart, runner, seconds)
