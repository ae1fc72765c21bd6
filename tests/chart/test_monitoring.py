"""The chart's monitoring objects: the alert rules as a PrometheusRule and the dashboard as a
ConfigMap for Grafana's sidecar, both rendered from the chart's own files (one copy each), plus
ServiceMonitors or PodMonitors; all off by default and switched on by values."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_support import CHART_DIR, documents

from agentrun_dev import helm

RULES_FILE = CHART_DIR / "alerts" / "agentrun.rules.yaml"
DASHBOARD_FILE = CHART_DIR / "dashboards" / "agentrun.json"
MONITORING_KINDS = {"PrometheusRule", "ServiceMonitor", "PodMonitor"}


def render(offline_helm: helm.Helm, **values: str) -> list[dict[str, Any]]:
    return documents(offline_helm.template(CHART_DIR, namespace="agentrun", values=values))


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def dashboards(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in of_kind(docs, "ConfigMap") if "agentrun.json" in d.get("data", {})]


def test_no_monitoring_object_by_default(offline_helm: helm.Helm) -> None:
    docs = render(offline_helm)
    assert {d["kind"] for d in docs} & MONITORING_KINDS == set()
    assert dashboards(docs) == []


def test_the_prometheus_rule_is_the_chart_s_rule_file(offline_helm: helm.Helm) -> None:
    docs = render(offline_helm, **{"metrics.prometheusRule.enabled": "true"})
    (rule,) = of_kind(docs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == "agentrun"
    assert rule["spec"] == yaml.safe_load(RULES_FILE.read_text())


def test_the_prometheus_rule_takes_labels_and_a_runbook_base_url(offline_helm: helm.Helm) -> None:
    docs = render(
        offline_helm,
        **{
            "metrics.prometheusRule.enabled": "true",
            "metrics.prometheusRule.labels.release": "kube-prometheus-stack",
            "metrics.prometheusRule.runbookBaseURL": "https://wiki.example.com/agentrun/",
        },
    )
    (rule,) = of_kind(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    shipped = yaml.safe_load(RULES_FILE.read_text())
    for group, original in zip(rule["spec"]["groups"], shipped["groups"], strict=True):
        for got, want in zip(group["rules"], original["rules"], strict=True):
            url = got["annotations"].pop("runbook_url")
            assert url == f"https://wiki.example.com/agentrun/{got['alert']}.md"
            want["annotations"].pop("runbook_url")
            assert got == want


def test_the_rendered_rules_pass_promtool(
    offline_helm: helm.Helm, prometheus_binaries: Any, tmp_path: Path
) -> None:
    docs = render(offline_helm, **{"metrics.prometheusRule.enabled": "true"})
    (rule,) = of_kind(docs, "PrometheusRule")
    path = tmp_path / "rendered.rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
    done = subprocess.run(
        [str(prometheus_binaries.promtool), "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_dashboard_config_map_is_the_chart_s_dashboard(offline_helm: helm.Helm) -> None:
    docs = render(offline_helm, **{"metrics.grafanaDashboard.enabled": "true"})
    (config_map,) = dashboards(docs)
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == "agentrun"
    assert config_map["data"]["agentrun.json"] == DASHBOARD_FILE.read_text().rstrip("\n")
    assert json.loads(config_map["data"]["agentrun.json"])["uid"] == "agentrun"


def test_the_dashboard_s_sidecar_label_namespace_and_annotations_are_values(
    offline_helm: helm.Helm,
) -> None:
    docs = render(
        offline_helm,
        **{
            "metrics.grafanaDashboard.enabled": "true",
            "metrics.grafanaDashboard.label": "grafana_dashboard_agentrun",
            "metrics.grafanaDashboard.labelValue": "yes",
            "metrics.grafanaDashboard.namespace": "monitoring",
            "metrics.grafanaDashboard.annotations.grafana_folder": "Agents",
        },
    )
    (config_map,) = dashboards(docs)
    meta = config_map["metadata"]
    assert meta["labels"]["grafana_dashboard_agentrun"] == "yes"
    assert "grafana_dashboard" not in meta["labels"]
    assert meta["namespace"] == "monitoring"
    assert meta["annotations"] == {"grafana_folder": "Agents"}


@pytest.mark.parametrize("monitor", ["serviceMonitor", "podMonitor"])
def test_a_monitor_per_component_scrapes_its_metrics_port(
    offline_helm: helm.Helm, monitor: str
) -> None:
    kind = monitor[0].upper() + monitor[1:]
    docs = render(offline_helm, **{f"metrics.{monitor}.enabled": "true"})
    monitors = {d["metadata"]["name"]: d for d in of_kind(docs, kind)}
    assert set(monitors) == {"agentrun-operator", "agentrun-worker"}
    for component in ("operator", "worker"):
        spec = monitors[f"agentrun-{component}"]["spec"]
        labels = spec["selector"]["matchLabels"]
        assert labels["app.kubernetes.io/component"] == component
        endpoints = spec.get("endpoints") or spec["podMetricsEndpoints"]
        assert [e["port"] for e in endpoints] == ["metrics"]


def test_service_and_pod_monitors_at_once_fail(offline_helm: helm.Helm) -> None:
    result = offline_helm(
        "template",
        "agentrun",
        str(CHART_DIR),
        *("--set", "metrics.serviceMonitor.enabled=true,metrics.podMonitor.enabled=true"),
        check=False,
    )
    assert result.returncode != 0 and "choose one" in result.stderr
