"""The chart's NetworkPolicies as rendered: every pod of the chart's Deployments and StatefulSet
is isolated for ingress and
admits only the connections its policy lists (NATS's client port from the operator and the
workers, the scripted model from the workers, metrics from the monitoring namespace); the
workers' egress is closed only when asked, and then to exactly DNS, NATS, the model, the API
server and the extra rules; a missing value the egress needs fails the render naming it.

That a network plugin enforces them is shown on a real node (tests/cluster); the API server's
judgement of every rendered feature set is in test_server.py."""

from __future__ import annotations

from typing import Any

import pytest
from chart_support import CHART_DIR, FEATURES, documents

from agentrun_dev import helm

MONITORING = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
KEDA = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}}}]


def render(offline_helm: helm.Helm, values: dict[str, str]) -> list[dict[str, Any]]:
    return documents(offline_helm.template(CHART_DIR, namespace="ops", values=values))


def policies(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The NetworkPolicies by the component they select."""
    found = {}
    for doc in docs:
        if doc["kind"] == "NetworkPolicy":
            labels = doc["spec"]["podSelector"]["matchLabels"]
            found[labels["app.kubernetes.io/component"]] = doc["spec"]
    return found


def selects(component: str) -> dict[str, Any]:
    """The podSelector of the chart's pods of `component` (release ``agentrun``)."""
    return {
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/name": "agentrun",
                "app.kubernetes.io/instance": "agentrun",
                "app.kubernetes.io/component": component,
            }
        }
    }


def port(name: str | int, protocol: str = "TCP") -> dict[str, Any]:
    return {"port": name, "protocol": protocol}


@pytest.mark.parametrize("feature", ["defaults", "everything", "worker-egress"])
def test_every_pod_of_the_chart_is_isolated_for_ingress(
    offline_helm: helm.Helm, feature: str
) -> None:
    docs = render(offline_helm, FEATURES[feature])
    isolating = [
        spec["podSelector"]["matchLabels"]
        for spec in policies(docs).values()
        if "Ingress" in spec["policyTypes"]
    ]
    pods = [
        d["spec"]["template"]["metadata"]["labels"]
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet")
    ]
    assert len(pods) >= 2
    unisolated = [
        labels["app.kubernetes.io/component"]
        for labels in pods
        if not any(selector.items() <= labels.items() for selector in isolating)
    ]
    assert unisolated == []


def test_nats_admits_only_its_clients_and_the_model_only_the_workers(
    offline_helm: helm.Helm,
) -> None:
    found = policies(render(offline_helm, FEATURES["everything"]))

    assert found["nats"]["ingress"] == [
        {
            "from": [selects("operator"), selects("worker"), selects("trajectory")],
            "ports": [port("client")],
        },
        {"from": [selects("nats")]},  # cluster routes between NATS servers
        {"from": KEDA, "ports": [port("monitor")]},  # the KEDA scaler reads /jsz
    ]
    assert found["mock-model"]["ingress"] == [
        {"from": [selects("worker")], "ports": [port("http")]}
    ]
    for component in ("operator", "worker"):
        assert found[component]["ingress"] == [{"from": MONITORING, "ports": [port("metrics")]}]
        assert found[component]["policyTypes"] == ["Ingress"]  # egress open by default
    # the kube-apiserver is no pod: its port from any source unless networkPolicy.trajectoryApi
    assert found["trajectory"]["ingress"] == [{"ports": [port("https")]}]


def test_the_nats_monitoring_port_and_further_clients_are_admitted_only_when_asked(
    offline_helm: helm.Helm,
) -> None:
    closed = policies(render(offline_helm, FEATURES["nats"]))["nats"]
    opened = policies(render(offline_helm, FEATURES["worker-egress"]))["nats"]

    assert [rule.get("ports") for rule in closed["ingress"]] == [[port("client")], None]
    reader = {"podSelector": {"matchLabels": {"role": "reader"}}}
    assert opened["ingress"][0]["from"] == [
        selects("operator"), selects("worker"), selects("trajectory"), reader
    ]  # fmt: skip
    assert opened["ingress"][2] == {"from": MONITORING, "ports": [port("monitor")]}


def test_no_monitoring_peers_close_the_metrics_ports(offline_helm: helm.Helm) -> None:
    found = policies(render(offline_helm, {"networkPolicy.monitoring.from": "null"}))
    assert found["operator"]["ingress"] == found["worker"]["ingress"] == []


def test_network_policies_off_render_none(offline_helm: helm.Helm) -> None:
    assert policies(render(offline_helm, FEATURES["no-network-policy"])) == {}


def test_worker_egress_admits_dns_nats_the_model_the_api_server_and_the_extra_rules(
    offline_helm: helm.Helm,
) -> None:
    worker = policies(render(offline_helm, FEATURES["worker-egress"]))["worker"]

    assert worker["policyTypes"] == ["Ingress", "Egress"]
    assert worker["egress"] == [
        {"ports": [port(53, "UDP"), port(53, "TCP")]},
        {"to": [selects("nats")], "ports": [port(4222)]},
        {"to": [selects("mock-model")], "ports": [port(8000)]},
        {"to": [{"ipBlock": {"cidr": "10.0.0.10/32"}}], "ports": [port(6443)]},
        {"ports": [{"port": 443}]},
    ]


def test_worker_egress_to_an_existing_nats_uses_the_port_of_its_url(
    offline_helm: helm.Helm,
) -> None:
    worker = policies(render(offline_helm, FEATURES["worker-egress-existing-nats"]))["worker"]
    assert {"to": [{"ipBlock": {"cidr": "10.1.2.3/32"}}], "ports": [port(4443)]} in worker["egress"]


@pytest.mark.parametrize(
    ("values", "named"),
    [
        pytest.param(
            {"networkPolicy.workerEgress.enabled": "true", "nats.install.enabled": "true"},
            "networkPolicy.workerEgress.apiServer.cidrs",
            id="no-api-server",
        ),
        pytest.param(
            {
                "networkPolicy.workerEgress.enabled": "true",
                "networkPolicy.workerEgress.apiServer.cidrs": "{10.0.0.10/32}",
            },
            "networkPolicy.workerEgress.nats",
            id="existing-nats-without-peers",
        ),
    ],
)
def test_worker_egress_without_what_the_workers_need_fails_naming_the_value(
    offline_helm: helm.Helm, values: dict[str, str], named: str
) -> None:
    sets = [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]
    result = offline_helm("template", "agentrun", str(CHART_DIR), *sets, check=False)
    assert result.returncode != 0
    assert named in result.stderr
