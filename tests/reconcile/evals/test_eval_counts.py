"""An AgentEval's case is counted once per round, however its status write fares: against the
real kube-apiserver, the controller grades two ended runs while its status write fails (before
or after the API server applied it), and the retry counts each case, and posts its
``CaseFailed`` Event, exactly once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Hashable, Mapping
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import REGISTRY
from trajectory_support import NoEvents

from agentrun.operator.evals.controller import EvalController
from agentrun.operator.platform.events import EventRecorder, EventType, Involved, Throttle
from agentrun.operator.platform.kubeapi import ApiError, Kube, Ref

pytestmark = pytest.mark.usefixtures("crds")

AGENT = {
    "apiVersion": "agentrun.dev/v1alpha1",
    "kind": "Agent",
    "metadata": {"name": "geometry"},
    "spec": {"model": "mock", "instructions": "Use the calculate tool.", "tools": ["calculate"]},
}
SUITE = {
    "apiVersion": "agentrun.dev/v1alpha1",
    "kind": "AgentEval",
    "metadata": {"name": "suite"},
    "spec": {
        "agentRef": {"name": "geometry"},
        "parallelism": 2,
        "cases": [
            {"name": "done", "goal": "Add 2 and 3.", "expect": {"reason": "completed"}},
            {"name": "capped", "goal": "Loop.", "expect": {"reason": "max_steps"}},
        ],
    },
}
ENDED = {
    "phase": "Succeeded",
    "terminalReason": "completed",
    "outcome": "ok",
    "message": "completed",
    "usage": {"steps": 1, "totalTokens": 30, "costUSD": "0.000100"},
}


class Recorded(EventRecorder):
    """Keeps what is recorded (reason, key) instead of posting it."""

    def __init__(self, api: Kube) -> None:
        super().__init__(api, throttle=Throttle(repeat_after=0.0, rate=1000.0, burst=1000))
        self.seen: list[tuple[str, Hashable]] = []

    def record(
        self,
        involved: Involved,
        *,
        type: EventType,
        reason: str,
        message: str,
        key: Hashable | None = None,
    ) -> None:
        self.seen.append((reason, key))


class FailingStatusWrites(Kube):
    """The API server port whose next status write fails with a 500, sent to the API server
    first (the reply lost) when ``applied``."""

    def __init__(self, api: k8s.ApiClient) -> None:
        super().__init__(api)
        self.armed = False
        self.applied = False
        self.failed = 0

    async def patch_status(
        self, ref: Ref, status: Mapping[str, Any], *, uid: str = "", version: str = ""
    ) -> dict[str, Any]:
        if not self.armed:
            return await super().patch_status(ref, status, uid=uid, version=version)
        self.armed = False
        self.failed += 1
        if self.applied:
            await super().patch_status(ref, status, uid=uid, version=version)
        raise ApiError(500, "etcd leader changed")


@pytest.fixture
async def api(control_plane: Any) -> AsyncIterator[k8s.ApiClient]:
    configuration = k8s.Configuration()
    await k8s_config.load_kube_config(
        config_file=str(control_plane.kubeconfig), client_configuration=configuration
    )
    async with k8s.ApiClient(configuration) as api_client:
        await served(api_client)
        yield api_client


async def served(api: k8s.ApiClient, *, attempts: int = 60) -> None:
    """Wait until the API server serves AgentRuns and AgentEvals: right after their CRDs are
    established it may still answer 429 (storage initializing), which kubectl retries."""
    objects = k8s.CustomObjectsApi(api)
    for plural in ("agentruns", "agentevals", "agents"):
        for attempt in range(attempts):
            try:
                await objects.list_cluster_custom_object("agentrun.dev", "v1alpha1", plural)
                break
            except ApiException as err:
                if err.status != 429 or attempt == attempts - 1:
                    raise
                await asyncio.sleep(0.5)


def counted(namespace: str, result: str) -> float:
    labels = {"namespace": namespace, "eval": "suite", "result": result}
    return REGISTRY.get_sample_value("agentrun_eval_cases_total", labels) or 0.0


@pytest.mark.parametrize("applied", [False, True], ids=["write-refused", "write-reply-lost"])
async def test_a_case_graded_again_after_a_failed_status_write_is_counted_once(
    api: k8s.ApiClient, kubectl: Any, test_namespace: str, applied: bool
) -> None:
    ns = test_namespace
    for manifest in (AGENT, SUITE):
        kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(manifest))
    writes = FailingStatusWrites(api)
    events = Recorded(writes)
    controller = EvalController(writes, runs=NoEvents(), events=events)

    await controller.reconcile(ns, "suite")  # creates both runs
    runs = json.loads(kubectl("get", "agentruns", "-n", ns, "-o", "json").stdout)["items"]
    assert len(runs) == 2
    for run in runs:
        kubectl(
            *("patch", "agentrun", run["metadata"]["name"], "-n", ns, "--subresource=status"),
            *("--type=merge", "-p", json.dumps({"status": ENDED})),
        )

    writes.armed, writes.applied = True, applied
    with pytest.raises(ApiError):
        await controller.reconcile(ns, "suite")  # grades both; the status write fails
    assert writes.failed == 1
    assert (counted(ns, "passed"), counted(ns, "failed")) == (0, 0)
    assert [r for r, _ in events.seen if r == "CaseFailed"] == []

    for _ in range(2):  # the retry, and one more with nothing new
        await controller.reconcile(ns, "suite")
    assert (counted(ns, "passed"), counted(ns, "failed")) == (1, 1)
    assert [r for r, _ in events.seen].count("CaseFailed") == 1
    assert [r for r, _ in events.seen].count("EvaluationFailed") == 1
    suite = json.loads(kubectl("get", "agenteval", "suite", "-n", ns, "-o", "json").stdout)
    assert suite["status"]["summary"] == {"passed": 1, "failed": 1, "total": 2}
    assert [c["phase"] for c in suite["status"]["cases"]] == ["Passed", "Failed"]
