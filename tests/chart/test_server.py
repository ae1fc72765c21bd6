"""What the chart renders, judged by the suite's real API server: server-side dry-run of every
feature set (KEDA's own ScaledObject and TriggerAuthentication CRDs installed), Pod Security
``restricted`` admission of every pod, and the RBAC grants checked with ``kubectl auth can-i``."""

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
    KEDA_KINDS,
    documents,
    keda_crd_file,
    monitoring_crd_files,
    pod_from_workload,
)

from agentrun_dev import helm
from agentrun_dev.kubectl import Kubectl, KubectlError

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="session")
def keda_crds(kubectl: Kubectl) -> list[str]:
    """KEDA's ScaledObject and TriggerAuthentication CRDs, from its Go module's
    config/crd/bases, applied and Established; their names."""
    names = [f"{plural}.keda.sh" for plural in KEDA_KINDS]
    for plural in KEDA_KINDS:
        kubectl("apply", "--server-side", "--force-conflicts", "-f", str(keda_crd_file(plural)))
    for name in names:
        kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
    return names


@pytest.fixture(scope="session")
def monitoring_crds(kubectl: Kubectl) -> list[str]:
    """The Prometheus Operator's ServiceMonitor, PodMonitor and PrometheusRule CRDs, applied
    and Established (the chart's monitoring objects are judged by their schemas)."""
    names = []
    for path in monitoring_crd_files():
        kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
        names.append(yaml.safe_load(path.read_text())["metadata"]["name"])
    for name in names:
        kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
    return names


def dry_run(kubectl: Kubectl, docs: list[Any]) -> str:
    """``kubectl apply --dry-run=server`` of `docs`; kubectl's output (raises KubectlError)."""
    text = yaml.safe_dump_all(docs)
    return kubectl("apply", "--dry-run=server", "-f", "-", input=text).stdout


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_rendered_chart_passes_server_side_dry_run(
    offline_helm: helm.Helm,
    kubectl: Kubectl,
    crds: list[str],
    keda_crds: list[str],
    monitoring_crds: list[str],
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
    pods = [pod_from_workload(d) for d in docs if d["kind"] in ("Deployment", "StatefulSet", "Job")]
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


def apply_rbac(
    offline_helm: helm.Helm, kubectl: Kubectl, namespace: str, values: dict[str, Any]
) -> tuple[str, list[Any]]:
    """The chart's ServiceAccounts, Roles and bindings rendered with `values` under a unique
    ``fullnameOverride`` and applied for real; (the prefix, the applied documents)."""
    prefix = f"ar{uuid.uuid4().hex[:8]}"
    docs = [
        d
        for d in documents(
            offline_helm.template(
                CHART_DIR, namespace=namespace, values={"fullnameOverride": prefix, **values}
            )
        )
        if d["kind"]
        in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    ]
    kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    return prefix, docs


def delete_cluster_scoped(kubectl: Kubectl, docs: list[Any]) -> None:
    for doc in docs:
        if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            kubectl("delete", doc["kind"].lower(), doc["metadata"]["name"], "--ignore-not-found")


@pytest.fixture
def installed_rbac(
    offline_helm: helm.Helm, kubectl: Kubectl, crds: list[str], test_namespace: str
) -> Iterator[str]:
    """The chart's default RBAC applied for real; the cluster-scoped objects deleted
    afterwards. Yields the ``fullnameOverride`` prefix."""
    prefix, docs = apply_rbac(offline_helm, kubectl, test_namespace, {})
    try:
        yield prefix
    finally:
        delete_cluster_scoped(kubectl, docs)


def can_i(kubectl: Kubectl, account: str, verb: str, resource: str, namespace: str) -> bool:
    """``kubectl auth can-i`` as `account`; `resource` may end in ``/status`` (a subresource)
    or name one object as ``TYPE:NAME``."""
    resource, _, named = resource.partition(":")
    if named:
        resource = f"{resource}/{named}"
    resource, _, subresource = resource.partition("/") if not named else (resource, "", "")
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
    ("get", "customresourcedefinitions.apiextensions.k8s.io"),  # the start-up CRD check
    ("delete", "agentruns.agentrun.dev"),  # spec.ttlSecondsAfterFinished, history limits
    ("create", "agentruns.agentrun.dev"),  # the runs of CronAgentRuns
    ("watch", "cronagentruns.agentrun.dev"),
    ("patch", "cronagentruns.agentrun.dev/status"),
    ("update", "cronagentruns.agentrun.dev/finalizers"),  # blockOwnerDeletion on its runs
    ("create", "leases.coordination.k8s.io"),  # the leader Lease, release namespace only
    ("create", "agentruns.agentrun.dev"),  # an AgentEval's case runs
    ("watch", "agentevals.agentrun.dev"),
    ("patch", "agentevals.agentrun.dev/status"),
]
WORKER_NEEDS = [
    ("get", "agentmodels.agentrun.dev"),
    ("get", "secrets"),
]
KUBERNETES_GET_READS = [("list", "pods"), ("get", "configmaps"), ("get", "agentruns.agentrun.dev")]
"""Reads of the kubernetes_get tool: granted only where rbac.kubernetesGetNamespaces lists."""
NOBODY_GETS = [
    ("update", "agentruns.agentrun.dev/status"),
    ("patch", "agenttenants.agentrun.dev"),
    ("patch", "agentevals.agentrun.dev"),
    ("delete", "agentruns.agentrun.dev/status"),
    ("delete", "leases.coordination.k8s.io"),
    ("patch", "customresourcedefinitions.apiextensions.k8s.io"),
    ("delete", "namespaces"),
    ("update", "agentruns.agentrun.dev"),
    ("patch", "agentmodels.agentrun.dev"),
    ("patch", "agents.agentrun.dev"),
    ("patch", "cronagentruns.agentrun.dev"),
    ("update", "cronagentruns.agentrun.dev"),
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
    lease = f"{installed_rbac}-operator"
    found = {
        "operator lacks": [
            n for n in OPERATOR_NEEDS if not can_i(kubectl, operator, *n, test_namespace)
        ],
        "worker lacks": [n for n in WORKER_NEEDS if not can_i(kubectl, worker, *n, test_namespace)],
        "operator may": [n for n in NOBODY_GETS if can_i(kubectl, operator, *n, test_namespace)],
        "worker may": [n for n in NOBODY_GETS if can_i(kubectl, worker, *n, test_namespace)],
        "operator reads secrets": can_i(kubectl, operator, "get", "secrets", test_namespace),
        "worker reads secrets elsewhere": can_i(kubectl, worker, "get", "secrets", "default"),
        "worker deletes runs": can_i(
            kubectl, worker, "delete", "agentruns.agentrun.dev", test_namespace
        ),
        "worker creates runs": can_i(
            kubectl, worker, "create", "agentruns.agentrun.dev", test_namespace
        ),
        "worker's kubernetes_get reads by default": [
            can_i(kubectl, worker, *read, ns)
            for read in KUBERNETES_GET_READS
            for ns in (test_namespace, "default")
        ],
        "operator's Lease": [
            can_i(kubectl, operator, verb, f"leases.coordination.k8s.io:{lease}", test_namespace)
            for verb in ("get", "update")
        ],
        "another Lease": [
            can_i(kubectl, operator, verb, "leases.coordination.k8s.io:kube-scheduler", ns)
            for verb in ("get", "update")
            for ns in (test_namespace, "kube-system")
        ],
        "Leases elsewhere": can_i(
            kubectl, operator, "create", "leases.coordination.k8s.io", "kube-system"
        ),
        "worker Leases": can_i(
            kubectl, worker, "get", f"leases.coordination.k8s.io:{lease}", test_namespace
        ),
    }

    assert json.loads(json.dumps(found)) == {
        "operator lacks": [],
        "worker lacks": [],
        "operator may": [],
        "worker may": [],
        "operator reads secrets": False,
        "worker reads secrets elsewhere": False,
        "worker deletes runs": False,
        "worker creates runs": False,
        "worker's kubernetes_get reads by default": [False] * 6,
        "operator's Lease": [True, True],
        "another Lease": [False, False, False, False],
        "Leases elsewhere": False,
        "worker Leases": False,
    }


def test_kubernetes_get_grant_bound_to_listed_namespaces_reads_no_other(
    offline_helm: helm.Helm, kubectl: Kubectl, crds: list[str], test_namespace: str
) -> None:
    """``rbac.kubernetesGetNamespaces``: the tool's read grant holds in those namespaces and
    nowhere else (the tool itself only ever names the run's namespace)."""
    prefix, docs = apply_rbac(
        offline_helm,
        kubectl,
        test_namespace,
        {"rbac.kubernetesGetNamespaces": f"{{{test_namespace}}}"},
    )
    worker = f"system:serviceaccount:{test_namespace}:{prefix}-worker"
    try:
        reads = {
            ns: [
                can_i(kubectl, worker, verb, kind, ns)
                for verb, kind in (("list", "pods"), ("get", "configmaps"), ("list", "events"))
            ]
            for ns in (test_namespace, "default", "kube-system")
        }
    finally:
        delete_cluster_scoped(kubectl, docs)
    assert reads == {
        test_namespace: [True, True, True],
        "default": [False, False, False],
        "kube-system": [False, False, False],
    }


def test_kubernetes_get_grant_cluster_wide_only_when_asked(
    offline_helm: helm.Helm, kubectl: Kubectl, crds: list[str], test_namespace: str
) -> None:
    """``rbac.kubernetesGetClusterWide``: the old cluster-wide binding, as an explicit choice
    (and ``rbac.kubernetesGetNamespaces`` is then not needed)."""
    prefix, docs = apply_rbac(
        offline_helm, kubectl, test_namespace, {"rbac.kubernetesGetClusterWide": "true"}
    )
    worker = f"system:serviceaccount:{test_namespace}:{prefix}-worker"
    try:
        reads = {
            ns: [can_i(kubectl, worker, *read, ns) for read in KUBERNETES_GET_READS]
            for ns in (test_namespace, "default", "kube-system")
        }
        secrets = can_i(kubectl, worker, "get", "secrets", "kube-system")
    finally:
        delete_cluster_scoped(kubectl, docs)
    assert reads == dict.fromkeys((test_namespace, "default", "kube-system"), [True] * 3)
    assert secrets is False
