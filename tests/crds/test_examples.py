"""Every manifest in examples/ is accepted by the API server as written (server-side dry run),
and the example AgentTenant is one the operator can enforce."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from crd_support import Kubectl

from agentrun.operator.specs import AgentRunSpec
from agentrun.operator.tenancy import TenantPolicy

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MANIFESTS = sorted(p for p in EXAMPLES.glob("*.yaml") if p.name != "scenarios.yaml")


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_example_is_accepted_by_the_api_server(
    path: Path, kubectl: Kubectl, crds: object, test_namespace: str
) -> None:
    """The agentrun objects of each file (a Secret beside them lives in the workers'
    namespace, which this cluster does not have)."""
    ours = [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") != "Secret"]
    assert ours, path
    body = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": ours})
    result = kubectl(
        "apply", "--dry-run=server", "-n", test_namespace, "-f", "-", input=body, check=False
    )
    assert result.returncode == 0, result.stderr


def test_example_tenant_parses_into_an_enforceable_policy() -> None:
    obj = yaml.safe_load((EXAMPLES / "agenttenant.yaml").read_text())
    policy = TenantPolicy.of(obj)
    assert policy.limits.max_concurrent_runs == 10
    assert policy.binds("team-search", {})
    assert policy.binds("elsewhere", {"agentrun.dev/tenant": "team-search"})
    run = AgentRunSpec.of({"model": "mock", "tools": ["calculate"]})
    assert policy.apply(run).budget.max_steps == 20
