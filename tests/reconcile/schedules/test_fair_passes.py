"""Schedules due are reconciled a few at a time, one namespace's after another's in turn, each
taken as a place frees: a namespace's thousands of schedules due every second, whose runs
never end, delay another namespace's every-second schedule by a few reconciles, not by a whole
pass of theirs.

The fake store answers each API call after 5 ms (a busy API server answers a label-selected
list no faster).
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Mapping
from typing import Any

from kube_support import FakeKube

from agentrun.operator.platform.events import EventRecorder, Throttle
from agentrun.operator.schedules import controller as schedules
from agentrun.operator.schedules.spec import CRON_LABEL, SCHEDULED_ANNOTATION
from agentrun.operator.schedules.turns import Turns

LATENCY = 0.005
WINDOW = 6
"""Seconds the victim's every-second schedule is watched."""
ATTACKER_CRONS = 1500
"""Every-second schedules of one namespace, each with a run that never ends (``Forbid``): in
passes over all those due together, a pass took about 5 s here, and another namespace's
every-second schedule due a moment after a pass began waited for all of it (2 runs in 12 s)."""


class SlowStore:
    """``CronStore`` over every namespace, each call answered after ``LATENCY``."""

    def __init__(self) -> None:
        self.runs: dict[tuple[str, str], dict[str, Any]] = {}
        self.created: list[tuple[str, str, float]] = []
        """(namespace, name, when created: time.time())."""

    async def list_runs(self, namespace: str, cron: str) -> list[dict[str, Any]]:
        await asyncio.sleep(LATENCY)
        return [
            copy.deepcopy(r)
            for (ns, _), r in self.runs.items()
            if ns == namespace and r["metadata"]["labels"].get(CRON_LABEL) == cron
        ]

    async def create_run(self, manifest: Mapping[str, Any]) -> bool:
        await asyncio.sleep(LATENCY)
        meta = manifest["metadata"]
        key = (meta["namespace"], meta["name"])
        if key in self.runs:
            return False
        run = copy.deepcopy(dict(manifest))
        run["metadata"]["uid"] = f"uid-{key}"
        self.runs[key] = run
        self.created.append((*key, time.time()))
        return True

    async def cancel_run(self, namespace: str, name: str) -> None:
        await asyncio.sleep(LATENCY)

    async def delete_run(self, namespace: str, name: str) -> None:
        await asyncio.sleep(LATENCY)
        self.runs.pop((namespace, name), None)

    async def patch_status(self, cron: Mapping[str, Any], body: Mapping[str, Any]) -> bool:
        await asyncio.sleep(LATENCY)
        return True


def cron(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{namespace}-{name}",
            "generation": 1,
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {
            "schedule": "* * * * * *",
            "runTemplate": {"spec": {"agentRef": {"name": "bot"}, "goal": "report"}},
            **spec,
        },
    }


async def test_an_every_second_schedule_keeps_time_beside_another_namespaces_hundreds() -> None:
    store = SlowStore()
    events = EventRecorder(FakeKube(), throttle=Throttle(repeat_after=60, rate=2, burst=25))
    controller = schedules.ScheduleController(store, events=events)
    now = time.time()
    for i in range(ATTACKER_CRONS):
        body = cron("a-team", f"spam-{i}", concurrencyPolicy="Forbid")
        body["status"] = {"lastScheduleTime": "2026-01-01T00:00:00Z"}
        controller.observe(body)
        # its one run waits Queued for ever (the tenant's maxConcurrentRuns): never ends
        store.runs[("a-team", f"spam-{i}-1")] = {
            "metadata": {
                "name": f"spam-{i}-1",
                "namespace": "a-team",
                "uid": f"run-{i}",
                "labels": {CRON_LABEL: f"spam-{i}"},
                "annotations": {SCHEDULED_ANNOTATION: "2026-01-01T00:00:01Z"},
                "ownerReferences": [
                    {"uid": f"uid-a-team-spam-{i}", "controller": True, "kind": "CronAgentRun"}
                ],
            },
            "status": {"phase": "Queued"},
        }
    victim = cron("z-team", "report", successfulRunsHistoryLimit=100, failedRunsHistoryLimit=100)
    victim["metadata"]["creationTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    controller.observe(victim)
    task = asyncio.create_task(controller.run())
    try:
        await asyncio.sleep(WINDOW)
    finally:
        controller.stop()
        task.cancel()
    mine = [(name, at) for ns, name, at in store.created if ns == "z-team"]
    lateness = [at - int(name.rsplit("-", 1)[1]) for name, at in mine]
    # every second has a schedule time: a run for (almost) each, started within a second
    assert len(mine) >= WINDOW - 1 and max(lateness) < 1.0, (
        f"z-team's every-second schedule got {len(mine)} runs in {WINDOW} s, started "
        f"{', '.join(f'{x:.1f}' for x in lateness)} s late, behind a-team's "
        f"{ATTACKER_CRONS} schedules"
    )


def test_due_schedules_take_turns_by_namespace() -> None:
    turns = Turns()
    turns.add(sorted({("a", "1"), ("a", "2"), ("a", "3"), ("b", "1"), ("c", "1"), ("c", "2")}))
    assert [turns.take(), turns.take()] == [("a", "1"), ("b", "1")]
    turns.add([("b", "2"), ("a", "2"), ("d", "1")])  # a waiting one keeps its place
    assert len(turns) == 6 and ("b", "2") in turns and ("b", "1") not in turns
    taken = [turns.take() for _ in range(7)]
    assert taken == [
        ("c", "1"), ("a", "2"), ("b", "2"), ("d", "1"), ("c", "2"), ("a", "3"), None
    ]  # fmt: skip
