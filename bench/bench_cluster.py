"""agentrun as a cluster workload on the real single node (root only):

- the images: size unpacked and what dominates it; build time cold (into an empty cache, with
  ``--cold-image``) and cached;
- time to a Ready node with the binaries cached (control plane started for a node, then
  containerd, controllers, kubelet, kube-proxy, CoreDNS until the Node is Ready);
- ``helm install`` of the chart (its NATS, the scripted model, operator, two workers) → the
  first example run Succeeded;
- the operator's and the workers' pod memory (working set, from the kubelet's
  ``/stats/summary``: the pods' cgroups) idle and with 1,000 AgentRuns present (each ran
  one turn to its end). Targets: operator ≤ 250 MB, a worker ≤ 200 MB.

    .venv/bin/python bench/bench_cluster.py [--objects 1000] [--cold-image]
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from harness import REPO, agent_run, write_result

from agentrun_dev import binaries, components, controlplane, demo, image, kubectl, node, release

CLAIM_WAIT = 900.0


def pod_memory_mb(admin: kubectl.Kubectl, namespace: str) -> dict[str, float]:
    """Working set (MiB) of each pod in `namespace`, by pod name, from the kubelet's summary."""
    raw = admin("get", "--raw", f"/api/v1/nodes/{node.NODE_NAME}/proxy/stats/summary").stdout
    return {
        pod["podRef"]["name"]: round(pod["memory"]["workingSetBytes"] / 2**20, 1)
        for pod in json.loads(raw)["pods"]
        if pod["podRef"]["namespace"] == namespace and "memory" in pod
    }


def by_component(memory: dict[str, float], prefix: str) -> dict[str, float]:
    """The operator's and the workers' entries of `memory` (pods ``<prefix>-operator-…``, …)."""
    return {
        name: mb
        for name, mb in sorted(memory.items())
        if name.startswith((f"{prefix}-operator-", f"{prefix}-worker-"))
    }


def wait_terminal(admin: kubectl.Kubectl, count: int, *, timeout: float) -> dict[str, int]:
    """Wait until `count` AgentRuns in ``default`` have a terminal reason; how many ended
    with each reason."""
    started = time.monotonic()
    while True:
        items = json.loads(
            admin("get", "agentruns", "-n", "default", "-o", "json", timeout=120).stdout
        )["items"]
        reasons = [(i.get("status") or {}).get("terminalReason") for i in items]
        if sum(1 for r in reasons if r) >= count:
            return dict(collections.Counter(r for r in reasons if r))
        done = sum(1 for r in reasons if r)
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"only {done}/{count} runs ended within {timeout:.0f} s")
        time.sleep(2.0)


def image_figures(*, cold: bool) -> dict[str, Any]:
    """Both images' sizes, largest parts and build times."""
    figures: dict[str, Any] = {}
    if cold:
        with tempfile.TemporaryDirectory(prefix="agentrun-bench-images-") as empty:
            fresh = image.build_project_images(REPO, cache_root=Path(empty), log=print)
            figures["cold_build_seconds"] = {
                "agentrun": round(fresh.agentrun.seconds, 1),
                "nats": round(fresh.nats.seconds, 1),
            }
    images = image.build_project_images(REPO, log=print)
    for built in (images.agentrun, images.nats):
        figures[built.name] = {
            "unpacked_mb": round(image.image_size(built.archive) / 1e6, 1),
            "archive_mb": round(built.archive.stat().st_size / 1e6, 1),
            "largest_parts_mb": {
                f"/{part}": round(size / 1e6, 1)
                for part, size in image.size_report(built.archive, top=6)
            },
            "build_seconds": round(built.seconds, 1),
            "cached": built.cached,
        }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--objects", type=int, default=1000)
    parser.add_argument("--cold-image", action="store_true", help="also build into an empty cache")
    args = parser.parse_args()
    figures: dict[str, Any] = {"images": image_figures(cold=args.cold_image)}

    workdir = Path(tempfile.mkdtemp(prefix="agentrun-bench-cluster-"))
    launch = components.Launch(log_dir=workdir / "logs", die_with_parent=True)
    executables, node_executables = binaries.ensure_node_binaries(log=print)
    began = time.monotonic()
    plane = controlplane.start_control_plane(
        workdir / "cp", executables=executables, launch=launch, node=True
    )
    plane_seconds = time.monotonic() - began
    try:
        started = node.start_node(
            workdir / "node",
            cluster=plane,
            executables=node_executables,
            launch=launch,
            claim_wait=CLAIM_WAIT,
        )
        try:
            figures["ready_node_seconds"] = {
                "control_plane": round(plane_seconds, 1),
                "node_after_control_plane": round(time.monotonic() - began - plane_seconds, 1),
                "total": round(time.monotonic() - began, 1),
            }
            figures.update(install_and_run(started, workdir=workdir, objects=args.objects))
        finally:
            left = started.stop(log=print)
            if left:
                print("the node left host state behind:\n  " + "\n  ".join(left))
    finally:
        plane.stop()
    write_result("cluster", figures)


def install_and_run(started: node.Node, *, workdir: Path, objects: int) -> dict[str, Any]:
    """Import the images, install the chart, time the first run, then fill the cluster with
    `objects` AgentRuns and read the pods' memory."""
    admin = started.kubectl
    imported = time.monotonic()
    release.import_project_images(started.directory, project=REPO, log=print)
    import_seconds = time.monotonic() - imported
    examples = yaml.safe_load((REPO / "examples" / "scenarios.yaml").read_text())
    loop = yaml.safe_load((REPO / "bench" / "scenarios.yaml").read_text())
    values = release.demo_values(default_tenant=demo.TENANT_NAME)
    values["mockModel"]["scenarios"] = {"scenarios": examples["scenarios"] + loop["scenarios"]}
    installing = time.monotonic()
    installed = release.install_chart(
        admin, chart=REPO / release.CHART_DIR, values=values, home=workdir / "release", log=print
    )
    admin("apply", "-f", "-", input=yaml.safe_dump(demo.default_tenant()))
    admin("apply", "-n", "default", "-f", str(REPO / "examples" / "rectangle.yaml"))
    while True:
        status = (
            json.loads(
                admin("get", "agentrun", "rectangle", "-n", "default", "-o", "json").stdout
            ).get("status")
            or {}
        )
        if status.get("phase") == "Succeeded":
            break
        if status.get("terminalReason") or time.monotonic() - installing > 300:
            raise RuntimeError(f"rectangle did not succeed: {status}")
        time.sleep(0.2)
    first_run = time.monotonic() - installing
    time.sleep(10)  # let the pods settle after start-up
    idle = by_component(pod_memory_mb(admin, installed.namespace), installed.name)
    applying = time.monotonic()
    for first in range(0, objects, 250):
        batch = [
            agent_run(f"mem-{i}", f"BENCH memory {i}", max_steps=1)
            for i in range(first, min(first + 250, objects))
        ]
        body = {"apiVersion": "v1", "kind": "List", "items": batch}
        admin("apply", "-n", "default", "-f", "-", input=yaml.safe_dump(body), timeout=600)
    apply_seconds = time.monotonic() - applying
    reasons = wait_terminal(admin, objects + 1, timeout=1800)
    to_terminal = time.monotonic() - applying
    time.sleep(10)
    loaded = by_component(pod_memory_mb(admin, installed.namespace), installed.name)
    return {
        "import_images_seconds": round(import_seconds, 1),
        "helm_install_wait_seconds": round(installed.install_seconds, 1),
        "helm_install_to_first_run_succeeded_seconds": round(first_run, 1),
        "objects": objects,
        "kubectl_apply_seconds": round(apply_seconds, 1),
        "seconds_from_first_apply_to_all_terminal": round(to_terminal, 1),
        "terminal_reasons": reasons,
        "pod_working_set_mb_idle": idle,
        "pod_working_set_mb_with_objects": loaded,
        "targets": "operator <= 250 MB with 1,000 AgentRuns; worker <= 200 MB",
    }


if __name__ == "__main__":
    main()
