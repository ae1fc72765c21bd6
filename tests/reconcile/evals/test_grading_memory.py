"""Grading a case folds its run's committed events one at a time: the operator holds one turn
of the trajectory, not all of them. A tenant's run may commit thousands of turns, each with
tool results of up to 16 KiB from its own tool server; read whole, one graded run held its
trajectory (2,000 turns of 16 KiB: about 40 MB), and the reconciles of four namespaces at
once four of them."""

from __future__ import annotations

import tracemalloc
from typing import Any

from kube_support import FakeKube
from trajectory_support import LongRuns

from agentrun.operator.evals.controller import EvalController
from agentrun.operator.evals.store import EVALS
from agentrun.operator.platform.events import EventRecorder, Throttle

TURNS, CHARS = 2000, 16_384
"""About 32 MiB of tool-call arguments over the trajectory."""


def suite() -> dict[str, Any]:
    return {
        "metadata": {"name": "suite", "namespace": "team-a", "generation": 1},
        "spec": {
            "agentRef": {"name": "bot"},
            "cases": [{"name": "long", "goal": "g", "expect": {"toolsCalled": ["fetch"]}}],
        },
    }


async def test_a_long_trajectory_is_graded_holding_one_turn_at_a_time() -> None:
    api = FakeKube()
    api.put("agents", {"metadata": {"name": "bot", "namespace": "team-a", "generation": 1}})
    api.put(EVALS, suite())
    events = EventRecorder(api, throttle=Throttle(repeat_after=0, rate=1000, burst=1000))
    controller = EvalController(api, runs=LongRuns(TURNS, CHARS), events=events, retry=3600)
    await controller.reconcile("team-a", "suite")  # creates the case's run
    [run] = await api.list_objects("agentruns", namespace="team-a")
    run["status"] = {"phase": "Succeeded", "terminalReason": "completed", "outcome": "ok"}
    api.put("agentruns", run)
    tracemalloc.start()
    try:
        await controller.reconcile("team-a", "suite")  # grades it
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    [row] = (api.find(EVALS, "suite", "team-a") or {})["status"]["cases"]
    assert (row["phase"], row["passed"]) == ("Passed", True)
    assert peak < 4 * 2**20, f"grading held {peak / 2**20:.1f} MiB"
