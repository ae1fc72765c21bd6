"""The CronAgentRun controller's passes against an in-memory store and a fake clock: what it
creates, cancels and deletes, what it writes to the status, and that a pass repeated on a stale
object (its status write lost in a crash) creates nothing twice."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest
from kube_support import FakeKube

from agentrun.operator import runs
from agentrun.operator.platform import conditions as status
from agentrun.operator.platform.events import EventRecorder, Throttle
from agentrun.operator.platform.kubeapi import ApiError
from agentrun.operator.runs import lifecycle
from agentrun.operator.schedules import controller as schedules

T0 = 1_796_032_800.0
"""2026-11-30T10:00:00Z, a schedule time of every schedule below."""


class MemoryStore:
    """``CronStore`` in memory: runs by name, status patches merged into ``status``."""

    def __init__(self) -> None:
        self.runs: dict[str, dict[str, Any]] = {}
        self.status: dict[str, Any] = {}
        self.cancelled: list[str] = []
        self.deleted: list[str] = []
        self.released: list[str] = []
        self.creates = 0
        self.gone = False
        """The CronAgentRun was deleted (its status patches meet 404)."""

    async def list_runs(self, namespace: str, cron: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(r) for r in self.runs.values()]

    async def create_run(self, manifest: Mapping[str, Any]) -> bool:
        self.creates += 1
        name = manifest["metadata"]["name"]
        if name in self.runs:
            return False
        run = copy.deepcopy(dict(manifest))
        run["metadata"]["uid"] = f"uid-{name}"
        self.runs[name] = run
        return True

    async def cancel_run(self, namespace: str, name: str) -> None:
        self.cancelled.append(name)

    async def delete_run(self, namespace: str, name: str) -> None:
        self.deleted.append(name)
        self.runs.pop(name, None)

    async def release_run(self, namespace: str, name: str, uid: str) -> None:
        found = self.runs.get(name)
        if found is not None and found["metadata"]["uid"] == uid:
            self.released.append(name)
            found["metadata"]["annotations"].pop(runs.HOLD_ANNOTATION, None)

    async def patch_status(self, cron: Mapping[str, Any], body: Mapping[str, Any]) -> bool:
        if self.gone:
            return False
        for key, value in body.items():
            if value is None:
                self.status.pop(key, None)
            else:
                self.status[key] = value
        return True

    def end(self, name: str, phase: str, *, at: float) -> None:
        reason = "completed" if phase == "Succeeded" else "max_steps"
        completed = status.rfc3339(at)
        self.runs[name]["status"] = {
            "phase": phase,
            "terminalReason": reason,
            "completionTime": completed,
        }


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def cron(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "schedule": "*/10 * * * * *",
        "runTemplate": {"spec": {"agentRef": {"name": "calc"}, "goal": "report"}},
    }
    body.update(spec)
    return {
        "metadata": {
            "name": "report",
            "namespace": "team-a",
            "uid": "cron-uid",
            "generation": 1,
            "creationTimestamp": "2026-11-30T09:59:55Z",
        },
        "spec": body,
    }


def controller(store: MemoryStore, clock: Clock) -> schedules.ScheduleController:
    events = EventRecorder(FakeKube(), throttle=Throttle(repeat_after=0, rate=1000, burst=1000))
    return schedules.ScheduleController(store, events=events, clock=clock)


def with_status(obj: dict[str, Any], store: MemoryStore) -> dict[str, Any]:
    return {**obj, "status": copy.deepcopy(store.status)}


async def test_a_due_time_creates_its_run_once_even_when_the_status_write_was_lost() -> None:
    store, clock = MemoryStore(), Clock(T0 + 0.4)
    wake = await controller(store, clock).reconcile(cron())
    assert list(store.runs) == ["report-1796032800"] and wake == T0 + 10
    assert store.status["lastScheduleTime"] == "2026-11-30T10:00:00Z"
    assert store.status["active"] == [
        {
            "apiVersion": "agentrun.dev/v1alpha1",
            "kind": "AgentRun",
            "name": "report-1796032800",
            "namespace": "team-a",
        }
    ]
    # a new leader with the object as it was before the status write: the run it finds counts
    clock.now = T0 + 3
    await controller(store, clock).reconcile(cron())  # no status: the listed run is the last
    assert store.creates == 1 and list(store.runs) == ["report-1796032800"]
    assert store.status["activeRuns"] == 1


async def test_replace_cancels_the_running_run_and_history_limits_delete_the_oldest() -> None:
    store, clock = MemoryStore(), Clock(T0 + 0.2)
    spec = {"concurrencyPolicy": "Replace", "successfulRunsHistoryLimit": 1}
    ctl = controller(store, clock)
    await ctl.reconcile(cron(**spec))
    clock.now = T0 + 10.2
    await ctl.reconcile(with_status(cron(**spec), store))
    assert store.cancelled == ["report-1796032800"]
    assert sorted(store.runs) == ["report-1796032800", "report-1796032810"]
    store.end("report-1796032800", "Cancelled", at=T0 + 10.5)
    store.end("report-1796032810", "Succeeded", at=T0 + 12)
    clock.now = T0 + 20.2
    await ctl.reconcile(with_status(cron(**spec), store))
    store.end("report-1796032820", "Succeeded", at=T0 + 22)
    clock.now = T0 + 23
    await ctl.reconcile(with_status(cron(**spec), store))
    # one success kept (the newest), one failure kept (failedRunsHistoryLimit 1)
    assert sorted(store.runs) == ["report-1796032800", "report-1796032820"]
    assert store.deleted == ["report-1796032810"]
    assert store.status["lastSuccessfulTime"] == "2026-11-30T10:00:22Z"
    assert "active" not in store.status and store.status["activeRuns"] == 0


async def test_a_run_is_held_from_its_ttl_until_its_end_is_in_the_status() -> None:
    """Its tenant's ttlSecondsAfterFinished of 0: the run was deleted as it ended, before a
    pass listed it, and lastSuccessfulTime was never set. Each run is created held
    (``runs.HOLD_ANNOTATION``, which the TTL honours) and released once the status counts it."""
    store, clock = MemoryStore(), Clock(T0 + 0.2)
    ctl = controller(store, clock)
    await ctl.reconcile(cron(concurrencyPolicy="Forbid"))
    held = store.runs["report-1796032800"]["metadata"]["annotations"]
    assert held[runs.HOLD_ANNOTATION] == runs.HOLD_SCHEDULE
    assert lifecycle.held(store.runs["report-1796032800"]["metadata"])  # by its controller
    clock.now = T0 + 5
    await ctl.reconcile(with_status(cron(concurrencyPolicy="Forbid"), store))
    assert store.released == []  # still running: kept held
    store.end("report-1796032800", "Succeeded", at=T0 + 6)
    clock.now = T0 + 6.1
    await ctl.reconcile(with_status(cron(concurrencyPolicy="Forbid"), store))
    assert store.status["lastSuccessfulTime"] == "2026-11-30T10:00:06Z"
    assert store.released == ["report-1796032800"]
    assert runs.HOLD_ANNOTATION not in store.runs["report-1796032800"]["metadata"]["annotations"]


class RefusedStatus(MemoryStore):
    """A store whose status patches the API server refuses with HTTP ``status`` while
    ``refusing`` (a CRD of another version whose status schema rejects the body, say)."""

    def __init__(self, status: int) -> None:
        super().__init__()
        self.refusal = status
        self.refusing = False

    async def patch_status(self, cron: Mapping[str, Any], body: Mapping[str, Any]) -> bool:
        if self.refusing:
            raise ApiError(self.refusal, "refused")
        return await super().patch_status(cron, body)


async def test_an_ended_run_is_released_uncounted_when_the_status_is_refused_for_good() -> None:
    """Held until its end is in the status: a status the API server refuses for good (422)
    would hold it, and whatever quota it fills, for ever; it is released to its TTL, while a
    refusal that passes (503) keeps it held for the next pass."""
    for refusal, released in ((503, []), (422, ["report-1796032800"])):
        store, clock = RefusedStatus(refusal), Clock(T0 + 0.2)
        ctl = controller(store, clock)
        await ctl.reconcile(cron(concurrencyPolicy="Forbid"))
        store.end("report-1796032800", "Succeeded", at=T0 + 6)
        store.refusing, clock.now = True, T0 + 6.1
        with pytest.raises(ApiError):  # the pass's own status write is refused too
            await ctl.reconcile(with_status(cron(concurrencyPolicy="Forbid"), store))
        assert store.released == released, refusal
        assert "lastSuccessfulTime" not in store.status


async def test_a_run_beyond_a_history_limit_of_0_is_counted_before_it_is_deleted() -> None:
    """``successfulRunsHistoryLimit: 0``: the pass that first saw the run ended deleted it
    before the status was written from the runs left, so ``lastSuccessfulTime`` was never set
    (as the TTL of 0 before the hold); a CronJob sets it whatever its history limit."""
    store, clock = MemoryStore(), Clock(T0 + 0.2)
    ctl = controller(store, clock)
    spec = {"concurrencyPolicy": "Forbid", "successfulRunsHistoryLimit": 0}
    await ctl.reconcile(cron(**spec))
    store.end("report-1796032800", "Succeeded", at=T0 + 6)
    clock.now = T0 + 6.1
    await ctl.reconcile(with_status(cron(**spec), store))
    assert store.deleted == ["report-1796032800"]
    assert store.status["lastSuccessfulTime"] == "2026-11-30T10:00:06Z"


async def test_forbid_starts_the_skipped_time_once_the_run_ends_before_the_next() -> None:
    store, clock = MemoryStore(), Clock(T0 + 0.2)
    ctl = controller(store, clock)
    await ctl.reconcile(cron(concurrencyPolicy="Forbid"))
    clock.now = T0 + 10.3
    await ctl.reconcile(with_status(cron(concurrencyPolicy="Forbid"), store))
    assert list(store.runs) == ["report-1796032800"]
    store.end("report-1796032800", "Succeeded", at=T0 + 14)
    clock.now = T0 + 14.1
    await ctl.reconcile(with_status(cron(concurrencyPolicy="Forbid"), store))
    assert sorted(store.runs) == ["report-1796032800", "report-1796032810"]


async def test_an_invalid_template_is_not_ready_and_creates_nothing() -> None:
    store, clock = MemoryStore(), Clock(T0 + 0.2)
    broken = cron(runTemplate={"spec": {"agentRef": {"name": "calc"}}})
    assert await controller(store, clock).reconcile(broken) is None
    (ready,) = store.status["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", "InvalidRunTemplate")
    assert ready["message"].startswith("spec.runTemplate.spec.goal: ")
    assert store.runs == {}


async def test_a_run_ending_while_its_schedule_is_invalid_is_counted_and_released() -> None:
    """A schedule edited to an unknown time zone (the CRD takes any well-formed one) while
    its run went on: the run ended, and the invalid pass neither counted it nor released it,
    so it outlived its TTL for as long as the schedule stayed invalid — for ever, left so."""
    store, clock = MemoryStore(), Clock(T0 + 0.2)
    ctl = controller(store, clock)
    await ctl.reconcile(cron(concurrencyPolicy="Forbid"))
    store.end("report-1796032800", "Succeeded", at=T0 + 6)
    clock.now = T0 + 6.1
    broken = with_status(cron(concurrencyPolicy="Forbid", timeZone="Europe/Berlinn"), store)
    assert await ctl.reconcile(broken) is None
    assert store.status["conditions"][0]["reason"] == "InvalidTimeZone"
    assert store.status["lastSuccessfulTime"] == "2026-11-30T10:00:06Z"
    assert store.released == ["report-1796032800"]
    assert store.creates == 1  # and nothing created


async def test_a_schedule_that_never_matches_is_not_ready_naming_the_field() -> None:
    """It parsed, and the controller's pass raised StopIteration (a RuntimeError out of the
    coroutine) twice: ReconcileFailed, naming no field."""
    store, clock = MemoryStore(), Clock(T0 + 0.2)
    assert await controller(store, clock).reconcile(cron(schedule="0 0 */20 * 7L")) is None
    (ready,) = store.status["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSchedule")
    assert ready["message"].startswith("spec.schedule: '0 0 */20 * 7L' matches no time")


async def test_a_pruned_run_is_not_created_again_from_an_object_older_than_the_status() -> None:
    store, clock = MemoryStore(), Clock(T0 + 0.2)
    ctl = controller(store, clock)
    spec = {"successfulRunsHistoryLimit": 0}
    await ctl.reconcile(cron(**spec))
    store.end("report-1796032800", "Succeeded", at=T0 + 1)
    clock.now = T0 + 2
    await ctl.reconcile(cron(**spec))  # the watch has not brought the status written yet
    assert store.deleted == ["report-1796032800"] and store.runs == {}
    clock.now = T0 + 3
    await ctl.reconcile(cron(**spec))
    assert store.creates == 1 and store.status["lastScheduleTime"] == "2026-11-30T10:00:00Z"


def being_deleted(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as a foreground deletion (or another controller's finalizer) leaves it."""
    obj["metadata"]["deletionTimestamp"] = "2026-11-30T10:00:05Z"
    return obj


async def test_a_cron_being_deleted_creates_cancels_and_deletes_nothing() -> None:
    """Its deletion waits for its runs (blockOwnerDeletion): a run created meanwhile would
    start a model loop nobody wants and hold the deletion up again, time after time."""
    store, clock = MemoryStore(), Clock(T0 + 0.2)
    spec = {"concurrencyPolicy": "Replace", "successfulRunsHistoryLimit": 0}
    ctl = controller(store, clock)
    await ctl.reconcile(cron(**spec))
    store.end("report-1796032800", "Succeeded", at=T0 + 1)
    store.runs["report-1796032799"] = copy.deepcopy(store.runs["report-1796032800"])
    del store.runs["report-1796032799"]["status"]  # one still running
    before = copy.deepcopy(store.runs)
    for offset in (10.2, 20.2, 600.2):
        clock.now = T0 + offset
        gone = being_deleted(with_status(cron(**spec), store))
        assert await ctl.reconcile(gone) is None  # no wake-up for a schedule being deleted
    assert store.runs == before and store.creates == 1
    assert store.cancelled == [] and store.deleted == []


async def test_a_cron_whose_deletion_the_watch_missed_stops_firing_once_found_gone() -> None:
    """A watch restarted across a deletion lists what exists and tells no deletion: the
    schedule last seen fired on for ever, each run owned by an object that is gone (the
    garbage collector deletes it, perhaps after it started a model loop)."""
    store, clock = MemoryStore(), Clock(T0 + 0.2)
    ctl = controller(store, clock)
    ctl.observe(cron())
    await ctl._reconcile_safely(("team-a", "report"))
    assert store.creates == 1
    store.gone = True  # deleted; no DELETED event came
    for offset in (10.2, 20.2, 30.2):
        clock.now = T0 + offset
        await ctl._reconcile_safely(("team-a", "report"))
    assert store.creates == 2  # the pass that found it gone; none after
    assert ctl.crons.entry(("team-a", "report")) is None


async def test_a_run_name_taken_by_another_object_is_a_warning_not_a_silent_skip() -> None:
    store, clock = MemoryStore(), Clock(T0 + 0.2)
    squatter = {"metadata": {"name": "report-1796032800", "uid": "someone-elses"}}
    store.runs["report-1796032800"] = squatter  # made by hand: not labelled, not owned
    ctl = controller(store, clock)
    await ctl.reconcile(cron())
    assert store.runs == {"report-1796032800": squatter} and store.creates == 1
    await ctl.events.drain()
    (event,) = ctl.events.api.events  # type: ignore[attr-defined]
    assert (event["type"], event["reason"]) == ("Warning", "RunNameTaken")
    assert "report-1796032800" in event["message"]


class RefusingStore(MemoryStore):
    """Creating a run fails with ``error`` (the API server refusing the manifest, or away)."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    async def create_run(self, manifest: Mapping[str, Any]) -> bool:
        self.creates += 1
        raise self.error


async def test_a_run_the_api_server_refuses_for_good_makes_it_not_ready_not_a_retry_loop(
    caplog: Any,
) -> None:
    from agentrun.operator.platform.kubeapi import ApiError

    store, clock = RefusingStore(ApiError(422, "Invalid: metadata.name too long")), Clock(T0 + 0.2)
    ctl = controller(store, clock)
    ctl.observe(cron())
    with caplog.at_level("INFO", logger="agentrun.operator.schedules.controller"):
        await ctl._reconcile_safely(("team-a", "report"))  # once more: it may pass
        assert ctl.crons.entry(("team-a", "report")).wake == clock.now + schedules.RETRY_SECONDS
        await ctl._reconcile_safely(("team-a", "report"))
    assert ctl.crons.entry(("team-a", "report")).wake is None  # until its spec or a run changes
    (ready,) = store.status["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", schedules.RECONCILE_FAILED)
    assert "HTTP 422" in ready["message"] and store.creates == 2
    assert [e["reason"] for e in ctl.events.api.events] == []  # queued, posted by its loop
    await ctl.events.drain()
    assert [e["reason"] for e in ctl.events.api.events] == [schedules.RECONCILE_FAILED]  # type: ignore[attr-defined]
    assert len([r for r in caplog.records if "HTTP 422" in r.getMessage()]) == 1


class QuotaStore(MemoryStore):
    """A namespace whose ResourceQuota allows one AgentRun: creating a second is refused."""

    async def create_run(self, manifest: Mapping[str, Any]) -> bool:
        if self.runs:
            raise ApiError(403, "Forbidden", '{"message": "exceeded quota: runs"}')
        return await super().create_run(manifest)


async def test_a_pass_whose_create_is_refused_still_counts_and_releases_the_ended_runs() -> None:
    """A quota of one AgentRun and a TTL of 0: the run ended held, the next time's create was
    refused (the quota counts the held run), the pass raised before its status write and its
    release, and so every pass after: the run was never released, the TTL never freed the
    quota, and the schedule never ran again (before the hold, the TTL deleted the run)."""
    store, clock = QuotaStore(), Clock(T0 + 0.2)
    ctl = controller(store, clock)
    await ctl.reconcile(cron())
    store.end("report-1796032800", "Succeeded", at=T0 + 6)
    clock.now = T0 + 3600.2  # the next schedule time
    with pytest.raises(ApiError):
        await ctl.reconcile(with_status(cron(), store))
    assert store.released == ["report-1796032800"]
    assert store.status["lastSuccessfulTime"] == "2026-11-30T10:00:06Z"


async def test_a_failure_that_passes_is_retried_without_giving_up() -> None:
    from agentrun.operator.platform.kubeapi import ApiError

    store, clock = RefusingStore(ApiError(503, "Unavailable")), Clock(T0 + 0.2)
    ctl = controller(store, clock)
    ctl.observe(cron())
    for _ in range(4):
        await ctl._reconcile_safely(("team-a", "report"))
    assert ctl.crons.entry(("team-a", "report")).wake == clock.now + schedules.RETRY_SECONDS
    assert "conditions" not in store.status and store.creates == 4
