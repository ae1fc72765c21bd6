"""A local Kubernetes control plane (etcd + kube-apiserver, no controller-manager), or an
existing cluster named by ``KUBECONFIG``.

`start_control_plane` starts etcd and kube-apiserver on free loopback ports, with a generated
PKI (see `certs`), RBAC authorization and service-account signing, and writes an admin
kubeconfig. There is no controller-manager or scheduler: objects are stored and served, pods
never run, and a deleted namespace stays Terminating. That is enough for CRDs, an operator
and kubectl. Reads of Secrets are written to an audit log (``ControlPlane.audit_log``, JSON
lines of the API server's ``audit.k8s.io/v1`` Events at level Metadata; nothing else is
audited), so a test can show which identity read which Secret, and that none was read.

With ``node=True`` the same control plane is made ready for a real node (see `node`): the
apiserver also listens on non-loopback addresses (pods reach it through the ``kubernetes``
Service at the node's IP), authorizes kubelets with the Node authorizer and NodeRestriction,
gives pods service-account tokens (the ServiceAccount admission plugin; the node's
controller-manager creates the ``default`` ServiceAccounts it requires), and reaches kubelets
by their InternalIP with a client certificate, for ``kubectl logs`` / ``exec``. Without it the
flags are exactly the process-only ones.

`open_cluster` picks the existing cluster instead when ``AGENTRUN_USE_EXISTING_CLUSTER=1`` and
``KUBECONFIG`` are set. Both variants offer the same attributes (`Cluster`).

What belongs here: starting and describing the cluster; kubectl calls live in `kubectl`.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import yaml

from agentrun_dev import binaries, certs, components, console, probes

USE_EXISTING_ENV = "AGENTRUN_USE_EXISTING_CLUSTER"
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/24"
KUBERNETES_SERVICE_IP = "10.96.0.1"
"""ClusterIP of the ``kubernetes`` Service: the first address of the range."""


class ClusterError(RuntimeError):
    """The cluster could not be started or reached; the message says why and what to do."""


class Cluster(Protocol):
    """What tests and the stack need from a cluster, local or existing."""

    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig file."""
        ...

    @property
    def kubectl(self) -> Path:
        """kubectl binary to drive the cluster with."""
        ...

    @property
    def env(self) -> dict[str, str]:
        """Environment for processes that talk to the cluster: ``{"KUBECONFIG": …}``."""
        ...

    @property
    def components(self) -> tuple[components.Component, ...]:
        """Processes we started for it, in start order (empty for an existing cluster)."""
        ...

    def stop(self) -> None:
        """Stop what we started (nothing for an existing cluster)."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class ControlPlane:
    """A running local etcd + kube-apiserver."""

    kubeconfig: Path
    kubectl: Path
    server: str
    """API server URL, ``https://127.0.0.1:<port>``."""
    components: tuple[components.Component, ...]
    """etcd, then kube-apiserver."""
    pki: certs.Pki
    """Its certificates; a node issues its components' client certificates from this CA."""
    node_ready: bool = False
    """Started with ``node=True`` (see the module docstring)."""
    audit_log: Path | None = None
    """JSON lines, one ``audit.k8s.io/v1`` Event per request on a Secret (level Metadata)."""

    @property
    def env(self) -> dict[str, str]:
        """``{"KUBECONFIG": <path>}`` for child processes."""
        return {"KUBECONFIG": str(self.kubeconfig)}

    def stop(self) -> None:
        """Stop kube-apiserver, then etcd, by pid (SIGTERM, then SIGKILL after 10 s)."""
        for component in reversed(self.components):
            components.stop_component(component)


@dataclasses.dataclass(frozen=True, slots=True)
class ExistingCluster:
    """A cluster we did not start, reached through the ``KUBECONFIG`` the user gave."""

    kubeconfig: Path
    """The first file of ``KUBECONFIG``."""
    kubectl: Path
    kubeconfig_env: str
    """``KUBECONFIG`` as given (possibly several files joined by ':')."""
    components: tuple[components.Component, ...] = ()

    @property
    def env(self) -> dict[str, str]:
        """``{"KUBECONFIG": <as given>}`` for child processes."""
        return {"KUBECONFIG": self.kubeconfig_env}

    def stop(self) -> None:
        """Nothing to stop: the cluster is not ours."""


def existing_cluster_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``AGENTRUN_USE_EXISTING_CLUSTER=1`` and ``KUBECONFIG`` are both set."""
    env = os.environ if environ is None else environ
    return env.get(USE_EXISTING_ENV, "") == "1" and bool(env.get("KUBECONFIG", "").strip())


def open_cluster(
    workdir: Path, *, launch: components.Launch | None = None, node: bool = False
) -> ControlPlane | ExistingCluster:
    """The existing cluster if requested (see `existing_cluster_requested`), else a new
    local control plane with its files under `workdir` (see `start_control_plane`; `node`
    makes it ready for a node).

    Raises ClusterError, probes.NotReadyError, binaries.BinariesError or gobuild.BuildError.
    """
    launch = components.Launch(log_dir=workdir / "logs") if launch is None else launch
    if existing_cluster_requested():
        return use_existing_cluster(log=launch.log)
    executables = binaries.ensure_binaries(log=launch.log)
    return start_control_plane(workdir, executables=executables, launch=launch, node=node)


def use_existing_cluster(*, log: console.Log = console.log_to_stderr) -> ExistingCluster:
    """The cluster of ``KUBECONFIG``, checked to answer ``/readyz``.

    Raises ClusterError if ``KUBECONFIG`` is unset or the cluster does not answer.
    """
    value = os.environ.get("KUBECONFIG", "").strip()
    if not value:
        raise ClusterError(f"{USE_EXISTING_ENV}=1 needs KUBECONFIG to name the cluster")
    kubectl = binaries.find_kubectl(log=log)
    result = subprocess.run(
        [str(kubectl), "get", "--raw", "/readyz"],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    if result.returncode != 0:
        raise ClusterError(
            f"the cluster of KUBECONFIG={value} does not answer /readyz: {result.stderr.strip()}"
        )
    log(f"using the existing cluster of KUBECONFIG={value}")
    return ExistingCluster(
        kubeconfig=Path(value.split(os.pathsep)[0]), kubectl=kubectl, kubeconfig_env=value
    )


def start_control_plane(
    workdir: Path,
    *,
    executables: binaries.Binaries,
    launch: components.Launch | None = None,
    ready_timeout: float = 60.0,
    node: bool = False,
) -> ControlPlane:
    """Start etcd and kube-apiserver with their state, certificates and kubeconfig in `workdir`.

    Args:
        workdir: directory for ``etcd/``, ``pki/`` and ``kubeconfig`` (created).
        executables: the binaries (see `binaries.ensure_binaries`).
        launch: log directory (default ``workdir/logs``), lifetime and progress output.
        ready_timeout: seconds to wait for each of etcd ``/health`` and apiserver ``/readyz``.
        node: add the flags a real node needs (see the module docstring).

    Raises:
        probes.NotReadyError: a process exited or was not ready in time; the message holds its
            log tail. Whatever was started is stopped first.
    """
    launch = components.Launch(log_dir=workdir / "logs") if launch is None else launch
    workdir.mkdir(parents=True, exist_ok=True)
    pki = certs.generate_pki(workdir / "pki", extra_ips=[KUBERNETES_SERVICE_IP])
    etcd = _start_etcd(workdir, executables.etcd, launch=launch, timeout=ready_timeout)
    try:
        apiserver = _start_apiserver(
            executables.kube_apiserver,
            workdir=workdir,
            pki=pki,
            etcd_url=f"http://127.0.0.1:{etcd.ports['client']}",
            launch=launch,
            timeout=ready_timeout,
            node=node,
        )
    except BaseException:
        components.stop_component(etcd)
        raise
    server = f"https://127.0.0.1:{apiserver.ports['secure']}"
    kubeconfig = workdir / "kubeconfig"
    write_kubeconfig(kubeconfig, server=server, pki=pki)
    return ControlPlane(
        kubeconfig=kubeconfig,
        kubectl=executables.kubectl,
        server=server,
        components=(etcd, apiserver),
        pki=pki,
        node_ready=node,
        audit_log=_audit_paths(workdir)[1],
    )


def _aggregation_flags(pki: certs.Pki) -> tuple[str, ...]:
    """The aggregation layer's front proxy (Kubernetes docs, "Configure the Aggregation
    Layer"): the kube-apiserver proxies to an APIService's server with the front-proxy client
    certificate and the user in ``X-Remote-*`` headers, and publishes the request-header CA and
    names in ``kube-system/extension-apiserver-authentication``. It dials the Service's
    endpoint IPs itself (no kube-proxy in a process-only stack)."""
    return (
        f"--requestheader-client-ca-file={pki.front_proxy_ca}",
        f"--requestheader-allowed-names={certs.FRONT_PROXY_CLIENT}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki.front_proxy_cert}",
        f"--proxy-client-key-file={pki.front_proxy_key}",
        "--enable-aggregator-routing=true",
    )


WATCH_DRAIN_SECONDS = 3
"""Seconds kube-apiserver takes at most, once stopped, to close its open watches."""

AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    resources:
      - group: ""
        resources: [secrets]
  - level: None
"""
"""Requests on Secrets at level Metadata (who, which verb, which Secret: never its data)."""


def _audit_paths(workdir: Path) -> tuple[Path, Path]:
    """The audit policy file and the audit log of the control plane in ``workdir``."""
    return workdir / "audit-policy.yaml", workdir / "audit.log"


def write_kubeconfig(
    path: Path, *, server: str, pki: certs.Pki, client: tuple[Path, Path] | None = None
) -> None:
    """Write a self-contained kubeconfig (certificates embedded, mode 0600).

    The user is the admin unless `client` names another (certificate, key) pair, e.g. one
    from `certs.issue_client_cert`.
    """
    cert, key = (pki.admin_cert, pki.admin_key) if client is None else client

    def b64(file: Path) -> str:
        return base64.b64encode(file.read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "agentrun-dev",
                "cluster": {"server": server, "certificate-authority-data": b64(pki.ca_cert)},
            }
        ],
        "users": [
            {
                "name": "agentrun-admin",
                "user": {
                    "client-certificate-data": b64(cert),
                    "client-key-data": b64(key),
                },
            }
        ],
        "contexts": [
            {
                "name": "agentrun-dev",
                "context": {"cluster": "agentrun-dev", "user": "agentrun-admin"},
            }
        ],
        "current-context": "agentrun-dev",
    }
    path.touch(mode=0o600)
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def _start_etcd(
    workdir: Path, binary: Path, *, launch: components.Launch, timeout: float
) -> components.Component:
    client, peer = probes.free_port(), probes.free_port()
    argv = (
        str(binary),
        "--name=agentrun-dev",
        f"--data-dir={workdir / 'etcd'}",
        f"--listen-client-urls=http://127.0.0.1:{client}",
        f"--advertise-client-urls=http://127.0.0.1:{client}",
        f"--listen-peer-urls=http://127.0.0.1:{peer}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
        f"--initial-cluster=agentrun-dev=http://127.0.0.1:{peer}",
        "--unsafe-no-fsync=true",  # a throw-away store: durability is not needed
        "--log-level=warn",
    )
    probe = probes.Probe(url=f"http://127.0.0.1:{client}/health", expect='"health":"true"')
    return launch.start(
        launch.spec("etcd", argv),
        probe=probe,
        ports={"client": client, "peer": peer},
        ready_timeout=timeout,
    )


def _start_apiserver(
    binary: Path,
    *,
    workdir: Path,
    pki: certs.Pki,
    etcd_url: str,
    launch: components.Launch,
    timeout: float,
    node: bool,
) -> components.Component:
    port = probes.free_port()
    policy, audit_log = _audit_paths(workdir)
    policy.write_text(AUDIT_POLICY)
    argv: tuple[str, ...] = (
        str(binary),
        f"--etcd-servers={etcd_url}",
        f"--audit-policy-file={policy}",
        f"--audit-log-path={audit_log}",
        "--audit-log-format=json",
        f"--bind-address={'0.0.0.0' if node else '127.0.0.1'}",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={workdir / 'apiserver'}",
        f"--tls-cert-file={pki.serving_cert}",
        f"--tls-private-key-file={pki.serving_key}",
        f"--client-ca-file={pki.ca_cert}",
        f"--authorization-mode={'Node,RBAC' if node else 'RBAC'}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki.service_account_pub}",
        f"--service-account-signing-key-file={pki.service_account_key}",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        "--allow-privileged=true",
        # On SIGTERM, close open watches within this grace: by default kube-apiserver leaves
        # them to the HTTP server's shutdown, which outlasts the stop's 10 s, so a stack
        # stopped while a `kubectl get -w` was open needed SIGKILL.
        f"--shutdown-watch-termination-grace-period={WATCH_DRAIN_SECONDS}s",
        # The "kubernetes" Service's endpoint would be 127.0.0.1, which Endpoints reject; a
        # node writes its own (its IP and this port).
        "--endpoint-reconciler-type=none",
        *_aggregation_flags(pki),
    )
    if node:
        kubelet_cert, kubelet_key = certs.issue_client_cert(
            pki, name="apiserver-kubelet-client", common_name="kube-apiserver-kubelet-client",
            organization="system:masters",
        )  # fmt: skip
        argv += (
            "--enable-admission-plugins=NodeRestriction",
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={kubelet_cert}",
            f"--kubelet-client-key={kubelet_key}",
        )
    else:
        # No controller-manager creates the "default" ServiceAccount, which this
        # admission plugin would require of every pod.
        argv += ("--disable-admission-plugins=ServiceAccount",)
    probe = probes.Probe(
        url=f"https://127.0.0.1:{port}/readyz",
        expect="ok",
        ca_file=pki.ca_cert,
        cert_file=pki.admin_cert,
        key_file=pki.admin_key,
    )
    return launch.start(
        launch.spec("kube-apiserver", argv),
        probe=probe,
        ports={"secure": port},
        ready_timeout=timeout,
    )
