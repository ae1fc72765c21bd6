"""A CronAgentRun's runs are listed as what the controller reads of them (``store.slim_run``):
a schedule keeps up to 1,000 runs not ended and 1,000 finished of each kind, each carrying its
template's goal, parameters and annotations; listed whole, one reconcile held every one of
them decoded (here 300 runs of 256 KiB: 76 MiB parsed, kept as 0.7 MiB)."""

from __future__ import annotations

from typing import Any

from kube_support import FakeKube

from agentrun.kernel import schemas
from agentrun.operator.schedules.spec import CRON_LABEL, SCHEDULED_ANNOTATION
from agentrun.operator.schedules.status import OwnedRun
from agentrun.operator.schedules.store import KubeCronStore

RUNS = 300
BULK = "x" * 65_536
"""A goal, an annotation, a parameter at their schema's bound."""


def run(i: int) -> dict[str, Any]:
    owner = {"uid": "uid-cron", "controller": True, "kind": "CronAgentRun", "name": "report"}
    ended = i % 2 == 0
    return {
        "metadata": {
            "name": f"report-{1_796_032_800 + i}",
            "namespace": "team-a",
            "uid": f"run-{i}",
            "labels": {CRON_LABEL: "report"},
            "annotations": {SCHEDULED_ANNOTATION: "2026-11-30T10:00:00Z", "note": BULK},
            "ownerReferences": [owner],
        },
        "spec": {"agentRef": {"name": "bot", "parameters": {"p": BULK}}, "goal": BULK},
        "status": {
            "phase": "Succeeded" if ended else "Running",
            "answer": BULK,
            **({"terminalReason": "completed", "completionTime": "2026-11-30T10:01:00Z"}
               if ended else {}),
        },
    }  # fmt: skip


async def test_a_schedules_runs_are_listed_as_the_controller_reads_them() -> None:
    api = FakeKube()
    whole = [api.put("agentruns", run(i)) for i in range(RUNS)]
    listed = await KubeCronStore(api).list_runs("team-a", "report")
    assert [OwnedRun.of(r) for r in listed] == [OwnedRun.of(r) for r in whole]
    assert [r["metadata"]["ownerReferences"] for r in listed] == [
        r["metadata"]["ownerReferences"] for r in whole
    ]
    kept, read = schemas.footprint(listed), schemas.footprint(whole)
    assert kept < RUNS * 4096, f"{kept / 2**20:.1f} MiB kept of {read / 2**20:.1f} MiB listed"
