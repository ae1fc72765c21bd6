"""AgentEvals cost the operator bounded memory whatever their answer schemas: a schema of too
many objects fails the suite naming the case and field, and the suites' checked specs kept
are bounded by weight, not held for every suite's lifetime."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from typing import Any

import pytest
from kube_support import FakeKube
from trajectory_support import NoEvents

from agentrun.kernel import schemas
from agentrun.operator.evals import checked
from agentrun.operator.evals.controller import EvalController
from agentrun.operator.evals.spec import EvalSpec
from agentrun.operator.evals.store import EVALS
from agentrun.operator.platform.events import EventRecorder, Throttle
from agentrun.operator.platform.spec import SpecError

LIMIT = schemas.MAX_SCHEMA_CONTAINERS


def suite(i: int, *, cases: int, items: int) -> dict[str, Any]:
    """Suite ``s{i}`` whose cases' answer schemas each hold ``items`` empty objects."""
    answer = {"jsonSchema": {"const": [{} for _ in range(items)]}}
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentEval",
        "metadata": {"name": f"s{i}", "namespace": "team-a", "generation": 1, "uid": f"u{i}"},
        "spec": {
            "agentRef": {"name": "bot"},
            "cases": [
                {"name": f"c{c}", "goal": "g", "expect": {"answer": answer}} for c in range(cases)
            ],
            "parallelism": 1,
        },
    }


def test_an_answer_schema_of_too_many_objects_is_refused_naming_the_case_and_field() -> None:
    with pytest.raises(SpecError) as refused:
        EvalSpec.of(suite(0, cases=2, items=21_000)["spec"])
    assert str(refused.value) == (
        "spec.cases[0].expect.answer.jsonSchema: not a valid JSON Schema: 21002 JSON objects "
        f"and arrays, over the limit of {LIMIT}"
    )
    EvalSpec.of(suite(0, cases=2, items=LIMIT - 2)["spec"])


async def test_suites_checked_specs_kept_are_bounded_by_weight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each suite weighs about 1.4 MB parsed (two cases at the bound): the controller keeps
    what its weight allows, the least recently used forgotten, however many suites exist."""
    monkeypatch.setattr(checked, "SPECS_MEMORY", 2_000_000)
    api = FakeKube()
    api.put("agents", {"metadata": {"name": "bot", "namespace": "team-a"}, "spec": {}})
    events = EventRecorder(api, throttle=Throttle(repeat_after=0, rate=1000, burst=1000))
    controller = EvalController(api, runs=NoEvents(), events=events, retry=3600)
    gc.collect()
    tracemalloc.start()
    for i in range(4):
        api.put(EVALS, suite(i, cases=2, items=LIMIT - 2))
        await controller.reconcile("team-a", f"s{i}")
        del api.objects[(EVALS, "team-a", f"s{i}")]  # the stored copies out of the count
    for key in [k for k in api.objects if k[0] == "agentruns"]:
        del api.objects[key]
    api.calls.clear()
    await asyncio.sleep(0.1)
    gc.collect()
    retained = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert retained < 2 * checked.SPECS_MEMORY, f"{retained / 1e6:.1f} MB kept"
    assert 0 < len(controller.specs.kept) < 4
