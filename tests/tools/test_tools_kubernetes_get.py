"""kubernetes_get: pure summaries without a cluster, then reads against a real kube-apiserver.

The cluster tests use the shared fixtures of tests/conftest.py: `control_plane` (its
`kubeconfig` path), `kubectl(*args, input=None, check=True)`, `test_namespace` (a fresh
namespace) and `crds` (the agentrun CRDs installed).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config

from agentrun import tools
from agentrun.tools import kubernetes_get as kg

NOW = datetime(2025, 1, 2, 12, 0, 0, tzinfo=UTC)


def ago(**delta: float) -> str:
    return (NOW - timedelta(**delta)).isoformat()


AGES = {
    "seconds": ({"seconds": 45}, "45s"),
    "just-under-two-minutes": ({"seconds": 119}, "119s"),
    "minutes": ({"minutes": 12}, "12m"),
    "hours": ({"hours": 5}, "5h"),
    "days": ({"days": 3}, "3d"),
}


@pytest.mark.parametrize(("delta", "expected"), AGES.values(), ids=AGES.keys())
def test_age_reads_like_kubectl(delta: dict[str, float], expected: str) -> None:
    assert kg.format_age(ago(**delta), now=NOW) == expected


def test_age_accepts_the_z_suffix_of_raw_custom_objects() -> None:
    assert kg.format_age("2025-01-02T11:59:00Z", now=NOW) == "60s"


def test_a_crashlooping_pod_shows_the_waiting_reason_ready_and_restarts() -> None:
    pod = {
        "metadata": {"name": "web-1", "creationTimestamp": ago(minutes=5)},
        "spec": {"containers": [{"name": "app"}, {"name": "sidecar"}]},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": "app", "ready": False, "restartCount": 4,
                 "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
                {"name": "sidecar", "ready": True, "restartCount": 0,
                 "state": {"running": {}}},
            ],
        },
    }  # fmt: skip
    assert kg.summarize("pods", pod, now=NOW) == {
        "name": "web-1", "status": "CrashLoopBackOff", "ready": "1/2", "restarts": 4, "age": "5m",
    }  # fmt: skip
    assert kg.detail("pods", pod, now=NOW)["containers"][0] == {
        "name": "app", "ready": False, "restarts": 4, "state": "waiting CrashLoopBackOff",
    }  # fmt: skip


def test_a_deployment_shows_ready_up_to_date_and_available() -> None:
    deployment = {
        "metadata": {"name": "api", "creationTimestamp": ago(hours=1)},
        "spec": {"replicas": 3},
        "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2},
    }
    assert kg.summarize("deployments", deployment, now=NOW) == {
        "name": "api", "ready": "2/3", "upToDate": 3, "available": 2, "age": "60m",
    }  # fmt: skip


def test_a_failed_job_says_so() -> None:
    job = {
        "metadata": {"name": "migrate", "creationTimestamp": ago(days=2)},
        "spec": {"completions": 1},
        "status": {"failed": 6, "conditions": [{"type": "Failed", "status": "True"}]},
    }
    row = kg.summarize("jobs", job, now=NOW)
    assert (row["status"], row["completions"], row["failed"]) == ("Failed", "0/1", 6)


def test_an_event_names_its_object_and_clips_its_message() -> None:
    event = {
        "metadata": {"name": "web-1.abc", "creationTimestamp": ago(minutes=9)},
        "type": "Warning",
        "reason": "BackOff",
        "involvedObject": {"kind": "Pod", "name": "web-1"},
        "message": "Back-off restarting failed container " + "x" * 1000,
        "count": 7,
        "lastTimestamp": ago(minutes=1),
    }
    row = kg.summarize("events", event, now=NOW)
    assert (row["type"], row["reason"], row["object"], row["count"]) == (
        "Warning", "BackOff", "Pod/web-1", 7,
    )  # fmt: skip
    assert row["lastTime"] == ago(minutes=1)
    assert len(row["message"]) == kg.MAX_TEXT_CHARS


def test_a_long_list_is_cut_to_fit_and_says_how_much_is_shown() -> None:
    rows = [{"name": f"cm-{i}", "keys": ["k" * 50] * 5} for i in range(100)]
    text = kg.render_list("configmaps", rows, namespace="ns", more=True)
    assert len(text) <= kg.MAX_RESULT_CHARS
    listed = json.loads(text)
    assert listed["truncated"] == f"{len(listed['items'])} of 100 items shown"
    assert 0 < len(listed["items"]) < 100
    assert "labelSelector" in listed["more"]


async def test_without_a_cluster_connection_it_is_a_tool_error() -> None:
    ctx = tools.ToolContext(namespace="ns", run_name="r", run_uid="u", call_id="c", kube=None)
    with pytest.raises(tools.ToolError, match="no cluster connection"):
        await kg.KubernetesGet().run({"kind": "pods"}, ctx)


def test_secrets_are_not_a_kind() -> None:
    assert "secrets" not in kg.SPEC.parameters["properties"]["kind"]["enum"]
    assert "secrets are not available" in kg.SPEC.description


# --------------------------------------------------------------------------- real cluster

Kubectl = Callable[..., Any]


@pytest.fixture
async def kube(control_plane: Any) -> AsyncIterator[Any]:
    """A kubernetes_asyncio ApiClient for the test control plane."""
    configuration = k8s.Configuration()
    await k8s_config.load_kube_config(
        config_file=str(control_plane.kubeconfig), client_configuration=configuration
    )
    async with k8s.ApiClient(configuration) as api_client:
        yield api_client


@pytest.fixture
def get(kube: Any, test_namespace: str) -> Callable[..., Any]:
    """`await get(kind=..., ...)`: one kubernetes_get call in the test namespace."""
    ctx = tools.ToolContext(
        namespace=test_namespace, run_name="run", run_uid="uid", call_id="call_0_0", kube=kube
    )

    async def call(**arguments: Any) -> Any:
        return json.loads(await kg.KubernetesGet().run(arguments, ctx))

    return call


def apply(kubectl: Kubectl, namespace: str, *manifests: dict[str, Any]) -> None:
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(manifests))


def configmap(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels},
        "data": {"mode": "fast", "level": "3"},
    }


async def test_lists_and_gets_configmaps_in_its_own_namespace(
    kubectl: Kubectl, test_namespace: str, get: Callable[..., Any]
) -> None:
    apply(kubectl, test_namespace, configmap("a", app="web"), configmap("b", app="db"))
    listed = await get(kind="configmaps", labelSelector="app=web")
    assert listed["namespace"] == test_namespace
    assert [(i["name"], i["keys"]) for i in listed["items"]] == [("a", ["level", "mode"])]
    single = await get(kind="configmaps", name="b")
    assert (single["name"], single["data"], single["labels"]) == (
        "b", {"level": "3", "mode": "fast"}, {"app": "db"},
    )  # fmt: skip


async def test_limit_reports_that_more_exist(
    kubectl: Kubectl, test_namespace: str, get: Callable[..., Any]
) -> None:
    apply(kubectl, test_namespace, *(configmap(f"cm-{i}", set="many") for i in range(3)))
    listed = await get(kind="configmaps", labelSelector="set=many", limit=2)
    assert len(listed["items"]) == 2 and "more" in listed


async def test_a_missing_object_is_a_tool_error_naming_kind_and_namespace(
    test_namespace: str, get: Callable[..., Any]
) -> None:
    with pytest.raises(tools.ToolError) as caught:
        await get(kind="pods", name="ghost")
    assert caught.value.message == f"pods 'ghost' not found in namespace {test_namespace}"


async def test_a_bad_label_selector_is_a_tool_error(get: Callable[..., Any]) -> None:
    with pytest.raises(tools.ToolError, match="kubernetes API error 400"):
        await get(kind="pods", labelSelector="app in (")


async def test_pods_deployments_and_events_are_summarised(
    kubectl: Kubectl, test_namespace: str, get: Callable[..., Any]
) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-1"},
           "spec": {"containers": [{"name": "app", "image": "nginx"}]}}  # fmt: skip
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "api"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "api"}},
                 "template": {"metadata": {"labels": {"app": "api"}},
                              "spec": {"containers": [{"name": "c", "image": "nginx"}]}}},
    }  # fmt: skip
    event = {
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": "web-1.1"},
        "involvedObject": {"kind": "Pod", "name": "web-1", "namespace": test_namespace},
        "reason": "BackOff", "message": "Back-off restarting", "type": "Warning", "count": 3,
        "firstTimestamp": "2025-01-01T00:00:00Z", "lastTimestamp": "2025-01-01T00:05:00Z",
    }  # fmt: skip
    apply(kubectl, test_namespace, pod, deployment, event)
    (pod_row,) = (await get(kind="pods"))["items"]
    assert (pod_row["name"], pod_row["status"], pod_row["ready"]) == ("web-1", "Pending", "0/1")
    (deployment_row,) = (await get(kind="deployments"))["items"]
    assert (deployment_row["name"], deployment_row["ready"]) == ("api", "0/2")
    (event_row,) = (await get(kind="events"))["items"]
    assert event_row == {
        "name": "web-1.1", "type": "Warning", "reason": "BackOff", "object": "Pod/web-1",
        "message": "Back-off restarting", "count": 3, "lastTime": "2025-01-01T00:05:00+00:00",
    }  # fmt: skip


async def test_reads_agentruns_as_custom_objects(
    crds: Any, kubectl: Kubectl, test_namespace: str, get: Callable[..., Any]
) -> None:
    run = {
        "apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": "r1"},
        "spec": {"model": "mock", "goal": "add 2 and 3", "tools": ["calculate"]},
    }  # fmt: skip
    apply(kubectl, test_namespace, run)
    (row,) = (await get(kind="agentruns"))["items"]
    assert row["name"] == "r1"
    assert (await get(kind="agentruns", name="r1"))["name"] == "r1"
    with pytest.raises(tools.ToolError, match="agentruns 'r2' not found"):
        await get(kind="agentruns", name="r2")


def test_a_namespace_the_platform_did_not_grant_is_refused_saying_where_it_is_granted() -> None:
    """The chart binds the tool's read grant only in rbac.kubernetesGetNamespaces: a run in
    another namespace reads the API server's 403 as the place to ask."""
    from kubernetes_asyncio.client.exceptions import ApiException

    from agentrun.tools import kubernetes_get

    error = kubernetes_get._error_for(
        ApiException(status=403, reason="Forbidden"), kind="pods", name=None, ns="team-a"
    )
    assert "not allowed to read pods in namespace team-a" in error.message
    assert "rbac.kubernetesGetNamespaces" in error.message
