"""The chart's ``helm test`` hook: a Pod running ``agentrun check`` on the named AgentModel (the
scripted ``mock`` when the chart runs it), whose ServiceAccount may only create, read and
delete AgentRuns in the release namespace; no hook when no model is known or it is off."""

from __future__ import annotations

from typing import Any

import pytest
from chart_support import CHART_DIR, documents

from agentrun_dev import helm


def hook(offline_helm: helm.Helm, values: dict[str, str]) -> list[dict[str, Any]]:
    rendered = offline_helm.template(CHART_DIR, namespace="team-a", values=values)
    return [d for d in documents(rendered) if d["metadata"]["name"] == "agentrun-check"]


@pytest.mark.parametrize(
    ("values", "model"),
    [
        pytest.param({"mockModel.enabled": "true"}, "mock", id="the-scripted-model"),
        pytest.param({"helmTest.model": "gpt-small"}, "gpt-small", id="a-named-model"),
    ],
)
def test_the_hook_checks_one_run_on_the_model_with_no_more_rights_than_that(
    offline_helm: helm.Helm, values: dict[str, str], model: str
) -> None:
    docs = {d["kind"]: d for d in hook(offline_helm, values)}
    assert set(docs) == {"ServiceAccount", "Role", "RoleBinding", "Pod"}
    assert all(d["metadata"]["annotations"]["helm.sh/hook"] == "test" for d in docs.values())
    deleted = {
        k: d["metadata"]["annotations"]["helm.sh/hook-delete-policy"] for k, d in docs.items()
    }
    assert deleted.pop("Pod") == "before-hook-creation"  # its log stays for `helm test --logs`
    assert set(deleted.values()) == {"before-hook-creation,hook-succeeded"}
    (rule,) = docs["Role"]["rules"]
    assert rule == {"apiGroups": ["agentrun.dev"], "resources": ["agentruns"],
                    "verbs": ["create", "get", "delete"]}  # fmt: skip
    pod = docs["Pod"]["spec"]
    assert pod["serviceAccountName"] == "agentrun-check"
    assert pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    assert container["command"] == [
        "agentrun", "check", f"--model={model}", "--namespace=team-a", "--timeout=300",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({}, id="no-model-known"),
        pytest.param({"mockModel.enabled": "true", "helmTest.enabled": "false"}, id="off"),
    ],
)
def test_no_hook_without_a_model_or_when_off(
    offline_helm: helm.Helm, values: dict[str, str]
) -> None:
    assert hook(offline_helm, values) == []
