"""Rendering the chart and turning what it renders into objects the API server can judge
(imported by name; pytest puts this folder on sys.path)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from agentrun_dev import gobuild

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "charts" / "agentrun"
KEDA_MODULE = "github.com/kedacore/keda/v2"
KEDA_VERSION = "v2.21.0"
"""KEDA release whose ScaledObject and TriggerAuthentication CRDs and nats-jetstream scaler the
chart is checked against."""
KEDA_KINDS = ("scaledobjects", "triggerauthentications")
"""The plurals of KEDA's kinds the chart renders (``worker.autoscaling.keda``)."""
PROMETHEUS_OPERATOR_MODULE = "github.com/prometheus-operator/prometheus-operator"
PROMETHEUS_OPERATOR_VERSION = "v0.85.0"
"""Prometheus Operator release whose CRDs the chart's monitoring objects are checked against."""

Manifest = dict[str, Any]

FEATURES: dict[str, dict[str, str]] = {
    "defaults": {},
    "nats": {"nats.install.enabled": "true"},
    "nats-credentials-brought": {
        "nats.install.enabled": "true",
        "nats.auth.operatorSecret": "bus-operator",
        "nats.auth.workerSecret": "bus-worker",
        "nats.auth.serverSecret": "bus-server",
    },
    "nats-cluster": {"nats.install.enabled": "true", "nats.install.replicas": "3"},
    "nats-cluster-without-tls": {
        "nats.install.enabled": "true",
        "nats.install.replicas": "3",
        "nats.tls.enabled": "false",
    },
    "nats-without-persistence": {
        "nats.install.enabled": "true",
        "nats.install.persistence.enabled": "false",
    },
    "keda": {"nats.install.enabled": "true", "worker.autoscaling.keda.enabled": "true"},
    "keda-existing-nats": {
        "worker.autoscaling.keda.enabled": "true",
        "nats.monitoringEndpoint": "nats.nats.svc:8222",
    },
    "hpa": {"worker.autoscaling.hpa.enabled": "true"},
    "mock-model": {"mockModel.enabled": "true"},
    "prometheus-query": {"tools.prometheusQuery.url": "http://prometheus.monitoring.svc:9090"},
    "secrets-cluster-wide": {"rbac.secretsClusterWide": "true", "rbac.kubernetesGetTool": "false"},
    "monitoring": {
        "metrics.serviceMonitor.enabled": "true",
        "metrics.prometheusRule.enabled": "true",
        "metrics.grafanaDashboard.enabled": "true",
    },
    "monitoring-podmonitor": {
        "metrics.podMonitor.enabled": "true",
        "metrics.prometheusRule.enabled": "true",
    },
    "pod-extras": {
        "image.digest": "sha256:" + "0123456789abcdef" * 4,
        "operator.priorityClassName": "agentrun-control",
        "worker.priorityClassName": "agentrun-work",
        "operator.podLabels.team": "platform",
        "worker.podLabels.team": "platform",
        "worker.extraVolumes[0].name": "model-ca",
        "worker.extraVolumes[0].configMap.name": "model-ca",
        "worker.extraVolumeMounts[0].name": "model-ca",
        "worker.extraVolumeMounts[0].mountPath": "/etc/model-ca",
        "worker.extraVolumeMounts[0].readOnly": "true",
    },
    "no-network-policy": {"networkPolicy.enabled": "false", "nats.install.enabled": "true"},
    "worker-egress": {
        "nats.install.enabled": "true",
        "mockModel.enabled": "true",
        "networkPolicy.workerEgress.enabled": "true",
        "networkPolicy.workerEgress.apiServer.cidrs": "{10.0.0.10/32}",
        "networkPolicy.workerEgress.extraRules[0].ports[0].port": "443",
        "networkPolicy.nats.monitoring": "true",
        "networkPolicy.nats.extraClients[0].podSelector.matchLabels.role": "reader",
    },
    "worker-egress-existing-nats": {
        "nats.url": "tls://nats.messaging.svc:4443",
        "networkPolicy.workerEgress.enabled": "true",
        "networkPolicy.workerEgress.apiServer.cidrs": "{10.0.0.10/32}",
        "networkPolicy.workerEgress.nats[0].ipBlock.cidr": "10.1.2.3/32",
    },
    "everything": {
        "nats.install.enabled": "true",
        "worker.autoscaling.keda.enabled": "true",
        "mockModel.enabled": "true",
        "operator.defaultTenant": "default",
    },
}
"""Named value sets: the defaults and every optional feature turned on."""


def documents(rendered: str) -> list[Manifest]:
    """The non-empty YAML documents of `rendered` (a ``helm template`` output)."""
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def pod_from_workload(workload: Manifest) -> Manifest:
    """A bare Pod built from a Deployment's, StatefulSet's or Job's pod template, in its namespace.

    Pod Security Admission only warns about workloads; it enforces on pods, so this is what
    the API server is asked to admit. PersistentVolumeClaim templates become emptyDirs (a
    bare pod cannot own claims).
    """
    template = copy.deepcopy(workload["spec"]["template"])
    spec = template["spec"]
    claims = {c["metadata"]["name"] for c in workload["spec"].get("volumeClaimTemplates", [])}
    if claims:
        spec["volumes"] = spec.get("volumes", []) + [
            {"name": name, "emptyDir": {}} for name in sorted(claims)
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{workload['metadata']['name']}-psa-check",
            "namespace": workload["metadata"]["namespace"],
            "labels": template["metadata"].get("labels", {}),
        },
        "spec": spec,
    }


def keda_module_dir() -> Path:
    """The KEDA Go module's source at `KEDA_VERSION`, from the Go module proxy (cached by Go).

    Raises gobuild.BuildError if Go is missing or the download fails.
    """
    return module_dir(KEDA_MODULE, KEDA_VERSION)


def keda_crd_file(plural: str) -> Path:
    """KEDA's CRD of kind `plural` (one of `KEDA_KINDS`), from its Go module's
    ``config/crd/bases`` at `KEDA_VERSION`."""
    return keda_module_dir() / "config" / "crd" / "bases" / f"keda.sh_{plural}.yaml"


def monitoring_crd_files() -> list[Path]:
    """The Prometheus Operator's CRDs of the kinds the chart renders (ServiceMonitor,
    PodMonitor, PrometheusRule), from its Go module at `PROMETHEUS_OPERATOR_VERSION`."""
    crds = module_dir(PROMETHEUS_OPERATOR_MODULE, PROMETHEUS_OPERATOR_VERSION)
    folder = crds / "example" / "prometheus-operator-crd"
    kinds = ("servicemonitors", "podmonitors", "prometheusrules")
    return [folder / f"monitoring.coreos.com_{kind}.yaml" for kind in kinds]


def module_dir(module: str, version: str) -> Path:
    """A Go module's source at `version`, from the Go module proxy (cached by Go).

    Raises gobuild.BuildError if Go is missing or the download fails.
    """
    go = gobuild.find_go()
    result = subprocess.run(
        [str(go), "mod", "download", "-json", f"{module}@{version}"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd="/",
        env={**os.environ, "GOWORK": "off", "GO111MODULE": "on"},
    )
    try:
        info = json.loads(result.stdout)
    except ValueError as exc:
        raise gobuild.BuildError(f"go mod download printed no JSON: {result.stderr}") from exc
    if "Dir" not in info:
        raise gobuild.BuildError(f"go mod download {module}: {info.get('Error', info)}")
    return Path(info["Dir"])
