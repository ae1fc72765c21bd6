"""An AgentEval whose reconcile fails for good (a case's run the API server refuses) is failed
with a typed reason, a condition and an Event, and left alone until its spec changes — not
retried every few seconds for ever; one that fails for a passing reason is retried."""

from __future__ import annotations

import asyncio
import copy
import gc
import logging
from typing import Any

import pytest
from kube_support import FakeKube
from trajectory_support import NoEvents

from agentrun.operator.evals.controller import EvalController
from agentrun.operator.evals.status import RECONCILE_FAILED
from agentrun.operator.evals.store import EVALS
from agentrun.operator.platform.events import EventRecorder, Throttle

AGENT = {
    "metadata": {"name": "geometry", "namespace": "ns", "generation": 1},
    "spec": {"model": "mock", "instructions": "Use the calculate tool.", "tools": ["calculate"]},
}
SUITE = {
    "metadata": {"name": "suite", "namespace": "ns", "generation": 1},
    "spec": {
        "agentRef": {"name": "geometry"},
        "cases": [{"name": "done", "goal": "Add 2 and 3.", "expect": {"reason": "completed"}}],
    },
}


def setup() -> tuple[FakeKube, EvalController]:
    api = FakeKube()
    api.put("agents", AGENT)
    api.put(EVALS, copy.deepcopy(SUITE))
    events = EventRecorder(api, throttle=Throttle(repeat_after=0, rate=1000, burst=1000))
    return api, EvalController(api, runs=NoEvents(), events=events, retry=3600)


def conditions(api: FakeKube) -> dict[str, dict[str, Any]]:
    suite = api.find(EVALS, "suite", "ns")
    assert suite is not None
    return {c["type"]: c for c in (suite.get("status") or {}).get("conditions", [])}


async def test_a_suite_whose_case_run_is_refused_for_good_fails_once_and_stays_failed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api, controller = setup()
    with caplog.at_level(logging.INFO, logger="agentrun.operator.evals.controller"):
        for _ in range(2):
            api.fail("create", 422, "spec.goal: Too long")
            await controller._reconcile_safely(("ns", "suite"))
    found = conditions(api)
    assert (found["Passed"]["status"], found["Passed"]["reason"]) == ("False", RECONCILE_FAILED)
    assert "HTTP 422: spec.goal: Too long" in found["Passed"]["message"]
    suite = api.find(EVALS, "suite", "ns")
    assert suite is not None and suite["status"]["phase"] == "Failed"
    await controller.events.drain()
    assert [e["reason"] for e in api.events] == [RECONCILE_FAILED]
    creates = sum(verb == "create" for verb, _ in api.calls)
    await controller._reconcile_safely(("ns", "suite"))  # a run ended, say: nothing new
    assert sum(verb == "create" for verb, _ in api.calls) == creates == 2
    assert len([r for r in caplog.records if "Too long" in r.getMessage()]) == 1
    suite["metadata"]["generation"] = 2  # the spec was edited: a new try
    await controller._reconcile_safely(("ns", "suite"))
    assert sum(verb == "create" for verb, _ in api.calls) == 3
    assert conditions(api)["Complete"]["reason"] != RECONCILE_FAILED


async def test_a_suite_failing_for_a_passing_reason_is_retried_not_failed() -> None:
    api, controller = setup()
    for _ in range(3):
        api.fail("create", 503, "Unavailable")
        await controller._reconcile_safely(("ns", "suite"))
    assert (
        "Passed" not in conditions(api) or conditions(api)["Passed"]["reason"] != RECONCILE_FAILED
    )
    assert not [key for key in api.objects if key[0] == "agentruns"]
    await controller._reconcile_safely(("ns", "suite"))  # the API server is back
    assert len([key for key in api.objects if key[0] == "agentruns"]) == 1


async def test_an_error_that_escapes_a_reconcile_is_logged_naming_the_suite(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reconcile's task is awaited by nobody while the controller runs: an error that gets
    past ``_reconcile_safely`` (a bug in its own bookkeeping) is logged naming the suite, not
    left to asyncio's "Task exception was never retrieved" (or to nothing)."""
    _, controller = setup()
    loop = asyncio.get_running_loop()
    unretrieved: list[object] = []
    handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: unretrieved.append(context))
    escaped = asyncio.Event()

    async def broken(key: tuple[str, str]) -> None:
        escaped.set()
        raise RuntimeError("bookkeeping bug")

    monkeypatch.setattr(controller, "_reconcile_safely", broken)
    serving = asyncio.create_task(controller.run())
    try:
        with caplog.at_level(logging.INFO, logger="agentrun"):
            controller.kick("ns", "suite")
            await escaped.wait()
            for _ in range(5):
                await asyncio.sleep(0)
            gc.collect()
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        loop.set_exception_handler(handler)
    assert any(
        "AgentEval ns/suite" in r.getMessage() and "bookkeeping bug" in r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR
    )
    assert unretrieved == []
