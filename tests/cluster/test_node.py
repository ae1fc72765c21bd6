"""A real node runs pods from local images, gives them IPs, DNS, Services, logs and exec."""

from __future__ import annotations

import ipaddress
import json
import time
from typing import Any

import pytest
import yaml

from agentrun_dev import binaries, node, nodehost
from agentrun_dev.kubectl import Kubectl

# the first test may wait for another run's node to stop
pytestmark = [pytest.mark.node, pytest.mark.timeout(1200)]

WEB_SCRIPT = (
    "mkdir -p /www && echo hello from $(hostname) > /www/index.html"
    " && echo serving on $(hostname) && exec httpd -f -p 8080 -h /www"
)


def apply(kubectl: Kubectl, namespace: str, *objects: dict[str, Any]) -> None:
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(objects))


def web_deployment(image: str, *, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {
            "replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{
                    "name": "web", "image": image, "imagePullPolicy": "Never",
                    "command": ["sh", "-c", WEB_SCRIPT], "ports": [{"containerPort": 8080}],
                    "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
                }]},
            },
        },
    }  # fmt: skip


def client_pod(image: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client"},
        "spec": {"containers": [{
            "name": "client", "image": image, "imagePullPolicy": "Never",
            "command": ["sleep", "3600"],
        }]},
    }  # fmt: skip


WEB_SERVICE = {
    "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
    "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
}  # fmt: skip


@pytest.fixture(scope="module")
def web(node_kubectl: Kubectl, node_namespace: str, busybox: str) -> str:
    """A 2-replica busybox httpd Deployment behind Service ``web``, rolled out, and a client
    pod Ready; returns the namespace."""
    apply(
        node_kubectl, node_namespace,
        web_deployment(busybox, replicas=2), WEB_SERVICE, client_pod(busybox),
    )  # fmt: skip
    node_kubectl("rollout", "status", "deployment/web", "-n", node_namespace, "--timeout=120s",
                 timeout=130)  # fmt: skip
    node_kubectl("wait", "--for=condition=Ready", "pod/client", "-n", node_namespace,
                 "--timeout=120s", timeout=130)  # fmt: skip
    wait_until_served(node_kubectl, node_namespace)
    return node_namespace


def wait_until_served(kubectl: Kubectl, namespace: str, *, timeout: float = 60.0) -> None:
    """Until kube-proxy has programmed Service ``web`` (it does so asynchronously, after the
    pods are Ready): a request to its ClusterIP from the client pod is answered by a pod."""
    cluster_ip = kubectl("get", "service", "web", "-n", namespace, "-o",
                         "jsonpath={.spec.clusterIP}").stdout  # fmt: skip
    deadline = time.monotonic() + timeout
    while True:
        result = kubectl("exec", "-n", namespace, "client", "--", "timeout", "5", "wget", "-q",
                         "-O", "-", f"http://{cluster_ip}/", check=False)  # fmt: skip
        if result.stdout.startswith("hello from web-"):
            return
        assert time.monotonic() < deadline, f"Service web not served: {result.stderr}"
        time.sleep(1.0)


def pods(kubectl: Kubectl, namespace: str, selector: str) -> list[dict[str, Any]]:
    output = kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
    items: list[dict[str, Any]] = json.loads(output)["items"]
    return items


def exec_in_client(kubectl: Kubectl, namespace: str, *command: str) -> str:
    result = kubectl("exec", "-n", namespace, "client", "--", *command, timeout=60)
    return result.stdout


def test_the_node_is_ready_at_the_bridge_gateway_with_the_pinned_kubelet(
    node_kubectl: Kubectl,
) -> None:
    found = json.loads(node_kubectl("get", "node", node.NODE_NAME, "-o", "json").stdout)
    ready = {c["type"]: c["status"] for c in found["status"]["conditions"]}["Ready"]
    addresses = {a["type"]: a["address"] for a in found["status"]["addresses"]}
    assert ready == "True"
    assert addresses["InternalIP"] == nodehost.GATEWAY
    assert found["status"]["nodeInfo"]["kubeletVersion"] == binaries.K8S_VERSION


def test_the_controller_manager_gives_namespaces_a_service_account_and_the_root_ca(
    node_kubectl: Kubectl, node_namespace: str
) -> None:
    node_kubectl("wait", "--for=create", "serviceaccount/default", "configmap/kube-root-ca.crt",
                 "-n", node_namespace, "--timeout=60s", timeout=70)  # fmt: skip


def test_a_deployment_of_a_local_image_runs_pods_with_pod_ips(
    node_kubectl: Kubectl, web: str
) -> None:
    running = pods(node_kubectl, web, "app=web")
    assert len(running) == 2
    subnet = ipaddress.ip_network(nodehost.POD_SUBNET)
    for pod in running:
        assert pod["status"]["phase"] == "Running"
        assert pod["spec"]["nodeName"] == node.NODE_NAME
        assert ipaddress.ip_address(pod["status"]["podIP"]) in subnet
    assert len({pod["status"]["podIP"] for pod in running}) == 2


def test_a_pod_reaches_a_service_by_dns_name_and_by_cluster_ip(
    node_kubectl: Kubectl, web: str
) -> None:
    cluster_ip = node_kubectl("get", "service", "web", "-n", web, "-o",
                              "jsonpath={.spec.clusterIP}").stdout  # fmt: skip
    names = {f"pod {p['metadata']['name']}" for p in pods(node_kubectl, web, "app=web")}
    for host in (f"web.{web}.svc.cluster.local", "web", cluster_ip):
        page = exec_in_client(node_kubectl, web, "timeout", "10", "wget", "-q", "-O", "-",
                              f"http://{host}/")  # fmt: skip
        assert page.startswith("hello from web-"), host
        assert f"pod {page.split()[-1]}" in names


def test_cluster_dns_answers_for_services_at_the_kube_dns_address(
    node_kubectl: Kubectl, web: str
) -> None:
    resolv = exec_in_client(node_kubectl, web, "cat", "/etc/resolv.conf")
    assert f"nameserver {node.CLUSTER_DNS_IP}" in resolv
    answer = exec_in_client(node_kubectl, web, "nslookup", "kubernetes.default.svc.cluster.local")
    assert "10.96.0.1" in answer


def test_a_pod_reaches_the_api_server_through_the_kubernetes_service_with_its_token(
    node_kubectl: Kubectl, web: str
) -> None:
    token = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    script = (
        "timeout 10 wget -q -O - --no-check-certificate"
        f' --header "Authorization: Bearer $(cat {token})" https://kubernetes.default.svc/api'
    )
    versions = json.loads(exec_in_client(node_kubectl, web, "sh", "-c", script))
    assert versions["kind"] == "APIVersions"


def test_kubectl_logs_shows_what_the_container_printed(node_kubectl: Kubectl, web: str) -> None:
    (pod, *_) = pods(node_kubectl, web, "app=web")
    name = pod["metadata"]["name"]
    logs = node_kubectl("logs", "-n", web, name).stdout
    assert f"serving on {name}" in logs


def test_kubectl_exec_runs_in_the_container_and_returns_its_exit_status(
    node_kubectl: Kubectl, web: str
) -> None:
    assert exec_in_client(node_kubectl, web, "hostname").strip() == "client"
    failed = node_kubectl("exec", "-n", web, "client", "--", "sh", "-c", "exit 3", check=False)
    assert failed.returncode == 3
