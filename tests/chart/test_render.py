"""The chart renders and lints with the pinned helm, offline, the way GitOps tools run it; its
values schema names the field a typo or a wrong type hits; its defaults name what is built
here; its KEDA trigger names the workers' real consumer, and the account where KEDA finds it."""

from __future__ import annotations

import asyncio
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from chart_support import (
    CHART_DIR,
    FEATURES,
    KEDA_KINDS,
    REPO_ROOT,
    documents,
    keda_crd_file,
    keda_module_dir,
)

from agentrun import protocol
from agentrun.natsauth import Authority, bootstrap
from agentrun.settings import WorkerSettings
from agentrun.tools import PrometheusQuery, ToolContext, ToolError, kubernetes_get
from agentrun_dev import helm, image, natsserver

CTX = ToolContext(namespace="ns", run_name="run", run_uid="uid", call_id="c")


def values() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    return loaded


def render(offline_helm: helm.Helm, feature: str, *, namespace: str = "agentrun") -> list[Any]:
    return documents(
        offline_helm.template(CHART_DIR, namespace=namespace, values=FEATURES[feature])
    )


def find(docs: list[Any], kind: str, name: str) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name} rendered {len(matches)} times"
    found: dict[str, Any] = matches[0]
    return found


def env_of(workload: dict[str, Any]) -> dict[str, str]:
    container = workload["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_helm_lint_strict_passes(offline_helm: helm.Helm, feature: str) -> None:
    sets = [arg for k, v in FEATURES[feature].items() for arg in ("--set", f"{k}={v}")]
    result = offline_helm("lint", "--strict", str(CHART_DIR), *sets)
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param((), id="helm-default-kube-version"),
        # A helm library built without the release's link-time stamp (as GitOps controllers
        # embed it) defaults to Kubernetes 1.20 when no cluster is asked.
        pytest.param(("--kube-version", "1.20.0"), id="unstamped-library-default"),
    ],
)
def test_template_renders_with_no_cluster_and_no_kube_version_given(
    offline_helm: helm.Helm, extra: tuple[str, ...]
) -> None:
    assert not Path(offline_helm.env["KUBECONFIG"]).exists()  # no cluster to ask
    docs = documents(offline_helm.template(CHART_DIR, extra=extra))
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "ClusterRole", "ServiceAccount"} <= kinds


@pytest.mark.parametrize(
    ("assignment", "named"),
    [
        pytest.param("wroker.replicas=3", "additional properties 'wroker' not allowed", id="typo"),
        pytest.param("worker.replicas=two", "/worker/replicas", id="not-an-integer"),
        pytest.param("worker.replicas=-1", "/worker/replicas", id="negative"),
        pytest.param("nats.instal.enabled=true", "'instal' not allowed", id="nested-typo"),
        pytest.param("image.pullPolicy=Sometimes", "/image/pullPolicy", id="not-in-enum"),
        pytest.param("nats.url=http://nats:4222", "/nats/url", id="not-a-nats-url"),
        pytest.param(
            "tools.prometheusQuery.url=prometheus:9090",
            "/tools/prometheusQuery/url",
            id="prometheus-url-without-scheme",
        ),
        pytest.param(
            "metrics.prometheusRule.runbookBaseURL=wiki",
            "/metrics/prometheusRule/runbookBaseURL",
            id="runbook-base-not-a-url",
        ),
        pytest.param(
            "metrics.grafanaDashboard.lable=x", "'lable' not allowed", id="dashboard-typo"
        ),
        pytest.param("networkPolicy.enabeld=false", "'enabeld' not allowed", id="netpol-typo"),
        pytest.param(
            "networkPolicy.workerEgress.apiServer.cidrs={10.0.0.10}",
            "/networkPolicy/workerEgress/apiServer/cidrs/0",
            id="cidr-without-prefix",
        ),
        pytest.param(
            "networkPolicy.nats.extraClients[0].podSelektor.app=x",
            "'podSelektor' not allowed",
            id="peer-typo",
        ),
    ],
)
def test_values_schema_fails_naming_the_field(
    offline_helm: helm.Helm, assignment: str, named: str
) -> None:
    result = offline_helm("template", "agentrun", str(CHART_DIR), "--set", assignment, check=False)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert named in result.stderr


def test_both_autoscalers_at_once_fail(offline_helm: helm.Helm) -> None:
    result = offline_helm(
        "template",
        "agentrun",
        str(CHART_DIR),
        *("--set", "worker.autoscaling.keda.enabled=true,worker.autoscaling.hpa.enabled=true"),
        *("--set", "nats.install.enabled=true"),
        check=False,
    )
    assert result.returncode != 0 and "enable keda or hpa, not both" in result.stderr


def test_keda_on_an_existing_nats_needs_its_monitoring_endpoint(offline_helm: helm.Helm) -> None:
    result = offline_helm(
        "template",
        "agentrun",
        str(CHART_DIR),
        *("--set", "worker.autoscaling.keda.enabled=true"),
        check=False,
    )
    assert result.returncode != 0 and "nats.monitoringEndpoint" in result.stderr


def test_default_image_is_what_make_image_builds(offline_helm: helm.Helm) -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    worker = find(render(offline_helm, "defaults"), "Deployment", "agentrun-worker")
    container = worker["spec"]["template"]["spec"]["containers"][0]

    assert chart["appVersion"] == project["version"]
    assert container["image"] == f"{image.AGENTRUN_REPOSITORY}:{project['version']}"


def test_default_nats_image_is_what_make_image_builds() -> None:
    nats_image = values()["nats"]["install"]["image"]
    binary = natsserver.find_nats_server()

    assert nats_image["repository"] == image.NATS_REPOSITORY
    assert nats_image["tag"] == image.nats_server_version(binary)


def test_by_default_the_workers_use_the_given_nats_and_no_nats_is_installed(
    offline_helm: helm.Helm,
) -> None:
    docs = render(offline_helm, "defaults")

    assert not [d for d in docs if d["kind"] == "StatefulSet"]
    assert (
        env_of(find(docs, "Deployment", "agentrun-worker"))["AGENTRUN_NATS_URL"]
        == (values()["nats"]["url"])
    )


def test_installed_nats_is_what_the_operator_and_workers_connect_to(
    offline_helm: helm.Helm,
) -> None:
    docs = render(offline_helm, "nats", namespace="ops")
    service = find(docs, "Service", "agentrun-nats")
    server = find(docs, "StatefulSet", "agentrun-nats")
    args = server["spec"]["template"]["spec"]["containers"][0]["args"]

    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {"client": 4222}
    assert args == ["--config=/etc/nats/config/nats.conf"]
    assert server["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    for name in ("agentrun-operator", "agentrun-worker"):
        assert env_of(find(docs, "Deployment", name))["AGENTRUN_NATS_URL"] == (
            "tls://agentrun-nats.ops.svc:4222"
        )


def test_the_installed_nats_configuration_is_accepted_by_the_real_server(
    offline_helm: helm.Helm, tmp_path: Path
) -> None:
    """The rendered arguments and configuration file, checked by the nats-server the image
    carries (``-t``: parse, validate, exit): an unknown flag or field fails here, not in a
    crash-looping pod."""
    docs = render(offline_helm, "nats", namespace="ops")
    config = find(docs, "ConfigMap", "agentrun-nats-config")["data"]["nats.conf"]
    assert "max_file_store: 1G" in config and 'store_dir: "/data"' in config
    mounted = closed_nats_files(docs, tmp_path)
    container = find(docs, "StatefulSet", "agentrun-nats")["spec"]["template"]["spec"]
    args = [a.replace("/etc/nats/", f"{mounted}/") for a in container["containers"][0]["args"]]
    checked = subprocess.run(
        [str(natsserver.find_nats_server()), *args, "-t"],
        env={"POD_NAME": "agentrun-nats-0"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "is valid" in checked.stdout + checked.stderr


def closed_nats_files(docs: list[Any], directory: Path, authority: Authority | None = None) -> Path:
    """The NATS pod's files under ``directory`` as its volumes mount them under /etc/nats:
    the rendered configuration, the chart's TLS Secret, and the auth.conf the bootstrap hook
    would write for ``authority`` (default: a fresh one). Returns ``directory``."""
    import base64

    config = find(docs, "ConfigMap", "agentrun-nats-config")["data"]["nats.conf"]
    (directory / "config").mkdir()
    (directory / "config" / "nats.conf").write_text(
        config.replace('"/data"', f'"{directory}/data"').replace("/etc/nats/", f"{directory}/")
    )
    (directory / "auth").mkdir()
    for key, text in bootstrap.server_secret(authority or Authority.generate()).items():
        (directory / "auth" / key).write_text(text)
    (directory / "tls").mkdir()
    for key, data in find(docs, "Secret", "agentrun-nats-tls")["data"].items():
        (directory / "tls" / key).write_bytes(base64.b64decode(data))
    return directory


def worker_settings(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> WorkerSettings:
    """The settings an ``agentrun-worker`` reads from the container's ``env``."""
    monkeypatch.delenv("AGENTRUN_PROMETHEUS_URL", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return WorkerSettings()


def test_the_prometheus_query_tool_gets_the_url_the_values_name(
    offline_helm: helm.Helm, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = render(offline_helm, "prometheus-query")
    worker = env_of(find(docs, "Deployment", "agentrun-worker"))
    assert worker["AGENTRUN_PROMETHEUS_URL"] == "http://prometheus.monitoring.svc:9090"
    assert "AGENTRUN_PROMETHEUS_URL" not in env_of(find(docs, "Deployment", "agentrun-operator"))
    settings = worker_settings(monkeypatch, worker)
    assert settings.prometheus_url == "http://prometheus.monitoring.svc:9090"
    assert settings.prometheus_scope_label == "namespace"  # each run reads its namespace only


def test_the_kubernetes_get_grant_covers_exactly_what_the_tool_reads(
    offline_helm: helm.Helm,
) -> None:
    """The tool and the chart agree: every kind the tool offers is granted (get, list) where
    the platform lists a namespace, and nothing else is."""
    listed = dict(FEATURES["defaults"], **{"rbac.kubernetesGetNamespaces[0]": "team-a"})
    docs = documents(offline_helm.template(CHART_DIR, namespace="agentrun", values=listed))
    role = find(docs, "ClusterRole", "agentrun-worker-kubernetes-get")
    granted = {
        (group, resource): tuple(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    groups = {"CoreV1Api": "", "AppsV1Api": "apps", "BatchV1Api": "batch"}
    read = {
        ((route.custom[0] if route.custom else groups[route.api]), kind): ("get", "list")
        for kind, route in kubernetes_get.ROUTES.items()
    }
    assert granted == read
    binding = find(docs, "RoleBinding", "agentrun-worker-kubernetes-get")
    assert binding["metadata"]["namespace"] == "team-a"


def test_by_default_no_prometheus_is_configured_and_the_tool_says_so(
    offline_helm: helm.Helm, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = env_of(find(render(offline_helm, "defaults"), "Deployment", "agentrun-worker"))
    assert "AGENTRUN_PROMETHEUS_URL" not in worker
    settings = worker_settings(monkeypatch, worker)
    with pytest.raises(ToolError) as unset:
        asyncio.run(PrometheusQuery(settings.prometheus_url).run({"query": "up"}, CTX))
    assert "tools.prometheusQuery.url" in unset.value.message


def test_autoscaled_workers_leave_the_replica_count_to_the_autoscaler(
    offline_helm: helm.Helm,
) -> None:
    fixed = find(render(offline_helm, "defaults"), "Deployment", "agentrun-worker")
    for feature in ("keda", "hpa"):
        scaled = find(render(offline_helm, feature), "Deployment", "agentrun-worker")
        assert "replicas" not in scaled["spec"], feature
    assert fixed["spec"]["replicas"] == values()["worker"]["replicas"]


def keda_scaler_tags() -> dict[str, list[str]]:
    """The parameters KEDA's nats-jetstream scaler parses (its struct tags): each name and the
    sources it is read from, in order (``triggerMetadata``, ``authParams``)."""
    source = (keda_module_dir() / "pkg" / "scalers" / "nats_jetstream_scaler.go").read_text()
    return {
        name: order.split(";")
        for name, order in re.findall(r'keda:"name=([A-Za-z]+),[^"]*?order=([A-Za-z;]+)', source)
    }


def keda_scaler_parameters() -> set[str]:
    """The trigger metadata names KEDA's nats-jetstream scaler parses (its struct tags)."""
    return {name for name, order in keda_scaler_tags().items() if "triggerMetadata" in order}


def keda_auth_parameters() -> set[str]:
    """The names KEDA's nats-jetstream scaler reads from a TriggerAuthentication's authParams."""
    return {name for name, order in keda_scaler_tags().items() if "authParams" in order}


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """A CRD's OpenAPI v3 schema as a JSON Schema that, as the API server's strict field
    validation (kubectl's default) does, refuses a field it does not declare: every object
    listing ``properties`` closed to others, unless it says otherwise."""
    closed = dict(schema)
    if "properties" in closed:
        closed["properties"] = {name: strict(sub) for name, sub in closed["properties"].items()}
        if "additionalProperties" not in closed and not closed.get(
            "x-kubernetes-preserve-unknown-fields"
        ):
            closed["additionalProperties"] = False
    for key in ("items", "additionalProperties", "not"):
        if isinstance(closed.get(key), dict):
            closed[key] = strict(closed[key])
    for key in ("allOf", "anyOf", "oneOf"):
        if key in closed:
            closed[key] = [strict(sub) for sub in closed[key]]
    return closed


def keda_validator(plural: str) -> jsonschema.Draft7Validator:
    """A validator of KEDA's CRD `plural` (its served, stored version), `strict`."""
    crd = yaml.safe_load(keda_crd_file(plural).read_text())
    [version] = [v for v in crd["spec"]["versions"] if v["served"] and v["storage"]]
    return jsonschema.Draft7Validator(strict(version["schema"]["openAPIV3Schema"]))


def keda_objects(docs: list[Any]) -> list[dict[str, Any]]:
    return [d for d in docs if d["apiVersion"].startswith("keda.sh/")]


def test_keda_trigger_reads_the_workers_shared_consumer_with_parameters_keda_knows(
    offline_helm: helm.Helm,
) -> None:
    docs = render(offline_helm, "keda", namespace="ops")
    scaled = find(docs, "ScaledObject", "agentrun-worker")
    [trigger] = scaled["spec"]["triggers"]
    monitor = find(docs, "Service", "agentrun-nats-monitor")  # not the clients' Service
    assert [p["port"] for p in monitor["spec"]["ports"]] == [8222]
    metadata = trigger["metadata"]

    assert trigger["type"] == "nats-jetstream"
    assert (metadata["stream"], metadata["consumer"]) == (
        protocol.STREAM_TURNS,
        protocol.WORKERS_CONSUMER,
    )
    assert metadata["natsServerMonitoringEndpoint"] == "agentrun-nats-monitor.ops.svc:8222"
    assert set(metadata) <= keda_scaler_parameters()
    assert all(isinstance(value, str) for value in metadata.values())
    assert scaled["spec"]["scaleTargetRef"]["name"] == "agentrun-worker"


def test_the_closed_bus_trigger_has_keda_read_the_account_from_the_server_secret(
    offline_helm: helm.Helm,
) -> None:
    """No account in the metadata (a render cannot know it before the hook writes it): the
    TriggerAuthentication has KEDA read ``account.pub`` of the server's Secret into the
    authParam the scaler reads the account from."""
    docs = render(offline_helm, "keda", namespace="ops")
    [trigger] = find(docs, "ScaledObject", "agentrun-worker")["spec"]["triggers"]
    authentication = find(docs, "TriggerAuthentication", "agentrun-worker")

    assert "account" not in trigger["metadata"]
    assert trigger["authenticationRef"] == {"name": "agentrun-worker"}
    assert authentication["metadata"]["namespace"] == "ops"
    assert authentication["spec"] == {
        "secretTargetRef": [
            {"parameter": "account", "name": "agentrun-nats-server", "key": bootstrap.ACCOUNT_KEY}
        ]
    }
    parameters = {ref["parameter"] for ref in authentication["spec"]["secretTargetRef"]}
    assert parameters <= keda_auth_parameters()


def test_the_keda_objects_validate_against_kedas_own_crds(offline_helm: helm.Helm) -> None:
    validators = {
        yaml.safe_load(keda_crd_file(plural).read_text())["spec"]["names"]["kind"]: (
            keda_validator(plural)
        )
        for plural in KEDA_KINDS
    }
    rendered = keda_objects(render(offline_helm, "keda"))
    assert sorted(d["kind"] for d in rendered) == sorted(validators)
    for doc in rendered:
        errors = [e.message for e in validators[doc["kind"]].iter_errors(doc)]
        assert not errors, (doc["kind"], errors)
    misspelt = find(rendered, "TriggerAuthentication", "agentrun-worker")
    misspelt = {**misspelt, "spec": {"secretTargetRefs": misspelt["spec"]["secretTargetRef"]}}
    assert not validators["TriggerAuthentication"].is_valid(misspelt)  # the check is strict


KEDA_ACCOUNTS = [
    pytest.param(
        {"nats.install.enabled": "true", "worker.autoscaling.keda.account": "A" * 56},
        ("metadata", "A" * 56),
        id="account-given",
    ),
    pytest.param(
        {"nats.install.enabled": "true", "nats.auth.enabled": "false"},
        ("metadata", "$G"),
        id="open-bus-global-account",
    ),
    pytest.param(
        {
            "nats.install.enabled": "true",
            "nats.auth.operatorSecret": "bus-operator",
            "nats.auth.workerSecret": "bus-worker",
            "nats.auth.serverSecret": "bus-server",
        },
        ("secret", "bus-server"),
        id="server-secret-brought",
    ),
    pytest.param(
        {"nats.monitoringEndpoint": "nats.nats.svc:8222"},
        ("secret", "agentrun-nats-server"),
        id="existing-nats-hook-made-credentials",
    ),
    pytest.param(
        {
            "nats.monitoringEndpoint": "nats.nats.svc:8222",
            "nats.auth.operatorSecret": "bus-operator",
            "nats.auth.workerSecret": "bus-worker",
            "nats.auth.serverSecret": "bus-server",
        },
        ("secret", "bus-server"),
        id="existing-nats-credentials-and-server-secret-brought",
    ),
    pytest.param(
        {
            "nats.monitoringEndpoint": "nats.nats.svc:8222",
            "nats.auth.operatorSecret": "bus-operator",
            "nats.auth.workerSecret": "bus-worker",
            "worker.autoscaling.keda.account": "A" * 56,
        },
        ("metadata", "A" * 56),
        id="existing-nats-credentials-brought-account-given",
    ),
]
"""(values besides ``worker.autoscaling.keda.enabled``, where the trigger's account comes from:
the metadata and its value, or the Secret a TriggerAuthentication names)."""


@pytest.mark.parametrize(("given", "source"), KEDA_ACCOUNTS)
def test_the_trigger_takes_the_account_given_or_has_keda_read_it_from_a_secret_that_will_exist(
    offline_helm: helm.Helm, given: dict[str, str], source: tuple[str, str]
) -> None:
    values = {"worker.autoscaling.keda.enabled": "true", **given}
    docs = documents(offline_helm.template(CHART_DIR, values=values))
    [trigger] = find(docs, "ScaledObject", "agentrun-worker")["spec"]["triggers"]
    authentications = [d for d in docs if d["kind"] == "TriggerAuthentication"]
    match source:
        case ("metadata", account):
            assert trigger["metadata"]["account"] == account
            assert "authenticationRef" not in trigger and authentications == []
        case ("secret", secret):
            assert "account" not in trigger["metadata"]
            [authentication] = authentications
            assert trigger["authenticationRef"] == {"name": authentication["metadata"]["name"]}
            [ref] = authentication["spec"]["secretTargetRef"]
            assert (ref["name"], ref["key"]) == (secret, bootstrap.ACCOUNT_KEY)


def test_keda_on_an_existing_nats_with_credentials_brought_needs_the_account(
    offline_helm: helm.Helm,
) -> None:
    """No hook writes a server Secret and none is named: the render asks for the account."""
    values = {
        "worker.autoscaling.keda.enabled": "true",
        "nats.monitoringEndpoint": "nats.nats.svc:8222",
        "nats.auth.operatorSecret": "bus-operator",
        "nats.auth.workerSecret": "bus-worker",
    }
    sets = [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]
    result = offline_helm("template", "agentrun", str(CHART_DIR), *sets, check=False)
    assert result.returncode != 0
    assert "worker.autoscaling.keda.account" in result.stderr
    assert "nats.auth.serverSecret" in result.stderr


def test_the_mock_model_answers_from_the_examples_scenarios(offline_helm: helm.Helm) -> None:
    docs = render(offline_helm, "mock-model", namespace="demo")
    scenarios = find(docs, "ConfigMap", "agentrun-mock-model")["data"]["scenarios.yaml"]
    model = find(docs, "AgentModel", "mock")

    assert (CHART_DIR / "files" / "mock-scenarios.yaml").read_bytes() == (
        REPO_ROOT / "examples" / "scenarios.yaml"
    ).read_bytes(), (
        "copy with: cp examples/scenarios.yaml charts/agentrun/files/mock-scenarios.yaml"
    )
    assert yaml.safe_load(scenarios) == yaml.safe_load(
        (REPO_ROOT / "examples" / "scenarios.yaml").read_text()
    )
    assert model["spec"]["baseURL"] == "http://agentrun-mock-model.demo.svc:8000/v1"


def test_operator_shards_set_the_env_and_let_the_operator_use_every_shard_lease(
    offline_helm: helm.Helm,
) -> None:
    """``operator.shards`` > 1: AGENTRUN_OPERATOR_SHARDS, and the Role names each shard's
    Lease and each membership slot besides the one of active/standby (which stays alone with
    the default, 1)."""

    def lease_names(docs: list[Any]) -> list[str]:
        role = find(docs, "Role", "agentrun-operator-leader")
        named = [rule for rule in role["rules"] if rule.get("resourceNames")]
        assert len(named) == 1 and named[0]["verbs"] == ["get", "update"]
        return list(named[0]["resourceNames"])

    default = documents(offline_helm.template(CHART_DIR))
    assert (
        env_of(find(default, "Deployment", "agentrun-operator"))["AGENTRUN_OPERATOR_SHARDS"] == "1"
    )
    assert lease_names(default) == ["agentrun-operator"]
    sharded = documents(
        offline_helm.template(CHART_DIR, values={"operator.shards": "3", "operator.replicas": "3"})
    )
    assert (
        env_of(find(sharded, "Deployment", "agentrun-operator"))["AGENTRUN_OPERATOR_SHARDS"] == "3"
    )
    assert sorted(lease_names(sharded)) == sorted(
        ["agentrun-operator"]
        + [f"agentrun-operator-{i}" for i in range(3)]
        + [f"agentrun-operator-member-{i}" for i in range(3)]
    )
    assert find(sharded, "PodDisruptionBudget", "agentrun-operator")["spec"]["maxUnavailable"] == 1


def test_the_lease_flowschema_names_the_operators_account_and_never_the_default_one(
    offline_helm: helm.Helm,
) -> None:
    """Made for the operator's own ServiceAccount (or the one named); not for the
    namespace's ``default`` one, which every pod without an account of its own uses."""

    def schemas(values: dict[str, str]) -> list[Any]:
        docs = documents(offline_helm.template(CHART_DIR, values=values))
        return [d for d in docs if d["kind"] == "FlowSchema"]

    (made,) = schemas({})
    assert made["spec"]["priorityLevelConfiguration"] == {"name": "leader-election"}
    (rule,) = made["spec"]["rules"]
    assert rule["subjects"] == [
        {
            "kind": "ServiceAccount",
            "serviceAccount": {"name": "agentrun-operator", "namespace": "agentrun"},
        }
    ]
    assert rule["resourceRules"][0]["resources"] == ["leases"]
    named = {"serviceAccount.operator.create": "false", "serviceAccount.operator.name": "ops"}
    assert schemas(named)[0]["spec"]["rules"][0]["subjects"][0]["serviceAccount"]["name"] == "ops"
    assert schemas({"serviceAccount.operator.create": "false"}) == []
    assert schemas({"operator.leaseFlowSchema": "false"}) == []


@pytest.mark.parametrize(
    ("given", "cap"),
    [
        ({}, "96"),  # 3/4 of 2 workers × 64 slots
        ({"worker.concurrency": "8", "worker.replicas": "3"}, "18"),
        (
            {**FEATURES["keda"], "worker.autoscaling.keda.maxReplicas": "4"},
            "192",
        ),
        (
            {"worker.autoscaling.hpa.enabled": "true", "worker.autoscaling.hpa.minReplicas": "3"},
            "144",  # the CPU-based HPA does not scale for turns waiting: its least slots
        ),
        ({"worker.concurrency": "1", "worker.replicas": "1"}, "1"),
        ({"operator.defaultMaxConcurrentTurns": "7"}, "7"),
        ({"operator.defaultMaxConcurrentTurns": "0"}, "0"),
    ],
    ids=["defaults", "fixed", "keda", "hpa", "one-slot", "given", "off"],
)
def test_tenants_that_set_no_turn_cap_get_three_quarters_of_the_workers_slots(
    offline_helm: helm.Helm, given: dict[str, str], cap: str
) -> None:
    """A tenant's long tool calls hold the slots it has until they end: by default no tenant
    without its own ``maxConcurrentTurns`` may hold more than three quarters of them."""
    docs = documents(offline_helm.template(CHART_DIR, values=given))
    env = env_of(find(docs, "Deployment", "agentrun-operator"))
    assert env["AGENTRUN_DEFAULT_MAX_CONCURRENT_TURNS"] == cap


@pytest.mark.parametrize(("trust", "flagged"), [("false", False), ("true", True)])
def test_the_trajectory_server_trusts_any_front_proxy_certificate_only_when_asked(
    offline_helm: helm.Helm, trust: str, flagged: bool
) -> None:
    rendered = offline_helm.template(
        CHART_DIR,
        namespace="agentrun",
        values={
            **FEATURES["nats"],
            "trajectoryApi.trustAnyFrontProxyCertificate": trust,
        },
    )
    (deployment,) = [
        d
        for d in documents(rendered)
        if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-trajectory")
    ]
    command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert ("--trust-any-front-proxy-certificate" in command) is flagged
    assert "--event-budget-mib=32" in command  # the chart's default event budget
