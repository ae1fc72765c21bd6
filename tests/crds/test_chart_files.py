"""The Helm chart, checked without helm: CRD copies, plain YAML, and template references.

Helm packages do not carry symlinks portably, so charts/agentrun/crds/ holds copies of the
top-level crds/ (the single source); these tests fail when a copy drifts.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from crd_support import CHART_DIR, CRD_DIR

from agentrun.tools import kubernetes_get

TEMPLATES = CHART_DIR / "templates"
VALUES_REFERENCE = re.compile(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


def test_chart_crds_are_byte_identical_copies_of_the_top_level_crds() -> None:
    top_level = {path.name: path.read_bytes() for path in CRD_DIR.glob("*.yaml")}
    in_chart = {path.name: path.read_bytes() for path in (CHART_DIR / "crds").iterdir()}
    assert sorted(in_chart) == sorted(top_level), "copy with: cp crds/*.yaml charts/agentrun/crds/"
    drifted = [name for name in top_level if in_chart[name] != top_level[name]]
    assert drifted == [], "copy with: cp crds/*.yaml charts/agentrun/crds/"


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert (chart["apiVersion"], chart["name"], chart["type"]) == ("v2", "agentrun", "application")
    assert re.fullmatch(r"\d+\.\d+\.\d+", chart["version"])
    assert chart["appVersion"]


@pytest.mark.parametrize("path", ["dashboards/agentrun.json", "alerts/agentrun.rules.yaml"])
def test_chart_ships_the_dashboard_and_the_alert_rules(path: str) -> None:
    assert (CHART_DIR / path).is_file()


def load_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    return values


def has_key_path(values: dict[str, Any], dotted: str) -> bool:
    node: Any = values
    for key in dotted.strip(".").split("."):
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


TEMPLATE_FILES = sorted(path for path in TEMPLATES.rglob("*") if path.is_file())
"""Every template, those in subfolders (``tests/``: the helm test hook) too."""


def template_id(path: Path) -> str:
    return str(path.relative_to(TEMPLATES))


@pytest.mark.parametrize("template", TEMPLATE_FILES, ids=template_id)
def test_template_reads_only_values_that_values_yaml_declares(template: Path) -> None:
    # Helm renders a misspelt `.Values.x.y` as empty instead of failing; catch it here.
    values = load_values()
    referenced = set(VALUES_REFERENCE.findall(template.read_text()))
    assert sorted(ref for ref in referenced if not has_key_path(values, ref)) == []


@pytest.mark.parametrize(
    "template", [p for p in TEMPLATE_FILES if p.suffix == ".yaml"], ids=template_id
)
def test_template_actions_are_balanced(template: Path) -> None:
    text = template.read_text()
    assert text.count("{{") == text.count("}}")


@pytest.mark.parametrize(
    ("template", "variables"),
    [
        pytest.param(
            "operator-deployment.yaml",
            [
                "AGENTRUN_NATS_URL",
                "AGENTRUN_METRICS_PORT",
                "AGENTRUN_TURN_ACK_WAIT",
                "AGENTRUN_DEFAULT_TENANT",
                "AGENTRUN_HEALTH_PORT",
                "AGENTRUN_IDENTITY",
                "AGENTRUN_LEASE_NAMESPACE",
                "AGENTRUN_LEASE_NAME",
            ],
            id="operator",
        ),
        pytest.param(
            "worker-deployment.yaml",
            [
                "AGENTRUN_NATS_URL",
                "AGENTRUN_METRICS_PORT",
                "AGENTRUN_WORKER_CONCURRENCY",
                "AGENTRUN_WORKER_TURN_MEMORY_BYTES",
                "AGENTRUN_TURN_ACK_WAIT",
            ],
            id="worker",
        ),
    ],
)
def test_deployments_set_the_environment_of_docs_contracts(
    template: str, variables: list[str]
) -> None:
    text = (TEMPLATES / template).read_text()
    assert [name for name in variables if f"name: {name}" not in text] == []


def test_operator_default_tenant_comes_from_values_and_is_empty_by_default() -> None:
    text = (TEMPLATES / "operator-deployment.yaml").read_text()
    assert (
        "- name: AGENTRUN_DEFAULT_TENANT\n"
        "              value: {{ .Values.operator.defaultTenant | quote }}"
    ) in text
    assert load_values()["operator"]["defaultTenant"] == ""


def operator_role_rules() -> list[dict[str, Any]]:
    """The rules of the operator ClusterRole (plain YAML between `rules:` and `---`)."""
    text = (TEMPLATES / "operator-rbac.yaml").read_text()
    role = text[text.index("kind: ClusterRole\n") :]
    rules_block = role[role.index("rules:") : role.index("---")]
    rules: list[dict[str, Any]] = yaml.safe_load(rules_block)["rules"]
    return rules


def operator_verbs(group: str, resource: str) -> set[str]:
    return {
        verb
        for rule in operator_role_rules()
        if group in rule["apiGroups"] and resource in rule["resources"]
        for verb in rule["verbs"]
    }


@pytest.mark.parametrize(
    ("group", "resource", "verbs"),
    [
        # create: the runs of CronAgentRuns and AgentEvals; delete: TTL, history limits, rounds
        ("agentrun.dev", "agentruns", {"get", "list", "watch", "patch", "create", "delete"}),
        ("agentrun.dev", "agentruns/status", {"get", "patch"}),
        ("agentrun.dev", "agentmodels", {"get", "list", "watch"}),
        ("agentrun.dev", "agenttenants", {"get", "list", "watch"}),
        ("agentrun.dev", "agenttenants/status", {"get", "patch"}),
        ("", "namespaces", {"get", "list", "watch"}),  # AgentTenant spec.namespaceSelector
        ("agentrun.dev", "agents", {"get", "list", "watch"}),
        ("agentrun.dev", "agents/status", {"get", "patch"}),
        ("agentrun.dev", "agentevals", {"get", "list", "watch"}),
        ("agentrun.dev", "agentevals/status", {"get", "patch"}),
        ("agentrun.dev", "cronagentruns", {"get", "list", "watch"}),
        ("agentrun.dev", "cronagentruns/status", {"get", "patch"}),
        ("agentrun.dev", "cronagentruns/finalizers", {"update"}),  # blockOwnerDeletion
        ("", "events", {"create", "patch"}),  # a repeated occasion raises its Event's count
        ("apiextensions.k8s.io", "customresourcedefinitions", {"get", "list", "watch"}),
    ],
)
def test_operator_role_grants(group: str, resource: str, verbs: set[str]) -> None:
    assert operator_verbs(group, resource) == verbs


def test_operator_role_reads_no_secrets() -> None:
    assert operator_verbs("", "secrets") == set()


def test_worker_roles_do_not_touch_agenttenants() -> None:
    text = (TEMPLATES / "worker-rbac.yaml").read_text()
    assert "agenttenants" not in text


API_GROUPS = {"CoreV1Api": "", "AppsV1Api": "apps", "BatchV1Api": "batch"}


def tool_role_rules() -> list[dict[str, Any]]:
    """The rules of the kubernetes_get ClusterRole (plain YAML between `rules:` and `---`)."""
    text = (TEMPLATES / "worker-rbac.yaml").read_text()
    role = text[text.index("name: {{ $fullname }}-worker-kubernetes-get") :]
    tail = role[role.index("rules:") :]
    rules_block = tail[: min(tail.index("---"), tail.index("{{"))]  # up to the bindings
    rules: list[dict[str, Any]] = yaml.safe_load(rules_block)["rules"]
    return rules


def test_kubernetes_get_tool_role_grants_exactly_the_kinds_the_tool_serves() -> None:
    expected = {
        (route.custom[0] if route.custom else API_GROUPS[route.api], kind)
        for kind, route in kubernetes_get.ROUTES.items()
    }
    granted = {
        (group, resource)
        for rule in tool_role_rules()
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert granted == expected


def test_kubernetes_get_tool_role_is_read_only() -> None:
    assert {verb for rule in tool_role_rules() for verb in rule["verbs"]} == {"get", "list"}
