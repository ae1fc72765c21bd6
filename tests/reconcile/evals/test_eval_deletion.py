"""Deletions around an AgentEval never make it pay for a run twice: one being deleted (a
foreground deletion, another controller's finalizer holding it) creates no run, and a case
whose run was deleted before it was graded (by a person: no TTL deletes a run held for grading)
fails saying so instead of running again."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest
from kube_support import FakeKube
from trajectory_support import NoEvents

from agentrun.operator.evals.controller import EvalController
from agentrun.operator.evals.store import EVALS
from agentrun.operator.platform.events import EventRecorder, Throttle
from agentrun.operator.platform.kubeapi import ApiError
from agentrun.operator.runs import HOLD_ANNOTATION, lifecycle

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


FINISHED = {
    "terminalReason": "completed",
    "outcome": "ok",
    "completionTime": "2026-11-30T10:00:05Z",
    "usage": {"steps": 1, "totalTokens": 10, "costUSD": "0.0001"},
}
"""A finished run's status (what grading reads of it)."""


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
    """A person deleted it (or a TTL of an operator before runs were held for grading) before
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


async def test_a_cases_run_is_held_from_every_ttl_until_its_grade_is_stored() -> None:
    """Its tenant's ttlSecondsAfterFinished of 0 (or the suite's): the run would be deleted as
    it ended, before grading read it, and every case failed. The suite creates each run held
    (``HOLD_ANNOTATION``, which the TTL honours) and releases it once its row is stored."""
    api = FakeKube()
    ctl, (ended, running) = await suite_with_runs(api)
    for name in (ended, running):
        run = api.find("agentruns", name, "ns")
        assert run is not None and run["metadata"]["annotations"] == {HOLD_ANNOTATION: "grading"}
        assert lifecycle.held(run["metadata"])  # by its controller, the suite: honoured
    done = api.find("agentruns", ended, "ns")
    assert done is not None
    done["status"] = dict(FINISHED)
    await ctl.reconcile("ns", "suite")
    suite = api.find(EVALS, "suite", "ns")
    assert suite is not None
    assert [r["phase"] for r in suite["status"]["cases"]] == ["Passed", "Running"]
    assert "annotations" not in done["metadata"] or not done["metadata"]["annotations"]
    still = api.find("agentruns", running, "ns")
    assert still is not None and HOLD_ANNOTATION in still["metadata"]["annotations"]
    released = lifecycle.due_time({}, done["status"], default_ttl=0, held=False)
    assert released == lifecycle.finished_at(FINISHED)  # its TTL of 0 applies now: at once


class QuotaKube(FakeKube):
    """A namespace whose ResourceQuota allows two AgentRuns: creating a third is refused."""

    async def create(self, plural: str, manifest: Mapping[str, Any]) -> bool:
        if plural == "agentruns" and len(run_names(self)) >= 2:
            raise ApiError(403, "Forbidden", '{"message": "exceeded quota: runs"}')
        return await super().create(plural, manifest)


async def test_a_refused_create_still_stores_the_grades_and_releases_their_runs() -> None:
    """A quota of two AgentRuns, a third case waiting: the graded run's hold was released
    after the pass created the next case's run, which the quota (full of held runs) refused;
    the pass raised first, every pass after too, and the suite gave up (its runs deleted)
    where a TTL would have freed the quota."""
    api = QuotaKube()
    three = {"name": "three", "goal": "Add 6 and 7.", "expect": {"reason": "completed"}}
    suite = copy.deepcopy(SUITE)
    suite["spec"]["cases"].append(three)
    api.put("agents", AGENT)
    api.put(EVALS, suite)
    ctl = controller(api)
    await ctl.reconcile("ns", "suite")
    ended, _ = run_names(api)
    done = api.find("agentruns", ended, "ns")
    assert done is not None
    done["status"] = dict(FINISHED)
    with pytest.raises(ApiError):
        await ctl.reconcile("ns", "suite")
    stored = api.find(EVALS, "suite", "ns")
    assert stored is not None
    assert [r["phase"] for r in stored["status"]["cases"]] == ["Passed", "Running", "Pending"]
    assert not (done["metadata"].get("annotations") or {})  # released: its TTL frees the quota
