"""An AgentEval being deleted (a foreground deletion, another controller's finalizer holding
it) creates no run: one created meanwhile would start a model loop for a suite nobody wants."""

from __future__ import annotations

import copy

from kube_support import FakeKube

from agentrun.operator.evals.controller import EVALS, EvalController
from agentrun.operator.platform.events import EventRecorder, Throttle
from agentrun.protocol import RunEvent

AGENT = {
    "metadata": {"name": "geometry", "namespace": "ns", "generation": 1},
    "spec": {"model": "mock", "instructions": "Use the calculate tool.", "tools": ["calculate"]},
}
SUITE = {
    "metadata": {"name": "suite", "namespace": "ns", "generation": 1, "uid": "suite-uid"},
    "spec": {
        "agentRef": {"name": "geometry"},
        "parallelism": 2,
        "cases": [
            {"name": "one", "goal": "Add 2 and 3.", "expect": {"reason": "completed"}},
            {"name": "two", "goal": "Add 4 and 5.", "expect": {"reason": "completed"}},
        ],
    },
}


class NoEvents:
    async def read_events(self, namespace: str, name: str, *, after_seq: int = 0) -> list[RunEvent]:
        return []


def controller(api: FakeKube) -> EvalController:
    events = EventRecorder(api, throttle=Throttle(repeat_after=0, rate=1000, burst=1000))
    return EvalController(api, runs=NoEvents(), events=events, retry=3600)


def run_names(api: FakeKube) -> list[str]:
    return sorted(key[2] for key in api.objects if key[0] == "agentruns")


async def test_a_suite_being_deleted_creates_no_run_for_its_cases() -> None:
    api = FakeKube()
    api.put("agents", AGENT)
    api.put(EVALS, copy.deepcopy(SUITE))
    ctl = controller(api)
    await ctl.reconcile("ns", "suite")
    first = run_names(api)
    assert len(first) == 2  # the control: a live suite creates its cases' runs
    for name in first:  # the garbage collector takes them while the suite waits for them
        del api.objects[("agentruns", "ns", name)]
    suite = api.find(EVALS, "suite", "ns")
    assert suite is not None
    suite["metadata"]["deletionTimestamp"] = "2026-11-30T10:00:05Z"
    await ctl.reconcile("ns", "suite")
    assert run_names(api) == []
    assert sum(verb == "create" for verb, _ in api.calls) == 2
