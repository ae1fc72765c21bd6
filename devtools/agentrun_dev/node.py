"""A real single-node cluster on this machine, joined to a local control plane.

`start_node` adds, to a control plane started with ``node=True`` (see `controlplane`):

- containerd + runc + the CNI bridge network (see `containerd`), with the locally built pause
  image (see `nodeimages`) as the pod sandbox;
- kube-controller-manager (service-account tokens and the ``kube-root-ca.crt`` ConfigMap come
  from it, with the control plane's service-account key and CA), kube-scheduler;
- a kubelet (``cgroupfs``, swap allowed, hard eviction thresholds at 0 %, image GC only at
  100 % disk) whose node IP is the pod bridge's gateway `nodehost.GATEWAY` (the kubelet
  rejects loopback), authenticating with a client certificate ``system:node:<name>``;
- kube-proxy in iptables mode, and CoreDNS as a host process on the gateway address behind
  the ``kube-dns`` Service at `CLUSTER_DNS_IP`;
- kube-router with only its NetworkPolicy controller (``--run-firewall``; no routing, no
  service proxy), so NetworkPolicies are enforced with iptables rules and ipsets, beside
  kube-proxy. (kind's own enforcer, ``sigs.k8s.io/kube-network-policies``, needs the kernel's
  nftables ``queue`` expression, ``CONFIG_NFT_QUEUE``, which not every kernel has; kube-router
  needs only iptables, ipset and the xt_set match.) It authenticates as ``system:kube-router``
  with the read-only ClusterRole `KUBE_ROUTER_ROLE`;
- the ``kubernetes`` Service's EndpointSlice pointing at the API server through the gateway,
  so in-cluster clients reach it.

Every process is a `components.Component` stopped by pid. `stop_node` first stops the
controllers, force-deletes the node's pods and waits for the kubelet to tear them down (CNI
DEL removes veths and portmap rules), then stops the rest, runs ``kube-proxy --cleanup``,
kills any container left by the pids its shim recorded, and removes every mount, device,
iptables rule, ipset, nftables table and sysctl change the node made (see `nodehost`),
returning what it could not.

Images are never pulled: `import_image` loads an archive into the node's containerd, and pods
use ``imagePullPolicy: Never`` or ``IfNotPresent``.

What belongs here: the node's Kubernetes components and their order. Host state is
`nodehost`'s, containerd's config `containerd`'s, image building `nodeimages`'.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

from agentrun_dev import (
    binaries,
    certs,
    components,
    console,
    containerd,
    controlplane,
    kubectl,
    nodehost,
    nodeimages,
    probes,
    procs,
)

NODE_NAME = "agentrun-node"
CLUSTER_DNS_IP = "10.96.0.10"
CLUSTER_DOMAIN = "cluster.local"
COMPONENT_NAMES = (
    "containerd",
    "kube-controller-manager",
    "kube-scheduler",
    "coredns",
    "kubelet",
    "kube-proxy",
    "kube-router",
)
"""The node's components, in start order."""
KUBE_ROUTER_ROLE = "agentrun-node:kube-router"
"""The ClusterRole (and ClusterRoleBinding) of the NetworkPolicy enforcer: it watches pods,
namespaces, nodes, services, endpoints, EndpointSlices and NetworkPolicies, writes nothing."""
_SNAPSHOT = "host-before.json"
_MANAGED_BY = "agentrun.dev-node"


class NodeError(RuntimeError):
    """The node did not become Ready, or the control plane cannot host one."""


@dataclasses.dataclass(frozen=True, slots=True)
class Node:
    """A running single node."""

    directory: Path
    """Its state: containerd, kubelet, certificates, kubeconfigs, configs."""
    name: str
    ip: str
    """The node's InternalIP (the pod bridge's gateway)."""
    kubectl: kubectl.Kubectl
    """Admin kubectl of the control plane it joined."""
    components: tuple[components.Component, ...]
    """In `COMPONENT_NAMES` order."""

    def import_image(self, archive: Path, *, log: console.Log = console.discard) -> None:
        """Import an image archive into the node's containerd (see `containerd.import_image`)."""
        containerd.import_image(self.directory, archive, log=log)

    def stop(self, *, log: console.Log = console.log_to_stderr) -> list[str]:
        """Stop it and clean the host (see `stop_node`); returns what is left (empty: clean)."""
        return stop_node(self.directory, self.components, admin=self.kubectl, log=log)


@dataclasses.dataclass(frozen=True, slots=True)
class _Context:
    """What every component start needs."""

    directory: Path
    cluster: controlplane.ControlPlane
    executables: binaries.NodeBinaries
    launch: components.Launch


def start_node(
    directory: Path,
    *,
    cluster: controlplane.ControlPlane,
    executables: binaries.NodeBinaries,
    launch: components.Launch,
    ready_timeout: float = 180.0,
    claim_wait: float = 0.0,
) -> Node:
    """Start a node in `directory` joined to `cluster`, and wait until it is Ready.

    Args:
        directory: the node's state directory (created).
        cluster: a local control plane started with ``node=True``.
        executables: see `binaries.ensure_node_binaries`.
        launch: log directory, lifetime and progress output of the node's processes.
        ready_timeout: seconds to wait for the Node to be Ready and the ``default``
            ServiceAccount to exist.
        claim_wait: seconds to wait for another node on this machine to stop (one whose
            claim this process sees, or one of another mount namespace sharing this network
            namespace, seen by its bridge).

    Raises:
        NodeError: the control plane was not started for a node, or the node was not Ready
            in time.
        nodehost.HostError: another node runs here, or a host command failed.
        containerd.ContainerdError, nodeimages.ImageBuildError, probes.NotReadyError: a step
            failed. Whatever was started is stopped and the host cleaned first.
    """
    if not cluster.node_ready:
        raise NodeError("the control plane was not started with node=True")
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    admin = kubectl.Kubectl.for_cluster(cluster)
    began = time.monotonic()
    stale = nodehost.claim_host(
        directory, owner=_this_process(launch.log_dir), wait=claim_wait, log=launch.log
    )
    if stale is not None:
        launch.log(f"the node in {stale} died without cleaning up: cleaning after it")
        clean_stale(stale, log=launch.log)
    else:
        try:
            clean_orphans(log=launch.log, wait=max(0.0, claim_wait - (time.monotonic() - began)))
        except BaseException:
            nodehost.release_host(directory)
            raise
    before = nodehost.take_snapshot(directory)
    (directory / _SNAPSHOT).write_text(json.dumps(before.as_dict()))
    started: list[components.Component] = []
    try:
        nodehost.create_bridge()
        pause = nodeimages.pause_image(log=launch.log)
        context = _Context(directory, cluster, executables, launch)
        started.append(
            containerd.start_containerd(directory, sandbox_image=pause.name, launch=launch)
        )
        nodehost.update_claim(directory, owner=started[0].record)
        containerd.import_image(directory, pause.archive, log=launch.log)
        started.append(_start_controller_manager(context))
        started.append(_start_scheduler(context))
        _publish_services(admin, apiserver_port=_apiserver_port(cluster))
        started.append(_start_coredns(context))
        started.append(_start_kubelet(context))
        started.append(_start_kube_proxy(context))
        _wait_ready(admin, timeout=ready_timeout, log=launch.log)
        # after the Node object exists: kube-router reads its address at start
        _grant_kube_router(admin)
        started.append(_start_kube_router(context))
        launch.log(f"node {NODE_NAME} Ready in {time.monotonic() - began:.1f} s")
    except BaseException:
        launch.log("node start failed: stopping what was started")
        stop_node(directory, tuple(started), admin=admin, log=launch.log)
        raise
    return Node(directory, NODE_NAME, nodehost.GATEWAY, admin, tuple(started))


def stop_node(
    directory: Path,
    started: Sequence[components.Component],
    *,
    admin: kubectl.Kubectl | None,
    log: console.Log = console.log_to_stderr,
) -> list[str]:
    """Stop the node's components by pid and undo its host changes (see the module doc).

    Args:
        directory: the node's state directory.
        started: its components (any subset of `COMPONENT_NAMES`, e.g. after a failed start).
        admin: admin kubectl of its control plane, to delete its pods and its Node while
            the API server still runs; None skips that (the kubelet then cannot tear pods
            down, and their containers are killed by pid).
        log: receives progress lines.

    Returns the host state still left (`nodehost.leftovers`; empty when clean). Never raises
    for a cleanup step; every step runs.
    """
    by_name = {c.name: c for c in started}
    for name in ("kube-controller-manager", "kube-scheduler"):
        _stop(by_name.get(name), log=log)
    kubelet = by_name.get("kubelet")
    if admin is not None and kubelet is not None and kubelet.is_alive():
        _drain(admin, directory, log=log)
    for name in ("kubelet", "kube-proxy", "kube-router", "coredns"):
        _stop(by_name.get(name), log=log)
    proxy = by_name.get("kube-proxy")
    if proxy is not None:
        _kube_proxy_cleanup(Path(proxy.spec.argv[0]), log=log)
    killed = containerd.stop_containers(directory)
    if killed:
        log(f"killed {killed} container processes left by the kubelet")
        time.sleep(0.5)
    _stop(by_name.get("containerd"), log=log)
    if admin is not None:
        admin("delete", "node", NODE_NAME, "--wait=false", "--ignore-not-found", check=False)
    left = _clean_host(directory, log=log)
    nodehost.release_host(directory)
    if left:
        log("the node left behind:\n  " + "\n  ".join(left))
    return left


def _clean_host(directory: Path, *, log: console.Log) -> list[str]:
    try:
        before = nodehost.HostSnapshot.from_dict(json.loads((directory / _SNAPSHOT).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        log(f"no host snapshot in {directory}: nothing to clean")
        return []
    return nodehost.cleanup_host(directory, before=before, log=log)


def clean_stale(stale: Path, *, log: console.Log) -> None:
    """Clean after a node whose owner died without stopping it (its processes died with it):
    `stale` is its state directory, as `nodehost.claim_host` returns it to whoever takes the
    machine over. Leaves logged, never raised."""
    containerd.stop_containers(stale)
    proxy = binaries.cache_bin_dir() / "kube-proxy"
    if binaries.is_executable(proxy):
        _kube_proxy_cleanup(proxy, log=log)
    left = _clean_host(stale, log=log)
    if left:
        log("could not clean after the dead node:\n  " + "\n  ".join(left))


def clean_orphans(*, log: console.Log, wait: float = 0.0, poll: float = 2.0) -> None:
    """Remove a pod bridge (and its veths, and kube-proxy's rules) that no claim accounts for:
    left by a node that died where this machine's ``/run`` was not ours (another mount
    namespace, e.g. a CI job beside a developer's shell). Call holding the claim, with no
    stale node returned by `nodehost.claim_host`.

    A bridge that may belong to a live node of another mount namespace
    (`nodehost.remove_orphan_bridge` refuses it) is waited out for up to `wait` seconds,
    checked every `poll` seconds: two nodes in one network namespace would take each other's
    bridge, rules and cleanup.

    Raises nodehost.HostError when the bridge may still belong to a live node after `wait`:
    it is kept."""
    removed = nodehost.retry_while_held(
        lambda: nodehost.remove_orphan_bridge(log=log), wait=wait, poll=poll, log=log
    )
    if not removed:
        return
    log(f"removed {', '.join(removed)}: left by a node that no claim here names")
    proxy = binaries.cache_bin_dir() / "kube-proxy"
    if binaries.is_executable(proxy):
        _kube_proxy_cleanup(proxy, log=log)


def _this_process(log_dir: Path) -> procs.ProcessRecord:
    return procs.record_of("node-owner", os.getpid(), log_dir / "node.log")


def _apiserver_port(cluster: controlplane.ControlPlane) -> int:
    return int(cluster.server.rsplit(":", 1)[1])


def _stop(component: components.Component | None, *, log: console.Log) -> None:
    if component is not None:
        outcome = components.stop_component(component)
        log(f"{component.name} (pid {component.record.pid}): {outcome.value}")


def _drain(admin: kubectl.Kubectl, directory: Path, *, log: console.Log) -> None:
    """Force-delete the node's pods and wait (≤ 60 s) until containerd runs no task."""
    log("deleting the node's pods")
    admin(
        "delete", "pods", "--all-namespaces", f"--field-selector=spec.nodeName={NODE_NAME}",
        "--grace-period=0", "--force", "--wait=false", check=False, timeout=60,
    )  # fmt: skip
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        try:
            tasks = containerd.ctr(directory, "tasks", "ls", "-q", timeout=30).split()
        except (containerd.ContainerdError, OSError, subprocess.SubprocessError):
            return
        if not tasks:
            return
        time.sleep(1.0)
    log("the kubelet did not stop every container within 60 s; killing the rest by pid")


def _kube_proxy_cleanup(binary: Path, *, log: console.Log) -> None:
    """``kube-proxy --cleanup``: remove the rules of every proxy mode."""
    try:
        result = subprocess.run(
            [str(binary), "--cleanup"], capture_output=True, text=True, check=False, timeout=120
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log(f"kube-proxy --cleanup failed: {exc}")
        return
    if result.returncode != 0:
        log(f"kube-proxy --cleanup exited {result.returncode}: {result.stderr.strip()[-500:]}")


def _kubeconfig(context: _Context, *, name: str, user: str, group: str | None) -> Path:
    """A kubeconfig for `user` (client certificate from the control plane's CA)."""
    pki = context.cluster.pki
    client = certs.issue_client_cert(pki, name=name, common_name=user, organization=group)
    path = context.directory / "kubeconfigs" / f"{name}.kubeconfig"
    path.parent.mkdir(parents=True, exist_ok=True)
    controlplane.write_kubeconfig(path, server=context.cluster.server, pki=pki, client=client)
    return path


def _start_controller_manager(context: _Context) -> components.Component:
    config = _kubeconfig(
        context, name="kube-controller-manager", user="system:kube-controller-manager", group=None
    )
    port = probes.free_port()
    pki = context.cluster.pki
    argv = (
        *_secure_argv(context.executables.kube_controller_manager, config, port=port),
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={pki.service_account_key}",
        f"--root-ca-file={pki.ca_cert}",
        f"--cluster-signing-cert-file={pki.ca_cert}",
        f"--cluster-signing-key-file={pki.ca_key}",
        "--cluster-name=agentrun-dev",
    )
    return _start_secure(context, "kube-controller-manager", argv, port=port)


def _start_scheduler(context: _Context) -> components.Component:
    config = _kubeconfig(context, name="kube-scheduler", user="system:kube-scheduler", group=None)
    port = probes.free_port()
    argv = _secure_argv(context.executables.kube_scheduler, config, port=port)
    return _start_secure(context, "kube-scheduler", argv, port=port)


def _secure_argv(binary: Path, kubeconfig: Path, *, port: int) -> tuple[str, ...]:
    """The command line a controller-manager and a scheduler share: `kubeconfig` for the API
    and for checking callers, HTTPS on 127.0.0.1:`port`, no leader election."""
    return (
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        "--leader-elect=false",
    )


def _start_secure(
    context: _Context, name: str, argv: tuple[str, ...], *, port: int
) -> components.Component:
    """Start a control-plane component that serves only its secure port (ready once it
    accepts connections there)."""
    return components.start_component(
        context.launch.spec(name, argv),
        probe=probes.Probe(url=f"tcp://127.0.0.1:{port}"),
        ports={"secure": port},
        log=context.launch.log,
    )


def _start_coredns(context: _Context) -> components.Component:
    health, ready = probes.free_port(), probes.free_port()
    corefile = context.directory / "coredns" / "Corefile"
    corefile.parent.mkdir(parents=True, exist_ok=True)
    corefile.write_text(
        f""".:53 {{
    bind {nodehost.GATEWAY}
    errors
    health 127.0.0.1:{health}
    ready 127.0.0.1:{ready}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {context.cluster.kubeconfig} agentrun-dev
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }}
    forward . /etc/resolv.conf
    cache 30
    loop
    loadbalance
}}
"""
    )
    argv = (str(context.executables.coredns), "-conf", str(corefile))
    return components.start_component(
        context.launch.spec("coredns", argv),
        probe=probes.Probe(url=f"http://127.0.0.1:{ready}/ready"),
        ports={"dns": 53, "health": health, "ready": ready},
        ready_timeout=60.0,
        log=context.launch.log,
    )


def _start_kubelet(context: _Context) -> components.Component:
    directory = context.directory / "kubelet"
    directory.mkdir(parents=True, exist_ok=True)
    config = _kubeconfig(
        context, name="kubelet", user=f"system:node:{NODE_NAME}", group="system:nodes"
    )
    port, healthz = probes.free_port(), probes.free_port()
    settings = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": nodehost.GATEWAY,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(context.cluster.pki.ca_cert)},
        },
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "containerRuntimeEndpoint": f"unix://{containerd.socket_path(context.directory)}",
        "failSwapOn": False,
        "evictionHard": {
            "memory.available": "0%",
            "nodefs.available": "0%",
            "nodefs.inodesFree": "0%",
            "imagefs.available": "0%",
        },
        "imageGCHighThresholdPercent": 100,
        "clusterDNS": [CLUSTER_DNS_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        "podLogsDir": str(directory / "pod-logs"),
        "resolvConf": "/etc/resolv.conf",
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
    }
    config_file = directory / "config.yaml"
    config_file.write_text(yaml.safe_dump(settings, sort_keys=False))
    argv = (
        str(context.executables.kubelet),
        f"--config={config_file}",
        f"--kubeconfig={config}",
        f"--root-dir={nodehost.runtime_dir(context.directory) / 'kubelet'}",
        f"--cert-dir={directory / 'pki'}",
        f"--hostname-override={NODE_NAME}",
        f"--node-ip={nodehost.GATEWAY}",
    )
    return components.start_component(
        context.launch.spec("kubelet", argv),
        probe=probes.Probe(url=f"http://127.0.0.1:{healthz}/healthz", expect="ok"),
        ports={"kubelet": port, "healthz": healthz},
        ready_timeout=60.0,
        log=context.launch.log,
    )


def _start_kube_proxy(context: _Context) -> components.Component:
    config = _kubeconfig(context, name="kube-proxy", user="system:kube-proxy", group=None)
    healthz, metrics = probes.free_port(), probes.free_port()
    settings = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(config)},
        "hostnameOverride": NODE_NAME,
        "mode": "iptables",
        "clusterCIDR": nodehost.POD_SUBNET,
        "healthzBindAddress": f"127.0.0.1:{healthz}",
        "metricsBindAddress": f"127.0.0.1:{metrics}",
        # Leave the host's conntrack sysctls alone.
        "conntrack": {"maxPerCore": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        # No route_localnet: NodePorts are not served on 127.0.0.1.
        "iptables": {"localhostNodePorts": False},
    }
    config_file = context.directory / "kube-proxy.yaml"
    config_file.write_text(yaml.safe_dump(settings, sort_keys=False))
    argv = (str(context.executables.kube_proxy), f"--config={config_file}")
    return components.start_component(
        context.launch.spec("kube-proxy", argv),
        probe=probes.Probe(url=f"http://127.0.0.1:{healthz}/livez"),
        ports={"healthz": healthz, "metrics": metrics},
        ready_timeout=60.0,
        log=context.launch.log,
    )


def _grant_kube_router(admin: kubectl.Kubectl) -> None:
    """`KUBE_ROUTER_ROLE`: what kube-router's informers read, bound to ``system:kube-router``."""
    read = ["get", "list", "watch"]
    objects = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": KUBE_ROUTER_ROLE},
            "rules": [
                {"apiGroups": [""], "verbs": read,
                 "resources": ["pods", "namespaces", "nodes", "services", "endpoints"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": read},
                {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
                 "verbs": read},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": KUBE_ROUTER_ROLE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": KUBE_ROUTER_ROLE},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": "system:kube-router"}],
        },
    ]  # fmt: skip
    manifest = yaml.safe_dump_all(objects, sort_keys=False)
    admin("apply", "--server-side", "--force-conflicts", "-f", "-", input=manifest)


def _start_kube_router(context: _Context) -> components.Component:
    """kube-router enforcing NetworkPolicies only; ready once its /healthz answers OK."""
    config = _kubeconfig(context, name="kube-router", user="system:kube-router", group=None)
    health = probes.free_port()
    argv = (
        str(context.executables.kube_router),
        f"--kubeconfig={config}",
        f"--hostname-override={NODE_NAME}",
        "--run-firewall=true",
        "--run-router=false",
        "--run-service-proxy=false",
        "--run-loadbalancer=false",
        "--enable-ipv6=false",
        f"--service-cluster-ip-range={controlplane.SERVICE_CLUSTER_IP_RANGE}",
        f"--health-port={health}",
        "--metrics-port=0",
    )
    return components.start_component(
        context.launch.spec("kube-router", argv),
        probe=probes.Probe(url=f"http://127.0.0.1:{health}/healthz", expect="OK"),
        ports={"healthz": health},
        ready_timeout=60.0,
        log=context.launch.log,
    )


def _publish_services(admin: kubectl.Kubectl, *, apiserver_port: int) -> None:
    """The ``kubernetes`` EndpointSlice (API server via the gateway) and ``kube-dns``."""
    labels = {"endpointslice.kubernetes.io/managed-by": _MANAGED_BY}
    objects = [
        _endpoint_slice(
            "kubernetes", "default", labels=labels,
            ports=[{"name": "https", "port": apiserver_port, "protocol": "TCP"}],
        ),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": "kube-dns", "namespace": "kube-system",
                "labels": {"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"},
            },
            "spec": {
                "clusterIP": CLUSTER_DNS_IP,
                "ports": [
                    {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                    {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
                ],
            },
        },
        _endpoint_slice(
            "kube-dns", "kube-system", labels=labels,
            ports=[
                {"name": "dns", "port": 53, "protocol": "UDP"},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
            ],
        ),
    ]  # fmt: skip
    manifest = yaml.safe_dump_all(objects, sort_keys=False)
    admin("apply", "--server-side", "--force-conflicts", "-f", "-", input=manifest)


def _endpoint_slice(
    service: str, namespace: str, *, labels: dict[str, str], ports: list[dict[str, object]]
) -> dict[str, object]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{service}-node",
            "namespace": namespace,
            "labels": {"kubernetes.io/service-name": service, **labels},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [nodehost.GATEWAY], "conditions": {"ready": True}}],
        "ports": ports,
    }


def _wait_ready(admin: kubectl.Kubectl, *, timeout: float, log: console.Log) -> None:
    """Until the Node is Ready and ``default/default`` ServiceAccount and CA ConfigMap exist."""
    deadline = time.monotonic() + timeout
    checks = {
        "the node is Ready": (
            "get", "node", NODE_NAME, "-o",
            'jsonpath={.status.conditions[?(@.type=="Ready")].status}',
        ),
        "the default ServiceAccount exists": ("get", "serviceaccount", "default", "-o", "name"),
        "kube-root-ca.crt exists": ("get", "configmap", "kube-root-ca.crt", "-o", "name"),
    }  # fmt: skip
    for what, args in checks.items():
        while True:
            result = admin(*args, check=False, timeout=30)
            if result.returncode == 0 and result.stdout.strip() not in ("", "False", "Unknown"):
                log(what)
                break
            if time.monotonic() >= deadline:
                raise NodeError(
                    f"not ready within {timeout:g} s: waiting until {what}"
                    f" ({(result.stdout + result.stderr).strip()[:300]}); see the kubelet's"
                    " and kube-controller-manager's logs"
                )
            time.sleep(1.0)
