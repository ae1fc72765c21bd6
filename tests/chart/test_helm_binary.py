"""The pinned helm: built from the Go module proxy with the link-time stamps of a release."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from agentrun_dev import gobuild, helm

HELM_GO_MOD = """\
module helm.sh/helm/v3

go 1.26.0

require (
\tk8s.io/api v0.37.0
\tk8s.io/client-go v0.37.0
)
"""


def test_the_offline_kubernetes_version_is_stamped_from_helms_client_go() -> None:
    flags = gobuild.helm_ldflags(module_version="v3.22.0", go_mod=HELM_GO_MOD).split()

    assert "helm.sh/helm/v3/internal/version.version=v3.22.0" in flags
    assert "helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=37" in flags
    assert "helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=37" in flags


def test_the_cached_helm_is_the_pinned_release(offline_helm: helm.Helm) -> None:
    assert offline_helm("version", "--short").stdout.strip() == helm.HELM_VERSION


def test_offline_rendering_assumes_the_kubernetes_of_helms_client_go(
    offline_helm: helm.Helm, tmp_path: Path
) -> None:
    chart = tmp_path / "probe"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: probe\nversion: 0.1.0\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: probe}\n"
        "data: {kube: {{ .Capabilities.KubeVersion.Version | quote }}}\n"
    )

    rendered = offline_helm("template", "probe", str(chart)).stdout

    go_mod = helm_go_mod()
    minor = go_mod.split("k8s.io/client-go v0.", 1)[1].split(".", 1)[0]
    assert f'kube: "v1.{minor}.0"' in rendered


def helm_go_mod() -> str:
    """helm's go.mod at the pinned version, from the Go module cache (downloaded if needed)."""
    result = subprocess.run(
        [
            str(gobuild.find_go()),
            "mod",
            "download",
            "-json",
            f"{gobuild.HELM_MODULE}@{helm.HELM_VERSION}",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
        timeout=300,
    )
    return Path(json.loads(result.stdout)["GoMod"]).read_text()
