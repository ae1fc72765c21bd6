"""The run status writer on the real API server, through the port (``platform.kubeapi.Kube``):
a run whose object was deleted, or replaced by a new object of the same name, is reported gone
and its status never reaches the new object — whether the writer knew the old object's version
(its patch is refused, 409: a new object always has a newer resourceVersion, then the re-read
finds another uid) or never read it (the read finds another uid).

What does not protect it: the ``metadata.uid`` the patch carries. On the status subresource the
API server keeps the stored metadata, so a patch naming another uid lands
(``tests/reconcile/platform/test_kubeapi.py`` shows it on the same server); the writer's own uid
check and the resourceVersion are the preconditions that hold."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import yaml

from agentrun.operator.platform.kubeapi import Kube
from agentrun.operator.runs import RunKey
from agentrun.operator.runs.writer import StatusWriter

RUN = {
    "apiVersion": "agentrun.dev/v1alpha1",
    "kind": "AgentRun",
    "metadata": {"name": "patched"},
    "spec": {"model": "mock", "goal": "g", "tools": ["calculate"]},
}
RUNNING = {"phase": "Running", "lastEventSequence": 3}
ENDED = {"phase": "Succeeded", "terminalReason": "completed", "lastEventSequence": 4}


def create(kubectl: Any, namespace: str) -> RunKey:
    """A fresh AgentRun ``patched``; its key (the uid the API server gave it)."""
    kubectl("create", "-n", namespace, "-f", "-", input=yaml.safe_dump(RUN))
    found = json.loads(kubectl("get", "agentrun", "patched", "-n", namespace, "-o", "json").stdout)
    return RunKey(namespace, "patched", found["metadata"]["uid"])


def status_of(kubectl: Any, namespace: str) -> dict[str, Any]:
    found = json.loads(kubectl("get", "agentrun", "patched", "-n", namespace, "-o", "json").stdout)
    status: dict[str, Any] = found.get("status") or {}
    return status


@pytest.mark.parametrize("known", [True, False], ids=["version-known", "never-read"])
async def test_a_run_replaced_by_a_new_object_of_the_same_name_is_reported_gone(
    kube: Kube, kubectl: Any, test_namespace: str, known: bool
) -> None:
    old = create(kubectl, test_namespace)
    writer = StatusWriter(kube, interval=0.0)
    if known:
        writer.submit(old, RUNNING, seq=3, terminal=False)
        await writer.flush()
        assert status_of(kubectl, test_namespace) == RUNNING

    kubectl("delete", "agentrun", "patched", "-n", test_namespace, "--wait=true")
    new = create(kubectl, test_namespace)
    assert new.uid != old.uid
    writer.submit(old, ENDED, seq=4, terminal=True)
    await writer.flush()
    async with asyncio.timeout(5):
        assert await writer.next_gone() == old
    assert status_of(kubectl, test_namespace) == {}
    assert writer.writes == (1 if known else 0)


async def test_a_status_written_by_another_process_meanwhile_is_re_read_not_overwritten(
    kube: Kube, kubectl: Any, test_namespace: str
) -> None:
    """A projection older than what another operator wrote after our last patch: the patch at
    our version is refused (409), the re-read shows the newer sequence, the body is dropped."""
    run = create(kubectl, test_namespace)
    writer = StatusWriter(kube, interval=0.0)
    writer.submit(run, RUNNING, seq=3, terminal=False)
    await writer.flush()
    other = StatusWriter(kube, interval=0.0)
    other.submit(run, {"phase": "Running", "lastEventSequence": 9}, seq=9, terminal=False)
    await other.flush()
    writer.submit(run, {"phase": "Running", "lastEventSequence": 5}, seq=5, terminal=False)
    await writer.flush()
    assert status_of(kubectl, test_namespace)["lastEventSequence"] == 9
    assert (writer.writes, writer.stale) == (1, 1)
