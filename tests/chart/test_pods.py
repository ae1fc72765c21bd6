"""What a platform team sets on the chart's pods lands where Kubernetes reads it: disruption
budgets, topology spread, priority, labels and annotations, extra volumes, images pinned by
digest; the worker's grace period reaches the worker as its drain, and its probes are the ones
its event loop answers. What the chart cannot honour is refused by name."""

from __future__ import annotations

from typing import Any

import pytest
from chart_support import CHART_DIR, FEATURES, documents

from agentrun.settings import WorkerSettings
from agentrun_dev import helm

DIGEST = FEATURES["pod-extras"]["image.digest"]


def render(offline_helm: helm.Helm, values: dict[str, str]) -> list[dict[str, Any]]:
    return documents(offline_helm.template(CHART_DIR, namespace="agentrun", values=values))


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name} rendered {len(matches)} times"
    return matches[0]


def pod_spec(docs: list[dict[str, Any]], component: str) -> dict[str, Any]:
    spec: dict[str, Any] = find(docs, "Deployment", f"agentrun-{component}")["spec"]["template"]
    return spec


def env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize("component", ["operator", "worker"])
def test_a_disruption_budget_covers_each_component_by_its_pods_labels(
    offline_helm: helm.Helm, component: str
) -> None:
    docs = render(offline_helm, {})
    budget = find(docs, "PodDisruptionBudget", f"agentrun-{component}")
    labels = pod_spec(docs, component)["metadata"]["labels"]
    selector = budget["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items()
    assert selector["app.kubernetes.io/component"] == component
    assert budget["spec"]["maxUnavailable"] == 1
    off = render(offline_helm, {f"{component}.podDisruptionBudget.enabled": "false"})
    assert not [d for d in off if d["kind"] == "PodDisruptionBudget" and component in str(d)]


@pytest.mark.parametrize("component", ["operator", "worker"])
def test_pods_spread_over_nodes_by_default_and_a_given_selector_is_kept(
    offline_helm: helm.Helm, component: str
) -> None:
    pod = pod_spec(render(offline_helm, {}), component)
    (spread,) = pod["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"
    assert spread["labelSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    zone = {
        f"{component}.topologySpreadConstraints[0].maxSkew": "2",
        f"{component}.topologySpreadConstraints[0].topologyKey": "topology.kubernetes.io/zone",
        f"{component}.topologySpreadConstraints[0].whenUnsatisfiable": "DoNotSchedule",
        f"{component}.topologySpreadConstraints[0].labelSelector.matchLabels.tier": "agents",
    }
    (given,) = pod_spec(render(offline_helm, zone), component)["spec"]["topologySpreadConstraints"]
    assert given == {
        "maxSkew": 2,
        "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"tier": "agents"}},
    }


def test_priority_labels_and_extra_volumes_reach_the_pods(offline_helm: helm.Helm) -> None:
    docs = render(offline_helm, FEATURES["pod-extras"])
    operator, worker = pod_spec(docs, "operator"), pod_spec(docs, "worker")
    assert operator["spec"]["priorityClassName"] == "agentrun-control"
    assert worker["spec"]["priorityClassName"] == "agentrun-work"
    assert operator["metadata"]["labels"]["team"] == worker["metadata"]["labels"]["team"]
    assert {"name": "model-ca", "configMap": {"name": "model-ca"}} in worker["spec"]["volumes"]
    mounts = worker["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "model-ca", "mountPath": "/etc/model-ca", "readOnly": True} in mounts
    annotated = render(offline_helm, {"worker.podAnnotations.example\\.com/owner": "team-a"})
    assert pod_spec(annotated, "worker")["metadata"]["annotations"] == {
        "example.com/owner": "team-a"
    }


def test_images_pinned_by_digest_replace_the_tag(offline_helm: helm.Helm) -> None:
    nats_digest = "sha256:" + "f" * 64
    docs = render(
        offline_helm,
        {
            **FEATURES["pod-extras"],
            "mockModel.enabled": "true",
            "nats.install.enabled": "true",
            "nats.install.image.digest": nats_digest,
        },
    )
    images = {
        c["image"]
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet")
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert images == {f"agentrun.dev/agentrun@{DIGEST}", f"agentrun.dev/nats@{nats_digest}"}


def test_the_workers_can_stay_on_the_previous_image_while_the_operator_rolls(
    offline_helm: helm.Helm,
) -> None:
    """An upgrade rolls the operator first: ``worker.image`` keeps the workers where they are
    (a tag, or a digest that wins over it), and only the workers; empty, they run ``image``."""

    def images(values: dict[str, str]) -> dict[str, str]:
        docs = render(offline_helm, {"image.tag": "0.2.0", "mockModel.enabled": "true", **values})
        return {
            d["metadata"]["name"].removeprefix("agentrun-"): c["image"]
            for d in docs
            if d["kind"] == "Deployment"
            for c in d["spec"]["template"]["spec"]["containers"]
        }

    new, old = "agentrun.dev/agentrun:0.2.0", "agentrun.dev/agentrun:0.1.0"
    assert images({"worker.image.tag": "0.1.0"}) == {
        "operator": new, "worker": old, "mock-model": new, "trajectory": new,
    }  # fmt: skip
    pinned = "sha256:" + "e" * 64
    assert images({"worker.image.tag": "0.1.0", "worker.image.digest": pinned})["worker"] == (
        f"agentrun.dev/agentrun@{pinned}"
    )
    assert set(images({}).values()) == {new}


@pytest.mark.parametrize(
    ("assignment", "named"),
    [
        pytest.param("worker.extraArgs[0]=--x", "'extraArgs' not allowed", id="extra-args-gone"),
        pytest.param("image.digest=latest", "/image/digest", id="digest-not-sha256"),
        pytest.param(
            "worker.image.digest=0.1.0", "/worker/image/digest", id="worker-digest-not-sha256"
        ),
        pytest.param(
            "worker.image.repository=x", "'repository' not allowed", id="worker-repository"
        ),
        pytest.param(
            "worker.podDisruptionBudget.maxUnavailable=half",
            "/worker/podDisruptionBudget/maxUnavailable",
            id="budget-not-a-count",
        ),
    ],
)
def test_values_the_chart_cannot_honour_are_refused_by_name(
    offline_helm: helm.Helm, assignment: str, named: str
) -> None:
    key, value = assignment.split("=", 1)
    with pytest.raises(helm.HelmError) as refused:
        offline_helm.template(CHART_DIR, values={key: value})
    assert named in str(refused.value)


def test_the_worker_drains_for_its_grace_period_less_the_margin(offline_helm: helm.Helm) -> None:
    values = {"worker.terminationGracePeriodSeconds": "240", "worker.drainMarginSeconds": "70"}
    worker = pod_spec(render(offline_helm, values), "worker")
    assert worker["spec"]["terminationGracePeriodSeconds"] == 240
    variables = env(worker)
    assert (variables["AGENTRUN_TERMINATION_GRACE"], variables["AGENTRUN_DRAIN_MARGIN"]) == (
        "240",
        "70",
    )
    settings = WorkerSettings.model_validate(
        {
            "termination_grace": variables["AGENTRUN_TERMINATION_GRACE"],
            "drain_margin": variables["AGENTRUN_DRAIN_MARGIN"],
        }
    )
    assert settings.drain_seconds == 170.0


def test_a_drain_margin_not_below_the_grace_period_fails_the_render(
    offline_helm: helm.Helm,
) -> None:
    values = {"worker.terminationGracePeriodSeconds": "30", "worker.drainMarginSeconds": "30"}
    with pytest.raises(helm.HelmError) as refused:
        offline_helm.template(CHART_DIR, values=values)
    assert "worker.drainMarginSeconds must be below" in str(refused.value)


def test_the_workers_probes_are_the_ones_its_event_loop_answers(offline_helm: helm.Helm) -> None:
    worker = pod_spec(render(offline_helm, {"worker.metricsPort": "0"}), "worker")
    container = worker["spec"]["containers"][0]
    assert env(worker)["AGENTRUN_HEALTH_PORT"] == "8081"
    assert {"name": "health", "containerPort": 8081, "protocol": "TCP"} in container["ports"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}


@pytest.mark.parametrize(
    ("values", "store_bytes"),
    [
        pytest.param({"nats.install.enabled": "true"}, "1000000000", id="installed-1G"),
        pytest.param(
            {"nats.install.enabled": "true", "nats.install.maxFileStore": "2GB"},
            str(2 << 30),
            id="installed-2GB",
        ),
        pytest.param({"nats.storeBytes": "5000000"}, "5000000", id="brought"),
        pytest.param({}, "0", id="unknown"),
    ],
)
def test_the_operator_knows_the_jetstream_store_s_size_in_nats_units(
    offline_helm: helm.Helm, values: dict[str, str], store_bytes: str
) -> None:
    """1K is 1000 and 1KB 1024 in the NATS server's configuration."""
    operator = pod_spec(render(offline_helm, values), "operator")
    assert env(operator)["AGENTRUN_JETSTREAM_STORE_BYTES"] == store_bytes


@pytest.mark.parametrize(
    ("values", "variable", "expected"),
    [
        pytest.param({}, "AGENTRUN_NATS_REPLICAS", "1", id="replicas-default"),
        pytest.param({"nats.jetstream.replicas": "3"}, "AGENTRUN_NATS_REPLICAS", "3", id="R3"),
        pytest.param({}, "AGENTRUN_LEDGER_LAYOUT", "single", id="layout-default"),
        pytest.param(
            {"nats.jetstream.ledgerLayout": "split"}, "AGENTRUN_LEDGER_LAYOUT", "split", id="split"
        ),
        # a namespace creating runs in a loop fills its own tenant's queue, not the ledger
        # bucket every tenant shares
        pytest.param({}, "AGENTRUN_MAX_QUEUED_RUNS", "10000", id="queue-bounded"),
        pytest.param(
            {"operator.maxQueuedRuns": "0"}, "AGENTRUN_MAX_QUEUED_RUNS", "0", id="queue-unbounded"
        ),
    ],
)
def test_the_operator_gets_its_settings_from_the_values(
    offline_helm: helm.Helm, values: dict[str, str], variable: str, expected: str
) -> None:
    """The streams' replica count it provisions, the ledger layout, the bound of each tenant's
    admission queue."""
    operator = pod_spec(render(offline_helm, values), "operator")
    assert env(operator)[variable] == expected


def test_an_unknown_ledger_layout_fails_the_render(offline_helm: helm.Helm) -> None:
    with pytest.raises(helm.HelmError, match="ledgerLayout"):
        render(offline_helm, {"nats.jetstream.ledgerLayout": "sharded"})


def test_more_replicas_than_jetstream_allows_fail_the_render(offline_helm: helm.Helm) -> None:
    with pytest.raises(helm.HelmError) as refused:
        render(offline_helm, {"nats.jetstream.replicas": "7"})
    assert "replicas" in str(refused.value)
