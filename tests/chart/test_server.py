"""What the chart renders, judged by the suite's real API server: server-side dry-run of every
feature set (KEDA's own ScaledObject CRD installed), Pod Security ``restricted`` admission of
every pod, and the RBAC grants checked with ``kubectl auth can-i``."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from chart_support import (
    CHART_DIR,
    FEATURES,
    documents,
    keda_module_dir,
    pod_from_workload,
)

from agentrun_dev import helm
from agentrun_dev.kubectl import Kubectl, KubectlError

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="session")
def keda_crd(kubectl: Kubectl) -> str:
    """KEDA's ScaledObject CRD, from its Go module's config/crd/bases, applied and Established."""
    path = keda_module_dir() / "config" / "crd" / "bases" / "keda.sh_scaledobjects.yaml"
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    kubectl("wait", "--for=condition=Established", "crd/scaledobjects.keda.sh", "--timeout=60s")
    return "scaledobjects.keda.sh"


def dry_run(kubectl: Kubectl, docs: list[Any]) -> str:
    """``kubectl apply --dry-run=server`` of `docs`; kubectl's output (raises KubectlError)."""
    text = yaml.safe_dump_all(docs)
    return kubectl("apply", "--dry-run=server", "-f", "-", input=text).stdout


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_rendered_chart_passes_server_side_dry_run(
    offline_helm: helm.Helm,
    kubectl: Kubectl,
    crds: list[str],
    keda_crd: str,
    restricted_namespace: str,
    feature: str,
) -> None:
    rendered = offline_helm.template(
        CHART_DIR, namespace=restricted_namespace, values=FEATURES[feature]
    )
    docs = documents(rendered)

    output = dry_run(kubectl, docs)

    assert output.count("(server dry run)") == len(docs)


@pytest.mark.parametrize("feature", ["defaults", "everything", "nats-without-persistence"])
def test_every_pod_is_admitted_under_pod_security_restricted(
    offline_helm: helm.Helm, kubectl: Kubectl, restricted_namespace: str, feature: str
) -> None:
    docs = documents(
        offline_helm.template(CHART_DIR, namespace=restricted_namespace, values=FEATURES[feature])
    )
    pods = [pod_from_workload(d) for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    assert len(pods) >= 2

    output = dry_run(kubectl, pods)

    assert output.count("pod/") == len(pods)


def test_pod_security_restricted_is_enforced_in_the_checking_namespace(
    offline_helm: helm.Helm, kubectl: Kubectl, restricted_namespace: str
) -> None:
    docs = documents(offline_helm.template(CHART_DIR, namespace=restricted_namespace))
    worker = next(d for d in docs if d["kind"] == "Deployment")
    pod = pod_from_workload(worker)
    del pod["spec"]["securityContext"]["seccompProfile"]
    pod["spec"]["containers"][0]["securityContext"]["capabilities"] = {}

    with pytest.raises(KubectlError) as raised:
        dry_run(kubectl, [pod])

    assert 'violates PodSecurity "restricted:latest"' in str(raised.value)


@pytest.fixture
def installed_rbac(
    offline_helm: helm.Helm, kubectl: Kubectl, crds: list[str], test_namespace: str
) -> Iterator[str]:
    """The chart's ServiceAccounts, Roles and bindings applied for real under a unique
    ``fullnameOverride``; the cluster-scoped ones deleted afterwards. Yields the prefix."""
    prefix = f"ar{uuid.uuid4().hex[:8]}"
    docs = [
        d
        for d in documents(
            offline_helm.template(
                CHART_DIR, namespace=test_namespace, values={"fullnameOverride": prefix}
            )
        )
        if d["kind"]
        in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    ]
    kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    try:
        yield prefix
    finally:
        for doc in docs:
            if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
                kubectl(
                    "delete", doc["kind"].lower(), doc["metadata"]["name"], "--ignore-not-found"
                )


def can_i(kubectl: Kubectl, account: str, verb: str, resource: str, namespace: str) -> bool:
    """``kubectl auth can-i`` as `account`; `resource` may end in ``/status`` (a subresource)."""
    resource, _, subresource = resource.partition("/")
    extra = [f"--subresource={subresource}"] if subresource else []
    result = kubectl(
        "auth", "can-i", verb, resource, *extra, "--as", account, "-n", namespace, check=False
    )
    return result.stdout.strip() == "yes"


OPERATOR_NEEDS = [
    ("watch", "agentruns.agentrun.dev"),
    ("patch", "agentruns.agentrun.dev"),
    ("patch", "agentruns.agentrun.dev/status"),
    ("get", "agentmodels.agentrun.dev"),
    ("list", "agenttenants.agentrun.dev"),
    ("patch", "agenttenants.agentrun.dev/status"),
    ("get", "namespaces"),
    ("create", "events"),
    ("patch", "events"),
    ("watch", "agents.agentrun.dev"),
    ("patch", "agents.agentrun.dev/status"),
    ("watch", "customresourcedefinitions.apiextensions.k8s.io"),
]
WORKER_NEEDS = [
    ("get", "agentmodels.agentrun.dev"),
    ("get", "secrets"),
    ("list", "pods"),
    ("get", "agentruns.agentrun.dev"),
]
NOBODY_GETS = [
    ("update", "agentruns.agentrun.dev/status"),
    ("patch", "agenttenants.agentrun.dev"),
    ("delete", "agentruns.agentrun.dev"),
    ("create", "agentruns.agentrun.dev"),
    ("update", "agentruns.agentrun.dev"),
    ("patch", "agentmodels.agentrun.dev"),
    ("patch", "agents.agentrun.dev"),
    ("create", "pods"),
    ("delete", "pods"),
    ("list", "secrets"),
    ("create", "secrets"),
    ("create", "rolebindings.rbac.authorization.k8s.io"),
]


def test_rbac_grants_each_account_what_its_code_calls_and_nothing_broader(
    kubectl: Kubectl, installed_rbac: str, test_namespace: str
) -> None:
    def account(component: str) -> str:
        return f"system:serviceaccount:{test_namespace}:{installed_rbac}-{component}"

    operator, worker = account("operator"), account("worker")
    found = {
        "operator lacks": [
            n for n in OPERATOR_NEEDS if not can_i(kubectl, operator, *n, test_namespace)
        ],
        "worker lacks": [n for n in WORKER_NEEDS if not can_i(kubectl, worker, *n, test_namespace)],
        "operator may": [n for n in NOBODY_GETS if can_i(kubectl, operator, *n, test_namespace)],
        "worker may": [n for n in NOBODY_GETS if can_i(kubectl, worker, *n, test_namespace)],
        "operator reads secrets": can_i(kubectl, operator, "get", "secrets", test_namespace),
        "worker reads secrets elsewhere": can_i(kubectl, worker, "get", "secrets", "default"),
    }

    assert json.loads(json.dumps(found)) == {
        "operator lacks": [],
        "worker lacks": [],
        "operator may": [],
        "worker may": [],
        "operator reads secrets": False,
        "worker reads secrets elsewhere": False,
    }
