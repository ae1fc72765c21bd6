"""The AgentRun status store against the real API server: a status patch lands only at the
resourceVersion last seen of an object with the run's uid, so a run whose object was deleted,
or replaced by a new one of the same name (which always has a newer resourceVersion), is
reported gone and its status never reaches the new object.

What does not protect it: the ``metadata.uid`` the patch carries. On the status subresource
the API server keeps the stored metadata (its status strategy), so a merge patch naming
another uid at the current resourceVersion is applied (checked by hand against this
kube-apiserver; on the main resource the same patch is refused as a change of an immutable
field). The precondition that holds is the resourceVersion."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException

from agentrun.operator.runs import RunKey
from agentrun.operator.statuswriter import KubeStatusStore, StatusWriter

pytestmark = pytest.mark.usefixtures("crds")

RUN = {
    "apiVersion": "agentrun.dev/v1alpha1",
    "kind": "AgentRun",
    "metadata": {"name": "patched"},
    "spec": {"model": "mock", "goal": "g", "tools": ["calculate"]},
}
RUNNING = {"phase": "Running", "lastEventSequence": 3}


@pytest.fixture
async def api(control_plane: Any) -> AsyncIterator[k8s.ApiClient]:
    configuration = k8s.Configuration()
    await k8s_config.load_kube_config(
        config_file=str(control_plane.kubeconfig), client_configuration=configuration
    )
    async with k8s.ApiClient(configuration) as api_client:
        yield api_client


def create(kubectl: Any, namespace: str) -> RunKey:
    """A fresh AgentRun ``patched``; its key (the uid the API server gave it)."""
    kubectl("create", "-n", namespace, "-f", "-", input=yaml.safe_dump(RUN))
    found = json.loads(kubectl("get", "agentrun", "patched", "-n", namespace, "-o", "json").stdout)
    return RunKey(namespace, "patched", found["metadata"]["uid"])


def status_of(kubectl: Any, namespace: str) -> dict[str, Any]:
    found = json.loads(kubectl("get", "agentrun", "patched", "-n", namespace, "-o", "json").stdout)
    status: dict[str, Any] = found.get("status") or {}
    return status


async def read_when_served(store: KubeStatusStore, run: RunKey, *, attempts: int = 60) -> Any:
    """``store.read`` once the API server serves AgentRuns (right after the CRD is established
    it may answer 429 while its storage initializes)."""
    for attempt in range(attempts):
        try:
            return await store.read(run)
        except ApiException as err:
            if err.status != 429 or attempt == attempts - 1:
                raise
            await asyncio.sleep(0.5)


async def test_a_patch_lands_only_at_the_version_last_seen(
    api: k8s.ApiClient, kubectl: Any, test_namespace: str
) -> None:
    store = KubeStatusStore(api)
    run = create(kubectl, test_namespace)
    seen = await read_when_served(store, run)
    assert seen is not None and (seen.seq, seen.terminal) == (0, False)
    written = await store.patch(run, RUNNING, version=seen.version)
    assert (written.seq, int(written.version) > int(seen.version)) == (3, True)
    with pytest.raises(ApiException) as stale:
        await store.patch(run, {"phase": "Failed"}, version=seen.version)
    assert stale.value.status == 409
    assert status_of(kubectl, test_namespace) == RUNNING
    other = RunKey(run.namespace, run.name, "00000000-0000-0000-0000-000000000000")
    assert await store.read(other) is None  # an object of that name with another uid


async def test_a_run_replaced_by_a_new_object_of_the_same_name_is_reported_gone(
    api: k8s.ApiClient, kubectl: Any, test_namespace: str
) -> None:
    store = KubeStatusStore(api)
    old = create(kubectl, test_namespace)
    assert await read_when_served(store, old) is not None
    writer = StatusWriter(store, interval=0.0)
    writer.submit(old, RUNNING, seq=3, terminal=False)
    await writer.flush()
    assert status_of(kubectl, test_namespace) == RUNNING

    kubectl("delete", "agentrun", "patched", "-n", test_namespace, "--wait=true")
    new = create(kubectl, test_namespace)
    assert new.uid != old.uid
    writer.submit(old, {"phase": "Succeeded", "lastEventSequence": 4}, seq=4, terminal=True)
    await writer.flush()
    async with asyncio.timeout(5):
        assert await writer.next_gone() == old
    assert status_of(kubectl, test_namespace) == {}
