"""Deletions around an AgentEval never make it pay for a run twice: one being deleted (a
foreground deletion, another controller's finalizer holding it) creates no run, and a case
whose run was deleted before it was graded (a short ``ttlSecondsAfterFinished``, the
tenant's default one, a person) fails saying so instead of running again."""

from __future__ import annotations

import copy

from kube_support import FakeKube
from trajectory_support import NoEvents

from agentrun.operator.evals.controller import EvalController
from agentrun.operator.evals.store import EVALS
from agentrun.operator.platform.events import EventRecorder, Throttle

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


def controller(api: FakeKube) -> EvalController:
    events = EventRecorder(api, throttle=Throttle(repeat_after=0, rate=1000, burst=1000))
    return EvalController(api, runs=NoEvents(), events=events, retry=3600)


def run_names(api: FakeKube) -> list[str]:
    return sorted(key[2] for key in api.objects if key[0] == "agentruns")


async def suite_with_runs(api: FakeKube) -> tuple[EvalController, list[str]]:
    """The suite reconciled once in ``api``: its controller and its cases' runs' names."""
    api.put("agents", AGENT)
    api.put(EVALS, copy.deepcopy(SUITE))
    ctl = controller(api)
    await ctl.reconcile("ns", "suite")
    return ctl, run_names(api)


async def test_a_suite_being_deleted_creates_no_run_for_its_cases() -> None:
    api = FakeKube()
    ctl, first = await suite_with_runs(api)
    assert len(first) == 2  # the control: a live suite creates its cases' runs
    for name in first:  # the garbage collector takes them while the suite waits for them
        del api.objects[("agentruns", "ns", name)]
    suite = api.find(EVALS, "suite", "ns")
    assert suite is not None
    suite["metadata"]["deletionTimestamp"] = "2026-11-30T10:00:05Z"
    await ctl.reconcile("ns", "suite")
    assert run_names(api) == []
    assert sum(verb == "create" for verb, _ in api.calls) == 2


async def test_a_case_whose_run_is_deleted_before_it_is_graded_fails_and_is_not_run_again() -> None:
    """Its tenant's ttlSecondsAfterFinished of 0, say: the run was deleted as it ended, before
    the suite's next reconcile; the case's run was created again, ended, was deleted again…
    each time a model loop paid for, for ever."""
    api = FakeKube()
    ctl, first = await suite_with_runs(api)
    for name in first:  # each ended and was deleted at once by its TTL
        del api.objects[("agentruns", "ns", name)]
    await ctl.reconcile("ns", "suite")
    assert run_names(api) == [] and sum(verb == "create" for verb, _ in api.calls) == 2
    suite = api.find(EVALS, "suite", "ns")
    assert suite is not None
    rows = suite["status"]["cases"]
    assert [(r["phase"], r["run"]) for r in rows] == [("Failed", name) for name in first]
    assert all("was deleted before it was graded" in r["message"] for r in rows)
    assert suite["status"]["phase"] == "Failed"
