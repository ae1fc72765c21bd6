"""The chart's run-signing keys: the hook that makes them (``agentrun signing bootstrap``)
before every install and upgrade, the operator alone mounting the private keys, every process
the trusted public keys, and keys brought by the user needing no hook (both or neither)."""

from __future__ import annotations

import pytest
from chart_support import CHART_DIR, documents
from test_closed_bus import mounts_of, secrets_of
from test_render import env_of, find, render

from agentrun_dev import helm


def test_the_hook_makes_the_keys_before_install_and_upgrade_with_secret_rights_only(
    offline_helm: helm.Helm,
) -> None:
    docs = render(offline_helm, "defaults", namespace="ops")
    job = find(docs, "Job", "agentrun-run-signing")
    role = find(docs, "Role", "agentrun-run-signing")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command == ["agentrun", "signing", "bootstrap", "--namespace=ops", "--prefix=agentrun"]
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create", "update"]}
    ]


def test_the_operator_alone_mounts_the_signing_keys_and_every_process_the_trusted_ones(
    offline_helm: helm.Helm,
) -> None:
    docs = render(offline_helm, "defaults", namespace="ops")
    operator = find(docs, "Deployment", "agentrun-operator")
    worker = find(docs, "Deployment", "agentrun-worker")
    assert env_of(operator)["AGENTRUN_RUN_SIGNING_FILE"] == (
        "/var/run/agentrun/run-signing/signing.json"
    )
    assert mounts_of(operator)["run-signing"] == "/var/run/agentrun/run-signing"
    assert secrets_of(operator)["run-signing"] == "agentrun-signing"
    for workload in (operator, worker):
        assert env_of(workload)["AGENTRUN_RUN_TRUST_FILE"] == (
            "/var/run/agentrun/run-trust/trust.json"
        )
        assert mounts_of(workload)["run-trust"] == "/var/run/agentrun/run-trust"
        assert secrets_of(workload)["run-trust"] == "agentrun-trust"
    assert "AGENTRUN_RUN_SIGNING_FILE" not in env_of(worker)
    assert "run-signing" not in secrets_of(worker)


def test_keys_brought_by_the_user_need_no_hook(offline_helm: helm.Helm) -> None:
    values = {"runSigning.signingSecret": "my-signing", "runSigning.trustSecret": "my-trust"}
    docs = documents(offline_helm.template(CHART_DIR, namespace="ops", values=values))
    assert not [d for d in docs if "run-signing" in d["metadata"]["name"]]
    assert secrets_of(find(docs, "Deployment", "agentrun-operator"))["run-signing"] == (
        "my-signing"
    )
    assert secrets_of(find(docs, "Deployment", "agentrun-worker"))["run-trust"] == "my-trust"


@pytest.mark.parametrize("brought", ["signingSecret", "trustSecret"])
def test_one_key_secret_brought_without_the_other_is_refused(
    offline_helm: helm.Helm, brought: str
) -> None:
    with pytest.raises(helm.HelmError, match="bring signingSecret and trustSecret together"):
        offline_helm.template(CHART_DIR, namespace="ops", values={f"runSigning.{brought}": "x"})
