"""The chart's NATS as a JetStream cluster (``nats.install.replicas`` 3 or 5): one StatefulSet
whose servers route to each other by their stable names with a password no ConfigMap holds and,
with ``nats.tls``, mutual TLS that each route's name passes; one server may go at a time; the
pods prefer distinct nodes; streams get R3 by default. The rendered configuration is checked by
the pinned ``nats-server`` itself (``-t``), with the Secrets' files where the pod mounts them.
One server (the default) renders none of it."""

from __future__ import annotations

import base64
import fnmatch
import subprocess
from pathlib import Path
from typing import Any

import pytest
from chart_support import CHART_DIR, documents
from cryptography import x509

from agentrun_dev import helm, natsserver

CLUSTER = {"nats.install.enabled": "true", "nats.install.replicas": "3"}


RENDERED: dict[frozenset[tuple[str, str]], str] = {}
"""Renders by their values (each takes seconds): the same values render once per session (the
generated password and certificate are then shared, which no test here compares)."""


def render(offline_helm: helm.Helm, values: dict[str, str]) -> list[dict[str, Any]]:
    key = frozenset(values.items())
    if key not in RENDERED:
        RENDERED[key] = offline_helm.template(CHART_DIR, namespace="agentrun", values=values)
    return documents(RENDERED[key])


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def named(docs: list[dict[str, Any]], kind: str, name: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]


def operator_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    pod = one(docs, "Deployment", "agentrun-operator")["spec"]["template"]["spec"]
    return {e["name"]: e.get("value", "") for e in pod["containers"][0]["env"]}


def routes(docs: list[dict[str, Any]]) -> tuple[str, str]:
    """The routes Secret's password and its routes.conf."""
    data = one(docs, "Secret", "agentrun-nats-routes")["stringData"]
    return data["password"], data["routes.conf"]


def test_one_server_renders_no_cluster(offline_helm: helm.Helm) -> None:
    docs = render(offline_helm, {"nats.install.enabled": "true"})
    sts = one(docs, "StatefulSet", "agentrun-nats")
    assert sts["spec"]["replicas"] == 1
    assert "cluster" not in one(docs, "ConfigMap", "agentrun-nats-config")["data"]["nats.conf"]
    assert not named(docs, "Secret", "agentrun-nats-routes")
    assert not named(docs, "PodDisruptionBudget", "agentrun-nats")
    assert "affinity" not in sts["spec"]["template"]["spec"]
    assert operator_env(docs)["AGENTRUN_NATS_REPLICAS"] == "1"


def test_three_servers_route_to_each_pod_by_its_stable_name(offline_helm: helm.Helm) -> None:
    docs = render(offline_helm, CLUSTER)
    sts = one(docs, "StatefulSet", "agentrun-nats")
    assert sts["spec"]["replicas"] == 3
    pod = sts["spec"]["template"]["spec"]
    ports = {p["name"]: p["containerPort"] for p in pod["containers"][0]["ports"]}
    assert ports["cluster"] == 6222
    password, conf = routes(docs)
    assert len(password) >= 32
    hosts = [f"agentrun-nats-{i}.agentrun-nats-headless.agentrun.svc:6222" for i in range(3)]
    assert all(f"nats-route://route:{password}@{host}" in conf for host in hosts)
    config = one(docs, "ConfigMap", "agentrun-nats-config")["data"]["nats.conf"]
    assert password not in config and 'include "../routes/routes.conf"' in config
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["routes"] == "/etc/nats/routes"
    headless = one(docs, "Service", "agentrun-nats-headless")["spec"]
    assert headless["publishNotReadyAddresses"] is True  # routes form before any is ready
    assert {p["name"] for p in one(docs, "Service", "agentrun-nats")["spec"]["ports"]} == {"client"}


def test_each_route_name_passes_the_servers_certificate_for_mutual_tls(
    offline_helm: helm.Helm,
) -> None:
    docs = render(offline_helm, CLUSTER)
    config = one(docs, "ConfigMap", "agentrun-nats-config")["data"]["nats.conf"]
    cluster = config[config.index("cluster {") :]
    assert 'ca_file: "/etc/nats/tls/ca.crt"' in cluster and "verify: true" in cluster
    assert "pool_size: -1" in cluster  # one route per pair: answers never overtake interest
    tls = one(docs, "Secret", "agentrun-nats-tls")["data"]
    cert = x509.load_pem_x509_certificate(base64.b64decode(tls["tls.crt"]))
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert x509.ExtendedKeyUsageOID.CLIENT_AUTH in usages  # a server connecting a route
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    patterns = names.get_values_for_type(x509.DNSName)
    for i in range(3):
        host = f"agentrun-nats-{i}.agentrun-nats-headless.agentrun.svc"
        assert any(
            fnmatch.fnmatch(host, p) and host.count(".") == p.count(".") for p in patterns
        ), host
    plain = render(offline_helm, {**CLUSTER, "nats.tls.enabled": "false"})
    plain_config = one(plain, "ConfigMap", "agentrun-nats-config")["data"]["nats.conf"]
    assert "cluster {" in plain_config and "tls {" not in plain_config
    assert "pool_size: -1" in plain_config
    assert routes(plain)[0]  # the password still guards the routes


def test_one_server_at_a_time_may_go_and_the_pods_prefer_distinct_nodes(
    offline_helm: helm.Helm,
) -> None:
    docs = render(offline_helm, CLUSTER)
    budget = one(docs, "PodDisruptionBudget", "agentrun-nats")["spec"]
    sts = one(docs, "StatefulSet", "agentrun-nats")["spec"]
    assert budget["maxUnavailable"] == 1
    assert (
        budget["selector"]["matchLabels"].items() <= sts["template"]["metadata"]["labels"].items()
    )
    (term,) = sts["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"] == budget["selector"]


@pytest.mark.parametrize(
    ("values", "replicas"),
    [
        pytest.param(CLUSTER, "3", id="three-servers"),
        pytest.param({**CLUSTER, "nats.install.replicas": "5"}, "3", id="five-servers-R3"),
        pytest.param(
            {**CLUSTER, "nats.install.replicas": "5", "nats.jetstream.replicas": "5"},
            "5",
            id="five-servers-R5",
        ),
        pytest.param({"nats.url": "nats://nats.nats.svc:4222"}, "1", id="brought-nats"),
        pytest.param(
            {"nats.url": "nats://nats.nats.svc:4222", "nats.jetstream.replicas": "3"},
            "3",
            id="brought-cluster",
        ),
    ],
)
def test_streams_are_kept_by_the_installed_servers_at_most_three_by_default(
    offline_helm: helm.Helm, values: dict[str, str], replicas: str
) -> None:
    assert operator_env(render(offline_helm, values))["AGENTRUN_NATS_REPLICAS"] == replicas


@pytest.mark.parametrize(
    ("values", "named_value"),
    [
        pytest.param({**CLUSTER, "nats.jetstream.replicas": "5"}, "nats.jetstream.replicas"),
        pytest.param({**CLUSTER, "nats.install.replicas": "2"}, "replicas"),
    ],
    ids=["more-replicas-than-servers", "an-even-cluster"],
)
def test_a_cluster_the_servers_cannot_be_is_refused_by_name(
    offline_helm: helm.Helm, values: dict[str, str], named_value: str
) -> None:
    with pytest.raises(helm.HelmError) as refused:
        render(offline_helm, values)
    assert named_value in str(refused.value)


@pytest.mark.parametrize("tls", ["true", "false"])
def test_nats_server_accepts_the_rendered_cluster_configuration(
    offline_helm: helm.Helm, tmp_path: Path, tls: str
) -> None:
    """The configuration, routes.conf and the certificate laid out as the pod mounts them
    (under ``tmp_path``), the auth include left out (the bootstrap hook makes it)."""
    docs = render(offline_helm, {**CLUSTER, "nats.tls.enabled": tls})
    root = tmp_path / "etc" / "nats"
    for folder in ("config", "routes", "tls"):
        (root / folder).mkdir(parents=True)
    config = one(docs, "ConfigMap", "agentrun-nats-config")["data"]["nats.conf"]
    config = config.replace('include "../auth/auth.conf"\n', "").replace("/etc/nats", str(root))
    (root / "config" / "nats.conf").write_text(config.replace('"/data"', f'"{tmp_path}/data"'))
    (root / "routes" / "routes.conf").write_text(routes(docs)[1])
    if tls == "true":
        for key, value in one(docs, "Secret", "agentrun-nats-tls")["data"].items():
            (root / "tls" / key).write_bytes(base64.b64decode(value))
    checked = subprocess.run(
        [str(natsserver.find_nats_server()), "-t", "-c", str(root / "config" / "nats.conf")],
        capture_output=True,
        text=True,
        env={"POD_NAME": "agentrun-nats-0"},
        timeout=30,
    )
    assert checked.returncode == 0, checked.stderr + checked.stdout
    assert "is valid" in checked.stderr + checked.stdout
