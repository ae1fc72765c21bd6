"""Fixtures for the chart tests: an offline helm with no cluster configured (on the root
conftest's `helm_binary`, built once per machine right after collection), and a namespace
under Pod Security Admission ``restricted``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrun_dev import helm
from agentrun_dev.kubectl import Kubectl, create_namespace, delete_namespace


@pytest.fixture(scope="session")
def offline_helm(helm_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> helm.Helm:
    """helm with private homes and no kubeconfig: renders the way a GitOps tool does."""
    return helm.Helm(helm_binary, home=tmp_path_factory.mktemp("helm-home"))


@pytest.fixture
def restricted_namespace(kubectl: Kubectl) -> Iterator[str]:
    """A fresh namespace that enforces Pod Security ``restricted`` (latest)."""
    name = create_namespace(kubectl, prefix="agentrun-psa-")
    kubectl(
        "label",
        "namespace",
        name,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    )
    yield name
    delete_namespace(kubectl, name)
