"""A suite's runs are listed as what the controller reads of them (``store.slim_run``), and
held so while the reconcile grades them (reading each one's events): listed whole, it held
each case's run decoded, its resolved Agent spec, goal and parameters with it, for as long as
grading took (here 200 runs of 256 KiB: 51 MiB parsed; kept, under 1 MiB)."""

from __future__ import annotations

from typing import Any

from kube_support import FakeKube

from agentrun.kernel import schemas
from agentrun.operator.evals.status import (
    CASE_LABEL,
    EVAL_LABEL,
    ROUND_LABEL,
    EvalRef,
    run_result,
)
from agentrun.operator.evals.store import EvalStore

SUITE = EvalRef("team-a", "suite", "uid-suite", 2)
CASES = 200
BULK = "y" * 65_536


def case_run(case: int, *, round_: str) -> dict[str, Any]:
    labels = {EVAL_LABEL: "suite", CASE_LABEL: f"c{case}", ROUND_LABEL: round_}
    return {
        "metadata": {
            "name": f"suite-c{case}-{round_}",
            "namespace": "team-a",
            "labels": labels,
            "ownerReferences": [{"uid": SUITE.uid, "controller": True, "kind": "AgentEval"}],
        },
        "spec": {"agentRef": {"name": "bot", "parameters": {"q": BULK}}, "goal": BULK},
        "status": {
            "terminalReason": "completed",
            "outcome": "ok",
            "usage": {"steps": 2, "totalTokens": 40, "costUSD": "0.0001"},
            "answer": f"answer {case}",
            "resolvedSpec": {"instructions": BULK, "goal": BULK},
        },
    }


async def test_a_suites_runs_are_listed_as_the_controller_reads_them() -> None:
    api = FakeKube()
    whole = {f"c{i}": api.put("agentruns", case_run(i, round_="r2")) for i in range(CASES)}
    api.put("agentruns", case_run(0, round_="r1"))  # of an earlier round: deleted
    current = await EvalStore(api).runs_of_round(SUITE, "r2")
    assert sorted(current) == sorted(whole)
    for case, run in current.items():
        assert run["metadata"]["name"] == whole[case]["metadata"]["name"]
        expected = run_result(whole[case]["status"], tools=frozenset())
        assert run_result(run["status"], tools=frozenset()) == expected
    assert api.find("agentruns", "suite-c0-r1", "team-a") is None
    kept, read = schemas.footprint(current), schemas.footprint(list(whole.values()))
    assert kept < CASES * 4096, f"{kept / 2**20:.1f} MiB kept of {read / 2**20:.1f} MiB listed"
