"""``helm install``, ``upgrade`` and ``uninstall`` against the suite's real API server (no node:
pods are not scheduled here, the objects are what is checked). A typo in values fails the
install naming the field; an upgrade changes what it should; uninstalling keeps the CRDs and
the AgentRuns.

The closed bus's credentials and the run-signing keys are brought the way a platform team
that keeps keys out of the cluster's hooks would: ``agentrun nats bootstrap`` and ``agentrun
signing bootstrap``, run here against the API server, make them, and the values name their
Secrets. The chart then has no hook Job, which here would wait for a node that never runs it
(the hooks themselves run on the node, tests/cluster)."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bootstrap_support import bring_nats_credentials, bring_run_signing_keys
from chart_support import CHART_DIR
from test_closed_bus import secrets_of

from agentrun_dev import helm
from agentrun_dev.kubectl import Kubectl, create_namespace, delete_namespace

pytestmark = pytest.mark.e2e


@pytest.fixture
def cluster_helm(helm_binary: Path, kubectl: Kubectl, crds: list[str], tmp_path: Path) -> helm.Helm:
    """helm against the suite's API server (the CRDs already installed)."""
    return helm.Helm(helm_binary, home=tmp_path / "helm", kubeconfig=kubectl.env["KUBECONFIG"])


@pytest.fixture
def release(cluster_helm: helm.Helm, test_namespace: str) -> Iterator[str]:
    """A release name with a unique object prefix; uninstalled afterwards if still there."""
    name = f"ar{uuid.uuid4().hex[:8]}"
    yield name
    cluster_helm("uninstall", name, "-n", test_namespace, "--ignore-not-found", check=False)


def install(cluster_helm: helm.Helm, release: str, namespace: str, *sets: str) -> None:
    args = [arg for s in (f"fullnameOverride={release}", *sets) for arg in ("--set", s)]
    cluster_helm("install", release, str(CHART_DIR), "-n", namespace, *args)


def get(kubectl: Kubectl, kind: str, name: str, namespace: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(
        kubectl("get", kind, name, "-n", namespace, "-o", "json").stdout
    )
    return found


def test_a_typo_in_values_fails_the_install_naming_the_field(
    cluster_helm: helm.Helm, kubectl: Kubectl, release: str, test_namespace: str
) -> None:
    with pytest.raises(helm.HelmError) as raised:
        install(cluster_helm, release, test_namespace, "wroker.replicas=3")

    assert "additional properties 'wroker' not allowed" in str(raised.value)
    assert kubectl("get", "deploy", "-n", test_namespace, "-o", "name").stdout == ""


def test_install_upgrade_and_uninstall_keep_the_crds_and_the_runs(
    cluster_helm: helm.Helm, kubectl: Kubectl, release: str, test_namespace: str
) -> None:
    bus = f"{release}-bus"
    brought = bring_nats_credentials(kubectl, test_namespace, bus)
    brought += bring_run_signing_keys(kubectl, test_namespace, bus)
    install(cluster_helm, release, test_namespace, "nats.install.enabled=true", *brought)
    deployments = kubectl("get", "deploy", "-n", test_namespace, "-o", "name").stdout.split()
    assert sorted(deployments) == [
        f"deployment.apps/{release}-operator",
        f"deployment.apps/{release}-trajectory",
        f"deployment.apps/{release}-worker",
    ]
    # the trajectory API: registered with its CA, reading NATS with the readers' key alone
    service = get(kubectl, "apiservice", "v1alpha1.trajectory.agentrun.dev", test_namespace)
    assert service["spec"]["service"] == {
        "name": f"{release}-trajectory",
        "namespace": test_namespace,
        "port": 443,
    }
    tls = get(kubectl, "secret", f"{release}-trajectory-tls", test_namespace)
    assert service["spec"]["caBundle"] == tls["data"]["ca.crt"]
    trajectory = get(kubectl, "deploy", f"{release}-trajectory", test_namespace)
    signer = next(
        v for v in trajectory["spec"]["template"]["spec"]["volumes"] if v["name"] == "nats-signer"
    )
    assert signer["secret"]["secretName"] == f"{bus}-operator"
    assert [i["key"] for i in signer["secret"]["items"]] == ["reader-signer.nk", "account.pub"]
    nats = get(kubectl, "statefulset", f"{release}-nats", test_namespace)
    assert secrets_of(nats)["auth"] == f"{bus}-server"
    for role in ("operator", "worker"):
        workload = get(kubectl, "deploy", f"{release}-{role}", test_namespace)
        assert secrets_of(workload)["nats-creds"] == f"{bus}-{role}"
        assert secrets_of(workload)["run-trust"] == f"{bus}-trust"
    assert kubectl("get", "jobs", "-n", test_namespace, "-o", "name").stdout == ""

    cluster_helm(
        "upgrade",
        release,
        str(CHART_DIR),
        "-n",
        test_namespace,
        "--reuse-values",
        "--set",
        "worker.replicas=3",
    )
    worker = get(kubectl, "deploy", f"{release}-worker", test_namespace)
    assert worker["spec"]["replicas"] == 3
    assert secrets_of(worker)["nats-creds"] == f"{bus}-worker"

    run = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": "kept", "namespace": test_namespace},
        "spec": {"model": "mock", "goal": "outlive the release"},
    }
    kubectl("apply", "-f", "-", input=json.dumps(run))

    cluster_helm("uninstall", release, "-n", test_namespace, "--wait")

    left = kubectl(
        "get", "deploy,statefulset,service,serviceaccount", "-n", test_namespace, "-o", "name"
    ).stdout.split()
    assert [name for name in left if release in name] == []
    roles = kubectl("get", "clusterrole", "-o", "name").stdout.split()
    assert [name for name in roles if release in name] == []
    apis = kubectl("get", "apiservice", "-o", "name").stdout.split()
    assert "apiservice.apiregistration.k8s.io/v1alpha1.trajectory.agentrun.dev" not in apis
    assert kubectl("get", "crd", "agentruns.agentrun.dev").returncode == 0
    assert kubectl("get", "agentrun", "kept", "-n", test_namespace).returncode == 0
    secrets = kubectl("get", "secrets", "-n", test_namespace, "-o", "name").stdout.split()
    assert {f"secret/{bus}-{s}" for s in ("keys", "operator", "worker", "server")} <= set(secrets)


def test_a_second_install_in_another_namespace_is_refused_and_the_first_kept(
    cluster_helm: helm.Helm, kubectl: Kubectl, release: str, test_namespace: str
) -> None:
    """One install per cluster (docs/install.md): a second release of the same names (the
    chart's defaults; here the same ``fullnameOverride``) in another namespace would run a
    second operator on every run. Helm refuses it over the cluster-wide objects the first
    release owns, before creating anything, and the first keeps them."""
    bus = f"{release}-bus"
    brought = bring_nats_credentials(kubectl, test_namespace, bus)
    brought += bring_run_signing_keys(kubectl, test_namespace, bus)
    install(cluster_helm, release, test_namespace, *brought)
    other = create_namespace(kubectl)
    second = f"{release}-second"
    try:
        theirs = bring_nats_credentials(kubectl, other, bus)
        theirs += bring_run_signing_keys(kubectl, other, bus)
        args = [a for s in (f"fullnameOverride={release}", *theirs) for a in ("--set", s)]
        with pytest.raises(helm.HelmError) as refused:
            cluster_helm("install", second, str(CHART_DIR), "-n", other, *args)
        said = str(refused.value)
        assert "exists and cannot be imported into the current release" in said, said
        assert f'must equal "{other}": current value is "{test_namespace}"' in said, said
        assert kubectl("get", "deploy", "-n", other, "-o", "name").stdout == ""
        role = json.loads(kubectl("get", "clusterrole", f"{release}-view", "-o", "json").stdout)
        assert role["metadata"]["annotations"]["meta.helm.sh/release-namespace"] == test_namespace
    finally:
        cluster_helm("uninstall", second, "-n", other, "--ignore-not-found", check=False)
        delete_namespace(kubectl, other)


def test_a_change_of_operator_shards_is_refused_while_the_operator_runs(
    cluster_helm: helm.Helm, kubectl: Kubectl, release: str, test_namespace: str
) -> None:
    """Pods of two shard counts would serve the same tenants at once, and a rolling update runs
    old and new pods together: the upgrade is refused, naming the way; scaled to 0 first, the
    new count is accepted."""
    bus = f"{release}-bus"
    brought = bring_nats_credentials(kubectl, test_namespace, bus)
    brought += bring_run_signing_keys(kubectl, test_namespace, bus)
    install(cluster_helm, release, test_namespace, "nats.install.enabled=true", *brought)
    upgrade = ("upgrade", release, str(CHART_DIR), "-n", test_namespace, "--reuse-values")
    with pytest.raises(helm.HelmError) as refused:
        cluster_helm(*upgrade, "--set", "operator.shards=3")
    assert "operator.replicas=0 first" in str(refused.value)
    assert shards_of(get(kubectl, "deploy", f"{release}-operator", test_namespace)) == "1"
    cluster_helm(*upgrade, "--set", "operator.replicas=0")
    cluster_helm(*upgrade, "--set", "operator.shards=3", "--set", "operator.replicas=2")
    operator = get(kubectl, "deploy", f"{release}-operator", test_namespace)
    assert (shards_of(operator), operator["spec"]["replicas"]) == ("3", 2)


def test_the_operators_lease_requests_go_to_the_leader_election_priority_level(
    cluster_helm: helm.Helm, kubectl: Kubectl, release: str, test_namespace: str
) -> None:
    """As the API server classifies requests (its response headers name the FlowSchema and
    the priority level of each): the operator's Lease requests go to ``leader-election``, so
    a burst of its status writes cannot delay a renewal; its other requests do not; with
    ``operator.leaseFlowSchema=false`` no FlowSchema is installed."""
    bus = f"{release}-bus"
    brought = bring_nats_credentials(kubectl, test_namespace, bus)
    brought += bring_run_signing_keys(kubectl, test_namespace, bus)
    install(cluster_helm, release, test_namespace, "nats.install.enabled=true", *brought)
    schema = json.loads(
        kubectl("get", "flowschema", f"{release}-operator-leases", "-o", "json").stdout
    )
    level = json.loads(
        kubectl("get", "prioritylevelconfiguration", "leader-election", "-o", "json").stdout
    )
    operator = f"system:serviceaccount:{test_namespace}:{release}-operator"

    def classified(*path: str) -> tuple[str, str]:
        """(FlowSchema uid, priority level uid) of a GET as the operator's ServiceAccount."""
        done = kubectl("get", *path, "-n", test_namespace, f"--as={operator}", "-v=8",
                       check=False)  # fmt: skip
        found = [
            re.search(rf"X-Kubernetes-Pf-{kind}-Uid:\s*(\S+)", done.stderr, re.IGNORECASE)
            for kind in ("Flowschema", "Prioritylevel")
        ]
        assert all(found), done.stderr[-2000:]
        return (found[0].group(1), found[1].group(1))  # type: ignore[union-attr]

    lease = classified("lease", f"{release}-operator")
    assert lease == (schema["metadata"]["uid"], level["metadata"]["uid"])
    other = classified("agentruns")
    assert other[0] != schema["metadata"]["uid"] and other[1] != level["metadata"]["uid"]

    upgrade = ("upgrade", release, str(CHART_DIR), "-n", test_namespace, "--reuse-values")
    cluster_helm(*upgrade, "--set", "operator.leaseFlowSchema=false")
    gone = kubectl("get", "flowschema", f"{release}-operator-leases", check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr


def shards_of(deployment: dict[str, Any]) -> str:
    """``AGENTRUN_OPERATOR_SHARDS`` of the operator Deployment's container."""
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    return str(next(e["value"] for e in env if e["name"] == "AGENTRUN_OPERATOR_SHARDS"))


def test_the_notes_lead_a_first_install_to_a_run_that_can_be_admitted(
    cluster_helm: helm.Helm, release: str, test_namespace: str
) -> None:
    """NOTES name the kinds as kubectl knows them, the AgentTenant a run needs, the Secret's
    namespace the workers may read, the roles, and the CRDs applied before an upgrade."""
    shown = cluster_helm(
        "install", release, str(CHART_DIR), "-n", test_namespace, "--dry-run=client",
        "--set", f"fullnameOverride={release}",
    ).stdout  # fmt: skip
    notes = shown[shown.index("NOTES:") :]
    assert "kubectl get agentruns -A" in notes and "get agents -A" not in notes
    assert "an AgentTenant binding the namespaces runs go in" in notes
    assert f"Model API-key Secrets must live in: {test_namespace}." in notes
    assert f"ClusterRoles {release}-view, {release}-edit, {release}-approve" in notes
    assert f"--clusterrole={release}-edit" in notes
    assert "BEFORE `helm upgrade`" in notes
    assert "no run holds a finalizer" in notes
    assert "Secrets the hooks made" in notes and "PVC data-" not in notes  # no NATS of its own
    persisted = cluster_helm(
        "install", release, str(CHART_DIR), "-n", test_namespace, "--dry-run=client",
        "--set", f"fullnameOverride={release}", "--set", "nats.install.enabled=true",
    ).stdout  # fmt: skip
    assert f"the NATS data (PVC data-{release}-nats-0)" in persisted
    with_tenant = cluster_helm(
        "install", release, str(CHART_DIR), "-n", test_namespace, "--dry-run=client",
        "--set", f"fullnameOverride={release}", "--set", "operator.defaultTenant=shared",
    ).stdout  # fmt: skip
    assert 'charged to the AgentTenant "shared", which must exist' in with_tenant
