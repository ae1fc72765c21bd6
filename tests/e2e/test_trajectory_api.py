"""``kubectl agentrun logs`` through the trajectory API, with a user's kubeconfig and no NATS.

The aggregated API server (``agentrun-trajectory``) runs as a process of this machine; the
suite's kube-apiserver (started with the front-proxy flags, ``controlplane``) reaches it
through a selectorless Service whose EndpointSlice names a non-loopback address of this machine
(the API server refuses loopback endpoints) and an APIService carrying the server's CA. The
server's own Kubernetes identity is a client certificate bound exactly as the chart binds its
ServiceAccount (``extension-apiserver-authentication-reader`` in kube-system,
``system:auth-delegator``, and reading AgentTenants and namespaces, to share by tenant). A user
with a client certificate of their own, bound to the chart's ``agentrun-view`` ClusterRole in
namespace A only, reads A's run, is refused in B (403 naming the resource), and follows a live
run to its end, with no NATS variable in their environment.

The APIService is deleted after the module, before the server stops: an unavailable aggregated
API would disturb the discovery of every later test on this API server.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun.natsauth.permissions import Role
from agentrun_dev import certs, components, controlplane, helm, probes
from agentrun_dev.kubectl import Kubectl, create_namespace, delete_namespace

from .conftest import E2EStack, run_manifest
from .test_tenants import append_scenario

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
APISERVICE = "v1alpha1.trajectory.agentrun.dev"
SERVICE_NAMESPACE = "agentrun-trajectory-e2e"
SERVICE = "agentrun-trajectory"
IDENTITY = "agentrun-trajectory"
"""The server's Kubernetes user (its client certificate's common name)."""


def host_address() -> str | None:
    """A non-loopback IPv4 address of this machine (the API server refuses loopback
    endpoints), or None."""
    result = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "scope", "global"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    for line in result.stdout.splitlines():
        fields = line.split()
        if "inet" in fields:
            return fields[fields.index("inet") + 1].split("/")[0]
    return None


@dataclasses.dataclass(frozen=True)
class TrajectoryApi:
    """The running server and how to reach the API server as a user."""

    server: components.Component
    control_plane: controlplane.ControlPlane
    workdir: Path

    def user_env(self, user: str) -> dict[str, str]:
        """kubectl's environment as ``user`` (a client certificate of the cluster's CA): the
        plugin on PATH, no NATS variable at all."""
        cert, key = certs.issue_client_cert(
            self.control_plane.pki, name=f"user-{user}", common_name=user
        )
        kubeconfig = self.workdir / f"{user}.kubeconfig"
        controlplane.write_kubeconfig(
            kubeconfig, server=self.control_plane.server, pki=self.control_plane.pki,
            client=(cert, key),
        )  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRUN_NATS")}
        return {
            **env,
            "KUBECONFIG": str(kubeconfig),
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        }


def _rbac(kubectl: Kubectl) -> None:
    """The server's grants, as the chart gives its ServiceAccount."""
    subject = [{"kind": "User", "name": IDENTITY, "apiGroup": "rbac.authorization.k8s.io"}]
    docs = [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": f"{IDENTITY}-auth-reader", "namespace": "kube-system"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": "extension-apiserver-authentication-reader"},
         "subjects": subject},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": f"{IDENTITY}-auth-delegator"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "system:auth-delegator"},
         "subjects": subject},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": f"{IDENTITY}-tenants"},
         "rules": [{"apiGroups": ["agentrun.dev"], "resources": ["agenttenants"],
                    "verbs": ["get", "list", "watch"]},
                   {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": f"{IDENTITY}-tenants"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": f"{IDENTITY}-tenants"},
         "subjects": subject},
    ]  # fmt: skip
    kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))


def _register(kubectl: Kubectl, *, address: str, port: int, ca: Path) -> None:
    """Service, Endpoints and EndpointSlice at ``address:port``, and the APIService."""
    ports = [{"name": "https", "port": port, "protocol": "TCP"}]
    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": SERVICE, "namespace": SERVICE_NAMESPACE},
         "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]}},
        {"apiVersion": "v1", "kind": "Endpoints",
         "metadata": {"name": SERVICE, "namespace": SERVICE_NAMESPACE},
         "subsets": [{"addresses": [{"ip": address}], "ports": ports}]},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": f"{SERVICE}-1", "namespace": SERVICE_NAMESPACE,
                      "labels": {"kubernetes.io/service-name": SERVICE}},
         "addressType": "IPv4", "ports": ports,
         "endpoints": [{"addresses": [address], "conditions": {"ready": True}}]},
        {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
         "metadata": {"name": APISERVICE},
         "spec": {"group": "trajectory.agentrun.dev", "version": "v1alpha1",
                  "groupPriorityMinimum": 1000, "versionPriority": 15,
                  "caBundle": base64.b64encode(ca.read_bytes()).decode(),
                  "service": {"name": SERVICE, "namespace": SERVICE_NAMESPACE, "port": 443}}},
    ]  # fmt: skip
    kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))


def _wait_available(kubectl: Kubectl, *, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    conditions: list[dict[str, Any]] = []
    while time.monotonic() < end:
        found = json.loads(kubectl("get", "apiservice", APISERVICE, "-o", "json").stdout)
        conditions = (found.get("status") or {}).get("conditions") or []
        if any(c["type"] == "Available" and c["status"] == "True" for c in conditions):
            return
        time.sleep(0.5)
    raise AssertionError(f"{APISERVICE} is not Available after {timeout}s: {conditions}")


@pytest.fixture(scope="module")
def trajectory_api(
    e2e: E2EStack, control_plane: Any, nats_server: Any, kubectl: Kubectl,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[TrajectoryApi]:  # fmt: skip
    """The trajectory API server, registered with the suite's API server."""
    if not isinstance(control_plane, controlplane.ControlPlane):
        pytest.skip("needs the suite's own control plane (its CA signs the users)")
    address = host_address()
    if address is None:
        pytest.fail("this machine has no non-loopback IPv4 address for the Service endpoint")
    workdir = tmp_path_factory.mktemp("trajectory-api")
    tls = certs.generate_server_tls(
        workdir / "tls", common_name=SERVICE,
        dns_names=[f"{SERVICE}.{SERVICE_NAMESPACE}.svc"], ips=[address],
    )  # fmt: skip
    cert, key = certs.issue_client_cert(control_plane.pki, name=IDENTITY, common_name=IDENTITY)
    own_kubeconfig = workdir / "server.kubeconfig"
    controlplane.write_kubeconfig(
        own_kubeconfig, server=control_plane.server, pki=control_plane.pki, client=(cert, key)
    )
    authority = nats_server.authority()
    (workdir / "reader-signer.nk").write_text(authority.signers[Role.READER].seed)
    (workdir / "account.pub").write_text(authority.account.public)
    _rbac(kubectl)
    kubectl("create", "namespace", SERVICE_NAMESPACE, check=False)
    port = probes.free_port()
    argv = [
        str(BIN / "agentrun-trajectory"), f"--bind-address={address}", f"--secure-port={port}",
        f"--tls-cert-file={tls.cert}", f"--tls-private-key-file={tls.key}",
        f"--reader-signer-file={workdir / 'reader-signer.nk'}",
        f"--account-file={workdir / 'account.pub'}",
    ]  # fmt: skip
    env = {
        "KUBECONFIG": str(own_kubeconfig),
        "AGENTRUN_NATS_URL": e2e.env["AGENTRUN_NATS_URL"],
        "AGENTRUN_NATS_CA_FILE": e2e.env["AGENTRUN_NATS_CA_FILE"],
        "PYTHONUNBUFFERED": "1",
    }
    probe = probes.Probe(url=f"https://{address}:{port}/healthz", expect="ok", ca_file=tls.ca_cert)
    server = e2e.launch.start(
        e2e.launch.spec("agentrun-trajectory", argv, env=env), probe=probe, ports={"https": port}
    )
    try:
        _register(kubectl, address=address, port=port, ca=tls.ca_cert)
        _wait_available(kubectl)
        yield TrajectoryApi(server, control_plane, workdir)
    finally:
        kubectl("delete", "apiservice", APISERVICE, "--ignore-not-found")
        components.stop_component(server)


@pytest.fixture(scope="module")
def view_role(
    kubectl: Kubectl, helm_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The chart's ``agentrun-view`` ClusterRole, rendered by helm and applied."""
    offline = helm.Helm(helm_binary, home=tmp_path_factory.mktemp("helm-home"))
    docs = [
        d
        for d in yaml.safe_load_all(offline.template(REPO / "charts" / "agentrun"))
        if d and d["kind"] == "ClusterRole" and d["metadata"]["name"] == "agentrun-view"
    ]
    assert len(docs) == 1
    kubectl("apply", "-f", "-", input=yaml.safe_dump(docs[0]))
    yield "agentrun-view"


@pytest.fixture
def other_namespace(kubectl: Kubectl) -> Iterator[str]:
    name = create_namespace(kubectl)
    yield name
    delete_namespace(kubectl, name)


def logs(env: dict[str, str], kubectl: Kubectl, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(kubectl.binary), "agentrun", "logs", *args],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_a_viewer_reads_their_namespace_and_is_refused_in_another(
    stack_: E2EStack,
    trajectory_api: TrajectoryApi,
    view_role: str,
    kubectl: Kubectl,
    test_namespace: str,
    other_namespace: str,
) -> None:
    append_scenario(
        stack_,
        {
            "name": "trajectory-api-read",
            "match": {"goal": "E2E-TRAJECTORY-API-READ"},
            "turns": [
                {"tool_calls": [{"name": "calculate", "arguments": {"expression": "3*4"}}]},
                {"content": "12."},
            ],
        },
    )
    for namespace in (test_namespace, other_namespace):
        stack_.apply(namespace, run_manifest("done", "E2E-TRAJECTORY-API-READ"))
    kubectl("create", "rolebinding", "vera-view", f"--clusterrole={view_role}", "--user=vera",
            "-n", test_namespace)  # fmt: skip
    # the run readable in B too: only the trajectory API may refuse (not the AgentRun's get)
    kubectl("create", "role", "runs-only", "--verb=get", "--resource=agentruns.agentrun.dev",
            "-n", other_namespace)  # fmt: skip
    kubectl("create", "rolebinding", "vera-runs", "--role=runs-only", "--user=vera",
            "-n", other_namespace)  # fmt: skip
    for namespace in (test_namespace, other_namespace):
        stack_.wait_terminal(namespace, "done")
    env = trajectory_api.user_env("vera")
    assert not any(k.startswith("AGENTRUN_NATS") for k in env)

    read = logs(env, kubectl, "done", "-n", test_namespace)
    assert read.returncode == 0, read.stderr
    assert read.stderr == ""  # the API, not the NATS fallback (which says so on stderr)
    lines = read.stdout.rstrip().splitlines()
    assert "admitted in tenant" in lines[0]
    assert lines[-1][9:].startswith("end   Succeeded completed (ok)"), read.stdout
    as_json = logs(env, kubectl, "done", "-n", test_namespace, "-o", "json")
    kinds = [json.loads(line)["kind"] for line in as_json.stdout.splitlines()]
    assert kinds[0] == "admitted" and kinds[-1] == "turn", as_json.stdout

    refused = logs(env, kubectl, "done", "-n", other_namespace)
    assert refused.returncode == 1 and refused.stdout == ""
    assert "Error from server (Forbidden)" in refused.stderr
    assert 'agentruntrajectories.trajectory.agentrun.dev "done" is forbidden' in refused.stderr
    assert f'in the namespace "{other_namespace}"' in refused.stderr
    assert "NATS" not in refused.stderr
    # its grants let it list and watch the AgentTenants it shares its places by
    served = trajectory_api.server.spec.log_path.read_text()
    assert "sharing by AgentTenant" in served and "cannot read the AgentTenants" not in served


def test_the_server_refuses_anyone_but_the_front_proxy(
    trajectory_api: TrajectoryApi, test_namespace: str
) -> None:
    """A client reaching the server directly, even with the cluster admin's certificate and
    a forged ``X-Remote-User``, is refused 401: only the request-header CA's proxy counts."""
    base = trajectory_api.server.spec.argv
    address = next(a.split("=", 1)[1] for a in base if a.startswith("--bind-address="))
    url = (
        f"https://{address}:{trajectory_api.server.ports['https']}/apis/trajectory.agentrun.dev"
        f"/v1alpha1/namespaces/{test_namespace}/agentruntrajectories/done"
    )
    pki = trajectory_api.control_plane.pki
    for client in ([], ["--cert", str(pki.admin_cert), "--key", str(pki.admin_key)]):
        result = subprocess.run(
            ["curl", "-sk", *client, "-H", "X-Remote-User: system:admin",
             "-H", "X-Remote-Group: system:masters", "-w", "\n%{http_code}", url],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        body, _, code = result.stdout.rpartition("\n")
        if client:  # a certificate the request-header CA did not sign: TLS itself refuses
            assert code in ("000", "401"), result.stdout + result.stderr
            continue
        assert code == "401", result.stdout
        assert json.loads(body)["reason"] == "Unauthorized"


def test_follow_prints_a_live_run_to_its_end(
    stack_: E2EStack,
    trajectory_api: TrajectoryApi,
    view_role: str,
    kubectl: Kubectl,
    test_namespace: str,
) -> None:
    # four turns of 3.5 s: the follower (kubectl, the plugin's Python start, the aggregated
    # API) is up and printing while the run goes on a loaded machine too
    slow_turn = {
        "tool_calls": [{"name": "sleep", "arguments": {"seconds": 3.0}}],
        "latency_ms": 500,
        "usage": {"prompt_tokens": 40, "completion_tokens": 10},
    }
    append_scenario(
        stack_,
        {
            "name": "trajectory-api-live",
            "match": {"goal": "E2E-TRAJECTORY-API-LIVE"},
            "turns": [*[slow_turn] * 4, {"content": "Done live.", "usage": slow_turn["usage"]}],
        },
    )
    kubectl("create", "rolebinding", "fred-view", f"--clusterrole={view_role}", "--user=fred",
            "-n", test_namespace)  # fmt: skip
    env = trajectory_api.user_env("fred")
    stack_.apply(test_namespace, run_manifest("live", "E2E-TRAJECTORY-API-LIVE"))
    follower = subprocess.Popen(
        [str(kubectl.binary), "agentrun", "logs", "live", "-f", "-n", test_namespace],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    arrivals: list[float] = []
    ended: list[float] = []

    def read() -> None:
        assert follower.stdout is not None
        for line in follower.stdout:
            arrivals.append(time.monotonic())
            printed.append(line.rstrip("\n"))

    printed: list[str] = []
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    status: dict[str, Any] = {}
    while not status.get("terminalReason") and follower.poll() is None:
        status = (stack_.get(test_namespace, "live") or {}).get("status") or {}
        time.sleep(0.1)
    ended.append(time.monotonic())
    assert follower.wait(timeout=60) == 0, follower.stderr.read() if follower.stderr else ""
    reader.join(timeout=10)
    err = follower.stderr.read() if follower.stderr else ""
    assert err == "", err
    # it followed: the first turn was printed while the run still ran (a run of ~14 s)
    assert arrivals and arrivals[0] < ended[0], printed
    status = (stack_.get(test_namespace, "live") or {}).get("status") or {}
    assert status.get("terminalReason") == "completed"
    out = "\n".join(printed)
    lines = out.rstrip().splitlines()
    turns = [line for line in lines if line[9:].startswith("turn ")]
    assert len(turns) == 5, out
    assert lines[-1][9:].startswith("end   Succeeded completed (ok): 5 steps, 4 tool calls"), out
    assert lines[-1].endswith("answer: Done live.")
