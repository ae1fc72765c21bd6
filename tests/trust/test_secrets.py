"""``agentrun signing bootstrap|rotate|retire`` on a real API server: the keys are made once and
then left alone, a rotation trusts the new key at once and keeps the old one trusted, a key is
retired only once no run still going can carry its seal (the AgentRuns' status says which are
going), and the command line says what it did or why it refused."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from agentrun import kube
from agentrun.natsauth.bootstrap import SecretStore
from agentrun.trust import keys, secrets
from agentrun.trust.keys import SigningKeys, TrustedKeys
from agentrun_dev import controlplane
from agentrun_dev.kubectl import Kubectl

pytestmark = pytest.mark.e2e

NAMES = secrets.SecretNames("agentrun")


@pytest.fixture
async def store(
    control_plane: controlplane.Cluster, test_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[SecretStore]:
    monkeypatch.setenv("KUBECONFIG", str(control_plane.kubeconfig))
    api = await kube.api_client()
    yield SecretStore(client.CoreV1Api(api), test_namespace)
    await api.close()


async def files(store: SecretStore) -> tuple[SigningKeys, TrustedKeys]:
    signing, trust = await store.read(NAMES.signing), await store.read(NAMES.trust)
    assert signing is not None and trust is not None
    return (
        SigningKeys.parse(signing[keys.SIGNING_FILE]),
        TrustedKeys.parse(trust[keys.TRUST_FILE]),
    )


async def test_bootstrap_makes_the_keys_once(store: SecretStore) -> None:
    assert await secrets.bootstrap(store, NAMES, now=100.0) == [NAMES.signing, NAMES.trust]
    signing, trusted = await files(store)
    assert set(trusted.keys) == {signing.active(100.0).id}
    assert await secrets.bootstrap(store, NAMES, now=200.0) == []
    assert await files(store) == (signing, trusted)


async def test_a_lost_trust_secret_is_made_again_from_the_signing_keys(
    store: SecretStore,
) -> None:
    await secrets.bootstrap(store, NAMES, now=100.0)
    signing, trusted = await files(store)
    await store.write(NAMES.trust, {keys.TRUST_FILE: TrustedKeys({}).text()}, replace=True)
    assert await secrets.bootstrap(store, NAMES, now=200.0) == [NAMES.trust]
    assert await files(store) == (signing, trusted)


async def test_a_rotation_trusts_the_new_key_and_retires_the_old_only_when_no_run_holds_it(
    store: SecretStore,
) -> None:
    with pytest.raises(secrets.KeysMissing, match="signing bootstrap"):
        await secrets.rotate(store, NAMES, now=0.0)
    await secrets.bootstrap(store, NAMES, now=0.0)
    old = (await files(store))[0].active(0.0)
    new = await secrets.rotate(store, NAMES, now=10.0, activate_after=5.0)
    signing, trusted = await files(store)
    assert set(trusted.keys) == {old.id, new.id}
    assert signing.active(12.0).id == old.id and signing.active(15.0).id == new.id
    with pytest.raises(secrets.RetireRefused, match="1 run"):
        await secrets.retire(store, NAMES, old.id, admitted=[14.0], now=20.0)
    assert set((await files(store))[1].keys) == {old.id, new.id}
    await secrets.retire(store, NAMES, old.id, admitted=[16.0], now=20.0)
    signing, trusted = await files(store)
    assert set(trusted.keys) == {new.id} and [k.id for k in signing.keys] == [new.id]


async def test_the_runs_still_going_are_read_from_the_agentruns(
    store: SecretStore, kubectl: Kubectl, crds: list[str], test_namespace: str
) -> None:
    for name, phase in (("going", "Running"), ("done", "Succeeded")):
        kubectl("apply", "-n", test_namespace, "-f", "-", input=(
            "apiVersion: agentrun.dev/v1alpha1\nkind: AgentRun\n"
            f"metadata: {{name: {name}}}\nspec: {{model: mock, goal: g}}\n"
        ))  # fmt: skip
        status = f'{{"status": {{"phase": "{phase}", "startTime": "2026-01-02T03:04:05Z"}}}}'
        kubectl("patch", "agentrun", name, "-n", test_namespace, "--subresource=status",
                "--type=merge", "-p", status)  # fmt: skip
    api = await kube.api_client()
    try:
        times = await secrets.admitted_times(api)
    finally:
        await api.close()
    assert 1767323045.0 in times  # 2026-01-02T03:04:05Z, the going run's
    # the API server is shared: other tests' runs count too (a run's status written without a
    # startTime, as a status writer's test leaves one, has no admission time to count)
    listed = json.loads(kubectl("get", "agentruns", "-A", "-o", "json").stdout)["items"]
    going = [
        item
        for item in listed
        if item.get("status", {}).get("phase") in ("Running", "AwaitingApproval")
        and item["status"].get("startTime")
    ]
    assert len(times) == len(going)


def test_the_command_line_bootstraps_rotates_and_refuses_a_retirement(
    kubectl: Kubectl, test_namespace: str
) -> None:
    agentrun = [str(Path(sys.executable).with_name("agentrun"))]
    common = [f"--namespace={test_namespace}", "--prefix=cli"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*agentrun, "signing", *args, *common],
            env=kubectl.env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    made = run("bootstrap")
    assert made.returncode == 0 and made.stdout == "created or updated: cli-signing, cli-trust\n"
    assert run("bootstrap").stdout == "created or updated: nothing\n"
    rotated = run("rotate", "--activate-after=600")
    assert rotated.returncode == 0 and rotated.stdout.startswith("new key k"), rotated.stderr
    new = rotated.stdout.split()[2].rstrip(":")
    assert new.startswith("k") and float(rotated.stdout.split()[-1]) > time.time() + 500
    refused = run("retire", new)
    assert refused.returncode == 1 and "signs now" in refused.stderr, refused
