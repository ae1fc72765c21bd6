"""AgentEvals are reconciled a few at a time: a suite whose first check takes seconds (many
cases, each with an answer schema costing most of the schemas' work budget to check) holds
one place, and another namespace's one-case suite gets its run at once beside it."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import threading
import time
from typing import Any

import pytest
from checks_support import counting_checks, ended_before_another
from kube_support import FakeKube
from trajectory_support import NoEvents

from agentrun.operator.evals.controller import RECONCILES_AT_ONCE, EvalController
from agentrun.operator.evals.store import EVALS
from agentrun.operator.platform.events import EventRecorder, Throttle
from agentrun.operator.platform.fairwork import FairWork

CASES = 8
"""Cases of the slow suite (200 allowed)."""
HEAVY = {"allOf": [{}] * 1200}
"""Valid, checked in about 0.35 s on one core: just under the meta-schema work budget (each
case's made distinct, so none is a verdict remembered from another)."""


def agent(namespace: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "bot", "namespace": namespace, "generation": 1},
        "spec": {"model": "mock", "instructions": "hi", "tools": []},
    }


def suite(namespace: str, cases: list[dict[str, Any]], *, name: str = "suite") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "generation": 1},
        "spec": {"agentRef": {"name": "bot"}, "cases": cases},
    }


async def test_a_suite_slow_to_check_does_not_hold_up_another() -> None:
    api = FakeKube()
    for ns in ("team-slow", "team-other"):
        api.put("agents", agent(ns))
    heavy_cases = [
        {
            "name": f"c{i}",
            "goal": "g",
            "expect": {"answer": {"jsonSchema": {**copy.deepcopy(HEAVY), "title": f"c{i}"}}},
        }
        for i in range(CASES)
    ]
    api.put(EVALS, suite("team-slow", heavy_cases))
    api.put(EVALS, suite("team-other", [{"name": "one", "goal": "Add 2 and 3."}]))
    events = EventRecorder(api, throttle=Throttle(repeat_after=0, rate=1000, burst=1000))
    controller = EvalController(api, runs=NoEvents(), events=events, retry=3600)
    loop_task = asyncio.create_task(controller.run())
    try:
        started = time.monotonic()
        controller.kick("team-slow", "suite")  # applied a moment earlier
        controller.kick("team-other", "suite")
        while api.find("agentruns", "x", "y") is None:
            created = [k for k in api.objects if k[0] == "agentruns" and k[1] == "team-other"]
            if created:
                break
            await asyncio.sleep(0.05)
        waited = time.monotonic() - started
    finally:
        loop_task.cancel()
    # the other one-case suite needs no work to speak of: its run exists at once
    assert waited < 1.5, f"a one-case AgentEval waited {waited:.1f} s behind a {CASES}-case one"


def heavy_cases(tag: str) -> list[dict[str, Any]]:
    """``CASES`` cases, each with an answer schema that takes most of the work budget to
    check, distinct from every other suite's (``tag``)."""
    return [
        {
            "name": f"c{i}",
            "goal": "g",
            "expect": {"answer": {"jsonSchema": {**copy.deepcopy(HEAVY), "title": f"{tag}{i}"}}},
        }
        for i in range(CASES)
    ]


async def test_one_namespaces_slow_suites_do_not_hold_every_place() -> None:
    """A namespace applying as many slow suites as there are places (and more) held every one
    of them for as long as their checks took: another namespace's one-case suite waited behind
    all of them. A namespace holds at most some of the places; the others serve the rest."""
    api = FakeKube()
    for ns in ("team-slow", "team-other"):
        api.put("agents", agent(ns))
    slow = [f"slow{i}" for i in range(RECONCILES_AT_ONCE + 2)]
    for name in slow:
        api.put(EVALS, suite("team-slow", heavy_cases(name), name=name))
    api.put(EVALS, suite("team-other", [{"name": "one", "goal": "Add 2 and 3."}]))
    events = EventRecorder(api, throttle=Throttle(repeat_after=0, rate=1000, burst=1000))
    controller = EvalController(api, runs=NoEvents(), events=events, retry=3600)
    loop_task = asyncio.create_task(controller.run())
    try:
        started = time.monotonic()
        for name in slow:  # applied a moment earlier
            controller.kick("team-slow", name)
        controller.kick("team-other", "suite")
        while not [k for k in api.objects if k[0] == "agentruns" and k[1] == "team-other"]:
            await asyncio.sleep(0.05)
        waited = time.monotonic() - started
    finally:
        loop_task.cancel()
    assert waited < 1.5, f"a one-case AgentEval waited {waited:.1f} s behind {len(slow)} slow ones"


async def test_a_suites_check_takes_the_threads_one_schema_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check threads (``FairWork``) are shared by every tenant's schema checks (admission
    too) and a check running cannot be taken back: a suite checked as one piece held a thread
    for all its cases' schemas (a minute at 200), and another tenant's run waited that long to
    be admitted. Each answer schema is its own turn; another party's check waits one at most."""
    first = threading.Event()
    started, done = counting_checks(monkeypatch, hold_first=first)
    api = FakeKube()
    api.put("agents", agent("team-slow"))
    api.put(EVALS, suite("team-slow", heavy_cases("turns")))
    events = EventRecorder(api, throttle=Throttle(repeat_after=0, rate=1000, burst=1000))
    checks = FairWork(threads=1)
    controller = EvalController(api, runs=NoEvents(), events=events, checks=checks, retry=3600)
    loop_task = asyncio.create_task(controller.run())
    try:
        controller.kick("team-slow", "suite")
        behind = await ended_before_another(checks, "team-other", first, started, done)
    finally:
        loop_task.cancel()
        checks.close()
    assert behind == 1, (
        f"another party's check ran after {behind} schema checks (the suite has {CASES})"
    )


async def test_a_cancelled_controller_leaves_no_reconcile_running() -> None:
    """The controller stops (a shard given up, the operator stopping): the reconciles it had
    started are cancelled and ended with it, not left on the event loop checking schemas and
    writing runs for an owner that stopped."""
    api = FakeKube()
    api.put("agents", agent("team-slow"))
    for name in ("one", "two"):
        api.put(EVALS, suite("team-slow", heavy_cases(name), name=name))
    events = EventRecorder(api, throttle=Throttle(repeat_after=0, rate=1000, burst=1000))
    controller = EvalController(api, runs=NoEvents(), events=events, retry=3600)
    loop_task = asyncio.create_task(controller.run())
    controller.kick("team-slow", "one")

    def reconciling() -> list[asyncio.Task[object]]:
        return [t for t in asyncio.all_tasks() if t.get_name().startswith("eval team-slow/")]

    while not reconciling():
        await asyncio.sleep(0.01)
    loop_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await loop_task
    assert reconciling() == []
