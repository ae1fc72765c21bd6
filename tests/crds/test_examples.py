"""Every manifest in examples/ is accepted by the API server as written (server-side dry run),
and the example AgentTenant is one the operator can enforce."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from crd_support import Kubectl

from agentrun.operator.runs.spec import AgentRunSpec
from agentrun.operator.tenants.policy import TenantPolicy

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MANIFESTS = sorted(p for p in EXAMPLES.glob("*.yaml") if p.name != "scenarios.yaml")
MANIFESTS += sorted(EXAMPLES.glob("agents/*.yaml")) + sorted(EXAMPLES.glob("schedules/*.yaml"))
"""Runs of Agents and AgentEvals live in examples/agents/, CronAgentRuns in examples/schedules/
(the kernel replay of examples/ reads runs that carry their own spec.model)."""
NAMESPACED = ("AgentRun", "Agent", "CronAgentRun", "AgentEval")


def namespaced_objects(path: Path) -> list[dict[str, object]]:
    """The AgentRuns, Agents, CronAgentRuns and AgentEvals of an example file."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") in NAMESPACED]


WITH_NAMESPACED = [path for path in MANIFESTS if namespaced_objects(path)]


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


@pytest.mark.parametrize("path", WITH_NAMESPACED, ids=lambda p: p.name)
def test_server_side_apply_of_an_example_twice_is_a_no_op(
    path: Path, kubectl: Kubectl, crds: object, test_namespace: str
) -> None:
    """What Argo CD (and any GitOps tool) relies on: once applied, the example shows no diff,
    and applying it again changes nothing (no defaulted field flip-flops into OutOfSync).
    AgentModels and AgentTenants are cluster-scoped and shared by the suite: left to the
    dry run above."""
    body = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": namespaced_objects(path)})
    apply = ("apply", "--server-side", "--field-manager=gitops", "-n", test_namespace, "-f", "-")
    kubectl(*apply, input=body)
    # generation: spec changes only (an operator in the same session writes status)
    versions = kubectl(
        "get",
        "-n",
        test_namespace,
        "agentruns,agents,cronagentruns,agentevals",
        "-o",
        "jsonpath={.items[*].metadata.generation}",
    ).stdout
    again = kubectl(*apply, input=body)
    assert "serverside-applied" in again.stdout
    assert (
        kubectl(
            "get",
            "-n",
            test_namespace,
            "agentruns,agents,cronagentruns,agentevals",
            "-o",
            "jsonpath={.items[*].metadata.generation}",
        ).stdout
        == versions
    )
    diff = kubectl(
        "diff",
        "--server-side",
        "--field-manager=gitops",
        "-n",
        test_namespace,
        "-f",
        "-",
        input=body,
        check=False,
    )
    assert (diff.returncode, diff.stdout) == (0, ""), diff.stdout + diff.stderr
