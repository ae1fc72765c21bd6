"""The chart's NetworkPolicies enforced on a real node (kube-router's NetworkPolicy controller,
see `agentrun_dev.node`), tried as an attacker and as the components would: a pod in another
namespace and an unlabelled pod in the install namespace get no answer from NATS's client
port, the scripted model or the metrics ports, while the workers reach NATS and the model, the
operator reaches NATS (and not the model), and runs complete; a scraper in the namespace that
``networkPolicy.monitoring.from`` names reads the metrics; a namespace admitted by
``networkPolicy.nats.extraClients`` (a ``helm upgrade``) reaches NATS; with
``networkPolicy.workerEgress`` the workers reach nothing but what they need, and runs still
complete. Each refusal is shown beside an answer over the same path, so it is the policy that
refuses, not a broken network. The tests run in file order on one release."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun_dev import demo, node, nodehost, release
from agentrun_dev.kubectl import Kubectl, create_namespace, delete_namespace

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "agentrun"
RELEASE = release.RELEASE_NAME
NATS_PORT, MODEL_PORT, METRICS_PORT, WEB_PORT = 4222, 8000, 9090, 8080
HTTP_GET = "GET / HTTP/1.0\r\n\r\n"
ENFORCED_WITHIN = 60.0
"""Seconds the enforcer may take to apply a changed NetworkPolicy or a new pod."""
pytestmark = [pytest.mark.e2e, pytest.mark.node, pytest.mark.timeout(1800)]

RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "seccompProfile": {"type": "RuntimeDefault"},
}
WEB_SCRIPT = (
    "mkdir -p /tmp/www && echo outside > /tmp/www/index.html"
    f" && exec httpd -f -p {WEB_PORT} -h /tmp/www"
)


def busybox_pod(
    name: str, image: str, *, command: list[str], serves: int | None = None
) -> dict[str, Any]:
    """A bare busybox pod with no labels at all, admitted under Pod Security restricted, with
    a writable /tmp; Ready once it accepts connections on port `serves`, if given."""
    container: dict[str, Any] = {
        "name": name, "image": image, "imagePullPolicy": "Never", "command": command,
        "securityContext": RESTRICTED_CONTAINER,
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }  # fmt: skip
    if serves is not None:
        container["readinessProbe"] = {"tcpSocket": {"port": serves}, "periodSeconds": 1}
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "automountServiceAccountToken": False,
            "containers": [container],
            "volumes": [{"name": "tmp", "emptyDir": {}}],
        },
    }  # fmt: skip


def start_pod(kubectl: Kubectl, namespace: str, pod: dict[str, Any]) -> str:
    """Create `pod` in `namespace`, wait until Ready; its name."""
    name: str = pod["metadata"]["name"]
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(pod))
    kubectl("wait", "--for=condition=Ready", f"pod/{name}", "-n", namespace, "--timeout=120s",
            timeout=130)  # fmt: skip
    return name


def pod_ip(kubectl: Kubectl, namespace: str, name: str) -> str:
    return kubectl("get", "pod", name, "-n", namespace, "-o", "jsonpath={.status.podIP}").stdout


def component_pod(kubectl: Kubectl, namespace: str, component: str) -> str:
    """The name of a running, not terminating pod of the chart's `component`."""
    selector = f"app.kubernetes.io/component={component}"
    found = json.loads(
        kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
    )["items"]
    running = [
        p["metadata"]["name"]
        for p in found
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]
    assert running, f"no running {component} pod in {namespace}"
    return running[0]


class Reach:
    """What a pod hears back when it connects to a host and port: NATS's ``INFO`` greeting,
    an HTTP status line, or nothing (the connection was refused or dropped)."""

    def __init__(self, kubectl: Kubectl) -> None:
        self.kubectl = kubectl

    def from_busybox(
        self, namespace: str, pod: str, host: str, port: int, *, send: str = ""
    ) -> str:
        """The first bytes the server sent, through busybox ``nc`` (stdin held open 2 s)."""
        script = f"(printf '{send}'; sleep 2) | timeout 4 nc -w 3 {host} {port} | head -c 120"
        result = self.kubectl(
            "exec", "-n", namespace, pod, "--", "sh", "-c", script, check=False, timeout=60
        )
        return result.stdout

    def from_agentrun(
        self, namespace: str, pod: str, host: str, port: int, *, send: str = ""
    ) -> str:
        """The same from a pod of the agentrun image (no nc there: python's socket)."""
        script = (
            "import socket,sys\n"
            "try:\n"
            f"    s = socket.create_connection(({host!r}, {port}), timeout=3)\n"
            f"    s.sendall({send.encode()!r}); s.settimeout(3)\n"
            "    sys.stdout.write(s.recv(120).decode(errors='replace'))\n"
            "except OSError as exc:\n"
            "    sys.stderr.write(repr(exc))\n"
        )
        result = self.kubectl(
            "exec", "-n", namespace, pod, "--", "python3.11", "-c", script, check=False, timeout=60
        )
        return result.stdout


def answered(heard: str, *, port: int) -> bool:
    """Whether `heard` is the server of `port` speaking (NATS greets, HTTP answers)."""
    return heard.startswith("INFO {") if port == NATS_PORT else heard.startswith("HTTP/1.")


def settles_to(check: Callable[[], str], *, port: int, reachable: bool) -> str:
    """Poll `check` until the server's answer is (or is not) heard, then confirm it twice
    more: the enforcer applies policies asynchronously. Returns the last thing heard."""
    deadline = time.monotonic() + ENFORCED_WITHIN
    while True:
        heard = check()
        if answered(heard, port=port) == reachable:
            confirmations = [check() for _ in range(2)]
            assert all(answered(h, port=port) == reachable for h in confirmations), confirmations
            return heard
        assert time.monotonic() < deadline, f"still {'not ' if reachable else ''}heard: {heard!r}"
        time.sleep(2.0)


@pytest.fixture(scope="module")
def scraper_namespace(node_kubectl: Kubectl) -> Iterator[str]:
    """The namespace ``networkPolicy.monitoring.from`` names (standing for ``monitoring``)."""
    name = create_namespace(node_kubectl, prefix="agentrun-scrape-")
    yield name
    delete_namespace(node_kubectl, name)


@pytest.fixture(scope="module")
def installed(
    cluster_node: node.Node,
    node_kubectl: Kubectl,
    tmp_path_factory: pytest.TempPathFactory,
    scraper_namespace: str,
) -> Iterator[release.Release]:
    """The chart with its default NetworkPolicies (the scraper's namespace as the monitoring
    namespace), its own NATS and the scripted model, under Pod Security restricted."""
    release.import_project_images(cluster_node.directory, project=REPO, log=print)
    values = release.demo_values(default_tenant=demo.TENANT_NAME)
    values["networkPolicy"] = {
        "monitoring": {
            "from": [
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": scraper_namespace}
                    }
                }
            ]
        }
    }
    installed = release.install_chart(
        node_kubectl,
        chart=CHART,
        values=values,
        home=tmp_path_factory.mktemp("release"),
        namespace=f"agentrun-np-{uuid.uuid4().hex[:6]}",
        log=print,
    )
    node_kubectl("apply", "-f", "-", input=yaml.safe_dump(demo.default_tenant()))
    yield installed
    installed.helm("uninstall", installed.name, "-n", installed.namespace,
                   "--ignore-not-found", "--wait", check=False, timeout=300)  # fmt: skip
    delete_namespace(node_kubectl, installed.namespace)


@pytest.fixture(scope="module")
def ns(installed: release.Release) -> str:
    return installed.namespace


@pytest.fixture(scope="module")
def outsider(node_kubectl: Kubectl, node_namespace: str, busybox: str) -> str:
    """A pod in another namespace, serving HTTP on `WEB_PORT` (an egress target)."""
    pod = busybox_pod("outsider", busybox, command=["sh", "-c", WEB_SCRIPT], serves=WEB_PORT)
    return start_pod(node_kubectl, node_namespace, pod)


@pytest.fixture(scope="module")
def stranger(node_kubectl: Kubectl, ns: str, busybox: str) -> str:
    """An unlabelled pod in the install namespace."""
    return start_pod(node_kubectl, ns, busybox_pod("stranger", busybox, command=["sleep", "3600"]))


@pytest.fixture(scope="module")
def scraper(node_kubectl: Kubectl, scraper_namespace: str, busybox: str) -> str:
    """A pod in the monitoring namespace."""
    pod = busybox_pod("scraper", busybox, command=["sleep", "3600"])
    return start_pod(node_kubectl, scraper_namespace, pod)


@pytest.fixture(scope="module")
def reach(node_kubectl: Kubectl) -> Reach:
    return Reach(node_kubectl)


def nats_host(ns: str) -> str:
    return f"{RELEASE}-nats.{ns}.svc.cluster.local"


def model_host(ns: str) -> str:
    return f"{RELEASE}-mock-model.{ns}.svc.cluster.local"


def servers(ns: str) -> list[tuple[str, int, str]]:
    """NATS's client port and the scripted model: (host, port, what to send first)."""
    return [(nats_host(ns), NATS_PORT, ""), (model_host(ns), MODEL_PORT, HTTP_GET)]


def run_to_end(kubectl: Kubectl, ns: str, name: str, *, timeout: float = 240.0) -> str:
    """Apply examples/rectangle.yaml as `name` and wait for its terminal reason."""
    run = yaml.safe_load((REPO / "examples" / "rectangle.yaml").read_text())
    run["metadata"]["name"] = name
    kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(run))
    deadline = time.monotonic() + timeout
    while True:
        found = json.loads(kubectl("get", "agentrun", name, "-n", ns, "-o", "json").stdout)
        reason: str = (found.get("status") or {}).get("terminalReason") or ""
        if reason:
            return reason
        assert time.monotonic() < deadline, f"{name}: {found.get('status')}"
        time.sleep(1.0)


def test_the_chart_isolates_its_pods_and_a_run_completes(node_kubectl: Kubectl, ns: str) -> None:
    names = node_kubectl("get", "networkpolicies", "-n", ns, "-o", "name").stdout.split()
    assert sorted(names) == [
        f"networkpolicy.networking.k8s.io/{RELEASE}-{component}"
        for component in ("mock-model", "nats", "operator", "trajectory", "worker")
    ]
    assert run_to_end(node_kubectl, ns, "rectangle") == "completed"


def test_a_pod_in_another_namespace_gets_no_answer_from_nats_or_the_model(
    reach: Reach, node_namespace: str, outsider: str, ns: str
) -> None:
    # the same pod and the same client are answered by a server the policies do not cover
    own = reach.from_busybox(node_namespace, outsider, "127.0.0.1", WEB_PORT, send=HTTP_GET)
    assert answered(own, port=WEB_PORT), own
    for host, port, send in servers(ns):
        heard = settles_to(
            lambda h=host, p=port, s=send: reach.from_busybox(
                node_namespace, outsider, h, p, send=s
            ),
            port=port,
            reachable=False,
        )
        assert heard == "", (host, heard)


def test_an_unlabelled_pod_in_the_install_namespace_gets_no_answer_from_nats_or_the_model(
    reach: Reach, ns: str, stranger: str
) -> None:
    for host, port, send in servers(ns):
        settles_to(
            lambda h=host, p=port, s=send: reach.from_busybox(ns, stranger, h, p, send=s),
            port=port,
            reachable=False,
        )


def test_the_workers_reach_nats_and_the_model_the_operator_only_nats(
    reach: Reach, node_kubectl: Kubectl, ns: str
) -> None:
    worker = component_pod(node_kubectl, ns, "worker")
    operator = component_pod(node_kubectl, ns, "operator")
    heard = {
        "worker to nats": reach.from_agentrun(ns, worker, nats_host(ns), NATS_PORT),
        "worker to model": reach.from_agentrun(
            ns, worker, model_host(ns), MODEL_PORT, send=HTTP_GET
        ),
        "operator to nats": reach.from_agentrun(ns, operator, nats_host(ns), NATS_PORT),
    }
    assert all(
        answered(text, port=NATS_PORT if "nats" in what else MODEL_PORT)
        for what, text in heard.items()
    ), heard
    settles_to(
        lambda: reach.from_agentrun(ns, operator, model_host(ns), MODEL_PORT, send=HTTP_GET),
        port=MODEL_PORT,
        reachable=False,
    )


def test_the_metrics_ports_answer_only_the_monitoring_namespace(
    reach: Reach,
    node_kubectl: Kubectl,
    ns: str,
    scraper_namespace: str,
    scraper: str,
    node_namespace: str,
    outsider: str,
) -> None:
    for component in ("worker", "operator"):
        ip = pod_ip(node_kubectl, ns, component_pod(node_kubectl, ns, component))
        settles_to(
            lambda ip=ip: reach.from_busybox(
                scraper_namespace, scraper, ip, METRICS_PORT, send=HTTP_GET
            ),
            port=METRICS_PORT,
            reachable=True,
        )
        settles_to(
            lambda ip=ip: reach.from_busybox(
                node_namespace, outsider, ip, METRICS_PORT, send=HTTP_GET
            ),
            port=METRICS_PORT,
            reachable=False,
        )


def test_a_namespace_admitted_by_the_extra_clients_value_reaches_nats(
    installed: release.Release,
    reach: Reach,
    ns: str,
    node_namespace: str,
    outsider: str,
    stranger: str,
) -> None:
    installed.helm(
        "upgrade", installed.name, str(installed.chart), "-n", ns, "--reuse-values",
        "--set", "networkPolicy.nats.extraClients[0].namespaceSelector.matchLabels"
        f".kubernetes\\.io/metadata\\.name={node_namespace}",
        "--wait", "--timeout", "5m", timeout=330,
    )  # fmt: skip
    settles_to(
        lambda: reach.from_busybox(node_namespace, outsider, nats_host(ns), NATS_PORT),
        port=NATS_PORT,
        reachable=True,
    )
    # the model is still the workers' alone, and the install namespace's stranger stays out
    settles_to(
        lambda: reach.from_busybox(node_namespace, outsider, model_host(ns), MODEL_PORT),
        port=MODEL_PORT,
        reachable=False,
    )
    settles_to(
        lambda: reach.from_busybox(ns, stranger, nats_host(ns), NATS_PORT),
        port=NATS_PORT,
        reachable=False,
    )


def test_closed_worker_egress_leaves_the_workers_only_what_they_need(
    installed: release.Release,
    cluster_node: node.Node,
    node_kubectl: Kubectl,
    reach: Reach,
    ns: str,
    node_namespace: str,
    outsider: str,
) -> None:
    target = pod_ip(node_kubectl, node_namespace, outsider)
    worker = component_pod(node_kubectl, ns, "worker")
    before = reach.from_agentrun(ns, worker, target, WEB_PORT, send=HTTP_GET)
    assert answered(before, port=WEB_PORT), before  # egress is open by default

    # what values.yaml says to look up: the kubernetes Service's endpoints and their port
    (apiserver,) = json.loads(
        node_kubectl("get", "endpointslices", "-n", "default", "-o", "json",
                     "-l", "kubernetes.io/service-name=kubernetes").stdout
    )["items"]  # fmt: skip
    assert apiserver["endpoints"][0]["addresses"] == [nodehost.GATEWAY]
    installed.helm(
        "upgrade", installed.name, str(installed.chart), "-n", ns, "--reuse-values",
        "--set", "networkPolicy.workerEgress.enabled=true",
        "--set", f"networkPolicy.workerEgress.apiServer.cidrs={{{nodehost.GATEWAY}/32}}",
        "--set", f"networkPolicy.workerEgress.apiServer.port={apiserver['ports'][0]['port']}",
        "--wait", "--timeout", "5m", timeout=330,
    )  # fmt: skip

    settles_to(
        lambda: reach.from_agentrun(
            ns, component_pod(node_kubectl, ns, "worker"), target, WEB_PORT, send=HTTP_GET
        ),
        port=WEB_PORT,
        reachable=False,
    )
    worker = component_pod(node_kubectl, ns, "worker")
    assert answered(reach.from_agentrun(ns, worker, nats_host(ns), NATS_PORT), port=NATS_PORT)
    assert run_to_end(node_kubectl, ns, "rectangle-egress") == "completed"
