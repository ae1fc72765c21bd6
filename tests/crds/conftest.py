"""Fixtures for the CRD tests. The control plane (`kubectl`, `crds`, `test_namespace`) comes
from tests/conftest.py; these add `kubectl apply -f -` of a dict and the clean-up of
cluster-scoped AgentModels and AgentTenants."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from crd_support import Apply, Kubectl


@pytest.fixture
def apply(kubectl: Kubectl) -> Apply:
    """`apply(manifest, namespace=None)`: `kubectl apply -f -`; returns the finished process
    and never raises on rejection. kubectl's default `--validate=strict` makes the API server
    reject unknown fields."""

    def run(
        manifest: dict[str, Any], namespace: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        args = ["apply", "-f", "-"]
        if namespace is not None:
            args += ["-n", namespace]
        return kubectl(*args, input=yaml.safe_dump(manifest), check=False)

    return run


@pytest.fixture
def agentmodel_name(kubectl: Kubectl) -> Iterator[str]:
    """A unique name for a cluster-scoped AgentModel, deleted after the test."""
    name = f"test-model-{uuid.uuid4().hex[:8]}"
    yield name
    kubectl("delete", "agentmodel", name, "--ignore-not-found", check=False)


@pytest.fixture
def agenttenant_name(kubectl: Kubectl) -> Iterator[str]:
    """A unique name for a cluster-scoped AgentTenant, deleted after the test."""
    name = f"test-tenant-{uuid.uuid4().hex[:8]}"
    yield name
    kubectl("delete", "agenttenant", name, "--ignore-not-found", check=False)
