"""Fixtures for the chart tests: helm (built once per machine, right after collection, like
the control-plane binaries), an offline helm with no cluster configured, and a namespace
under Pod Security Admission ``restricted``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrun_dev import helm
from agentrun_dev.kubectl import Kubectl, create_namespace, delete_namespace


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build or locate helm before the first test that needs it (a cold build takes minutes)."""
    if not any("helm_binary" in getattr(item, "fixturenames", ()) for item in session.items):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")

    def show(line: str) -> None:
        if reporter is not None:
            reporter.write_line(f"agentrun devenv: {line}")

    helm.ensure_helm(log=show)


@pytest.fixture(scope="session")
def helm_binary() -> Path:
    """The pinned helm (already built or located after collection)."""
    return helm.ensure_helm(log=print)


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
