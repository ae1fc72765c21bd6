"""The runs of a CronAgentRun are collected with it by the real garbage collector (the node's
kube-controller-manager; the suite's plain API server has none): the ownerReference the
operator writes (``cronspec.run_manifest``) is one the collector follows, in the background
and in the foreground (``blockOwnerDeletion``: the CronAgentRun goes only after its runs)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun.operator.schedules import spec as cronspec
from agentrun_dev.kubectl import Kubectl, apply_crds

pytestmark = [pytest.mark.node, pytest.mark.timeout(600)]

CRD_DIR = Path(__file__).resolve().parents[2] / "crds"
GC_WAIT = 120.0
"""Seconds for the collector to notice a new CRD (it re-reads discovery every 30 s) and act."""


def cron(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "CronAgentRun",
        "metadata": {"name": name},
        "spec": {
            "schedule": "@daily",
            "suspend": True,
            "runTemplate": {"spec": {"model": "mock", "goal": "collected with its schedule"}},
        },
    }


def exists(kubectl: Kubectl, kind: str, name: str, namespace: str) -> bool:
    found = kubectl("get", kind, name, "-n", namespace, "--ignore-not-found", "-o", "name")
    return bool(found.stdout.strip())


def create_owned_run(kubectl: Kubectl, namespace: str, name: str, *, at: float) -> str:
    """Apply CronAgentRun ``name`` and create the run the operator would for ``at``."""
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(cron(name)))
    live = json.loads(kubectl("get", "cronagentrun", name, "-n", namespace, "-o", "json").stdout)
    manifest = cronspec.run_manifest(live, cronspec.check(live["spec"]), scheduled=at)
    kubectl("create", "-f", "-", input=json.dumps(manifest))
    return str(manifest["metadata"]["name"])


def test_deleting_a_cronagentrun_collects_its_runs(
    node_kubectl: Kubectl, node_namespace: str
) -> None:
    apply_crds(node_kubectl, CRD_DIR)
    ns = node_namespace
    background = create_owned_run(node_kubectl, ns, "nightly", at=1796032800)
    foreground = create_owned_run(node_kubectl, ns, "hourly", at=1796032800)
    node_kubectl("delete", "cronagentrun", "nightly", "-n", ns, "--wait=false")
    node_kubectl(
        "delete", "cronagentrun", "hourly", "-n", ns, "--cascade=foreground", "--wait=false"
    )
    end = time.monotonic() + GC_WAIT
    while time.monotonic() < end:
        # the owner is read before its run: "owner gone, then run still there" means the owner
        # went first, which foreground deletion forbids; the reverse order of reads would race
        # the collector removing both between them
        owner_gone = not exists(node_kubectl, "cronagentrun", "hourly", ns)
        left = [n for n in (background, foreground) if exists(node_kubectl, "agentrun", n, ns)]
        assert not (owner_gone and foreground in left), "the owner went before its run"
        if not left:
            break
        time.sleep(1)
    assert left == []
    deadline = time.monotonic() + 30
    while exists(node_kubectl, "cronagentrun", "hourly", ns) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not exists(node_kubectl, "cronagentrun", "hourly", ns)
