"""Manifest builders and paths shared by the CRD tests (imported by name; pytest puts this
folder on sys.path)."""

from __future__ import annotations

import copy
import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = REPO_ROOT / "crds"
CHART_DIR = REPO_ROOT / "charts" / "agentrun"
AGENTRUN_CRD = CRD_DIR / "agentrun.dev_agentruns.yaml"
AGENTMODEL_CRD = CRD_DIR / "agentrun.dev_agentmodels.yaml"
AGENTTENANT_CRD = CRD_DIR / "agentrun.dev_agenttenants.yaml"
AGENTTOOLSERVER_CRD = CRD_DIR / "agentrun.dev_agenttoolservers.yaml"
AGENT_CRD = CRD_DIR / "agentrun.dev_agents.yaml"
AGENTEVAL_CRD = CRD_DIR / "agentrun.dev_agentevals.yaml"
CRON_CRD = CRD_DIR / "agentrun.dev_cronagentruns.yaml"

Manifest = dict[str, Any]
Kubectl = Callable[..., subprocess.CompletedProcess[str]]
"""The `kubectl(*args, input=None, check=True, timeout=60)` fixture of tests/conftest.py."""
Apply = Callable[..., subprocess.CompletedProcess[str]]
"""The `apply(manifest, namespace=None)` fixture of tests/crds/conftest.py."""


def make_agentrun(name: str = "run", **spec: Any) -> Manifest:
    """A valid AgentRun; keyword arguments replace top-level spec fields."""
    manifest: Manifest = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {"model": "mock", "goal": "add 2 and 3", "tools": ["calculate", "sleep"]},
    }
    manifest["spec"].update(spec)
    return manifest


def make_agentmodel(name: str = "model", **spec: Any) -> Manifest:
    """A valid AgentModel; keyword arguments replace top-level spec fields."""
    manifest: Manifest = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentModel",
        "metadata": {"name": name},
        "spec": {"baseURL": "http://mockllm.agentrun-system.svc:8000/v1", "model": "scripted"},
    }
    manifest["spec"].update(spec)
    return manifest


def make_agenttenant(name: str = "tenant", **spec: Any) -> Manifest:
    """A valid AgentTenant bound to one namespace; keyword arguments replace top-level spec
    fields."""
    manifest: Manifest = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentTenant",
        "metadata": {"name": name},
        "spec": {"namespaces": ["team-a"]},
    }
    manifest["spec"].update(spec)
    return manifest


def without(manifest: Manifest, dotted_path: str) -> Manifest:
    """A copy of `manifest` with the field at `dotted_path` (e.g. "spec.goal") removed."""
    result = copy.deepcopy(manifest)
    *parents, leaf = dotted_path.split(".")
    node = result
    for key in parents:
        node = node[key]
    del node[leaf]
    return result


def get_json(kubectl: Kubectl, *args: str) -> dict[str, Any]:
    """`kubectl get ARGS -o json`, parsed."""
    result: dict[str, Any] = json.loads(kubectl("get", *args, "-o", "json").stdout)
    return result


def explain(kubectl: Kubectl, field: str, *, attempts: int = 30) -> str:
    """`kubectl explain FIELD`, retried while the new CRD's OpenAPI is still being published."""
    for _ in range(attempts):
        result = kubectl("explain", field, check=False)
        if result.returncode == 0:
            return result.stdout
        time.sleep(1)
    raise AssertionError(f"kubectl explain {field} kept failing: {result.stderr}")
