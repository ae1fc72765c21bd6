"""CronAgentRuns cost the operator bounded memory whatever their templates: the objects the
controller keeps as last seen are bounded by weight (``BODIES_MEMORY``), and one forgotten is
read again when it is next due — its run is still created on time."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Mapping
from typing import Any

from kube_support import FakeKube

from agentrun.operator.platform.events import EventRecorder, Throttle
from agentrun.operator.schedules import controller as schedules
from agentrun.operator.schedules.memory import CronMemory

T0 = 1_796_032_800.0
"""2026-11-30T10:00:00Z, a schedule time of every schedule below."""
CRONS = 60
NOTE = 200_000
"""Characters of the annotation each template carries (the CRD allows 64 of 65,536 each; the
API server takes objects of about 1.5 MB)."""
MEMORY = 2 * 2**20


def cron(i: int) -> dict[str, Any]:
    """Schedule ``c{i}``, every ten seconds, its template carrying a large annotation."""
    return {
        "metadata": {
            "name": f"c{i}",
            "namespace": "team-a",
            "uid": f"uid-{i}",
            "generation": 1,
            "creationTimestamp": "2026-11-30T09:59:55Z",
        },
        "spec": {
            "schedule": "*/10 * * * * *",
            "runTemplate": {
                "metadata": {"annotations": {"note": f"{i:06d}" + "x" * NOTE}},
                "spec": {"agentRef": {"name": "calc"}, "goal": "report"},
            },
        },
    }


class BuildingStore:
    """``CronStore`` that builds each CronAgentRun when it is read (the API server holds
    them, not this process) and counts the runs created."""

    def __init__(self) -> None:
        self.created: list[str] = []
        self.reads = 0
        self.deleted: set[str] = set()

    async def get_cron(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads += 1
        return None if name in self.deleted else cron(int(name[1:]))

    async def list_runs(self, namespace: str, cron: str) -> list[dict[str, Any]]:
        return []

    async def create_run(self, manifest: Mapping[str, Any]) -> bool:
        self.created.append(manifest["metadata"]["name"])
        return True

    async def cancel_run(self, namespace: str, name: str) -> None:
        raise AssertionError("nothing runs")

    async def delete_run(self, namespace: str, name: str) -> None:
        raise AssertionError("nothing ended")

    async def release_run(self, namespace: str, name: str, uid: str) -> None:
        pass

    async def patch_status(self, cron: Mapping[str, Any], body: Mapping[str, Any]) -> bool:
        return True


async def test_many_schedules_with_large_templates_keep_bounded_memory_and_run_on_time() -> None:
    store = BuildingStore()
    events = EventRecorder(FakeKube(), throttle=Throttle(repeat_after=0, rate=1000, burst=1000))
    clock = [T0 + 0.2]
    controller = schedules.ScheduleController(
        store, events=events, clock=lambda: clock[0], memory=MEMORY
    )
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(CRONS):  # as the watch lists them: each handed over, then dropped
            controller.observe(cron(i))
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    listed = CRONS * NOTE
    assert kept < MEMORY + listed // 10, f"kept {kept} bytes of {listed} listed"
    last = ("team-a", f"c{CRONS - 1}")
    await controller._reconcile_safely(last)  # the last seen is kept: no read
    assert (store.reads, store.created) == (0, [f"c{CRONS - 1}-1796032800"])
    for key in sorted(controller.crons.keys() - {last}):
        await controller._reconcile_safely(key)
    assert sorted(store.created) == sorted(f"c{i}-1796032800" for i in range(CRONS))
    assert store.reads > 0  # the ones forgotten were read again


async def test_a_forgotten_schedule_found_deleted_when_read_again_is_forgotten() -> None:
    store = BuildingStore()
    events = EventRecorder(FakeKube(), throttle=Throttle(repeat_after=0, rate=1000, burst=1000))
    controller = schedules.ScheduleController(
        store, events=events, clock=lambda: T0 + 0.2, memory=MEMORY
    )
    for i in range(CRONS):
        controller.observe(cron(i))
    store.deleted.add("c0")  # the first seen is forgotten by now; its deletion was not told
    await controller._reconcile_safely(("team-a", "c0"))
    assert store.reads == 1 and store.created == []
    assert controller.crons.entry(("team-a", "c0")) is None


def test_wake_ups_set_again_and_again_leave_a_bounded_heap() -> None:
    """Each edit of a yearly schedule reconciles it and sets its wake-up again; the ones left
    behind in the heap, not due for a year, are dropped once they pass twice the schedules
    (an edit loop grew it by one each, without end)."""
    crons = CronMemory()
    crons.observe(cron(0))
    key = ("team-a", "c0")
    year = 365 * 86_400.0
    for i in range(10_000):
        crons.wake(key, T0 + year - i)
    assert len(crons._wakes) <= 2 * 1 + 64 + 1
    assert crons.next_wake() == T0 + year - 9_999
    assert crons.take_due(T0 + year, busy={key}) == set()  # busy: its reconcile sets it again
    crons.wake(key, T0 + year + 1)
    assert crons.take_due(T0 + year + 1) == {key}
    assert crons.take_due(T0 + year + 1) == set() and crons.next_wake() is None
