"""What the AgentRun handlers do on create or resume with a run whose checkpoint is gone or
that was restored from a backup, and with ``agentrun.dev/rerun`` (``runs.recovery`` decides):
the run ends ``checkpoint_failed`` without being queued unless a rerun is asked; a rerun starts
it from turn 0 with its subject purged, its slot freed and its status cleared."""

from __future__ import annotations

import time
import types
from collections.abc import Awaitable, Callable
from typing import Any

import kopf
import pytest
from kube_support import FakeKube

from agentrun import kernel
from agentrun.operator.admission.fairgate import AdmissionGate
from agentrun.operator.handlers import admission, runs
from agentrun.operator.platform.shards import ALL_OF_ONE
from agentrun.operator.runs import recovery
from agentrun.operator.runs.keys import (
    ADMITTED_UID_ANNOTATION,
    CANCEL_ANNOTATION,
    RERUN_ANNOTATION,
    RunKey,
)

RUN = RunKey("ns", "r", "uid-r")
RUNNING = {
    "phase": "Running",
    "startTime": "2026-12-01T20:00:00Z",
    "lastEventSequence": 7,
    "tenant": "t",
}
ENDED = {
    "phase": "Failed",
    "terminalReason": "checkpoint_failed",
    "tenant": "t",
    "completionTime": "2026-12-01T20:01:00Z",
    "usage": {"steps": 2},
}


class Runs:
    """Live runs whose recovery finds events (``has_events``) or not."""

    def __init__(self, *, has_events: bool = False, original_ended: bool = False) -> None:
        self.has_events = has_events
        self.original_ended = original_ended
        self.calls: list[str] = []
        self.api: FakeKube | None = None
        self.reruns_at_purge: list[int | None] = []

    async def project_restored(
        self, namespace: str, name: str, uid: str, *, original: str, generation: int
    ) -> bool:
        self.calls.append(f"project_restored {original}")
        return self.original_ended

    async def recover(
        self, namespace: str, name: str, uid: str, *, generation: int, reruns: int = 0
    ) -> bool:
        self.calls.append("recover")
        return self.has_events

    async def prepare_rerun(self, namespace: str, name: str, uid: str) -> None:
        self.calls.append("prepare_rerun")
        if self.api is not None:  # what the object shows as its subject is purged
            self.reruns_at_purge.append(stored(self.api)["status"].get("reruns"))

    def is_tracked(self, uid: str) -> bool:
        return self.has_events  # followed here once recovered


class Shown:
    def __init__(self) -> None:
        self.ended: list[dict[str, Any]] = []

    def end_unadmitted(self, key: RunKey, phase: kernel.Phase, message: str, **kw: Any) -> None:
        self.ended.append({"phase": phase, "message": message, **kw})


class Pump:
    def __init__(self) -> None:
        self.released: list[tuple[str, str, int]] = []
        self.late: Callable[[], Awaitable[None]] | None = None
        """An admission record of the run's earlier life still being written (``land``)."""

    async def release_slot(self, tenant: str, uid: str, *, life: int) -> None:
        self.released.append((tenant, uid, life))

    async def recorded(self, uid: str) -> None:
        await self.land()

    async def land(self) -> None:
        """The record being written lands (once)."""
        late, self.late = self.late, None
        if late is not None:
            await late()


class Events:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, str]] = []

    def record(self, involved: Any, *, type: Any, reason: str, message: str, **_: Any) -> None:
        self.recorded.append((str(type), reason, message))


enqueued: list[dict[str, Any]] = []
"""The keywords of each run handed to validation and the queue (``queued``)."""


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> list[RunKey]:
    """The runs handed to validation and the queue (what else they were handed: ``enqueued``)."""
    seen: list[RunKey] = []
    enqueued.clear()

    async def enqueue(parts: Any, key: RunKey, **kw: Any) -> None:
        seen.append(key)
        enqueued.append(kw)

    monkeypatch.setattr(admission, "_validate_and_enqueue", enqueue)
    return seen


def stack(
    annotations: dict[str, str], status: dict[str, Any], *, has_events: bool = False
) -> tuple[Any, FakeKube]:
    api = FakeKube()
    meta = {
        "name": RUN.name,
        "namespace": RUN.namespace,
        "uid": RUN.uid,
        "annotations": dict(annotations),
        "generation": 1,
    }
    api.put("agentruns", {"metadata": meta, "spec": {}, "status": dict(status)})
    runs = Runs(has_events=has_events)
    runs.api = api
    parts = types.SimpleNamespace(
        api=api,
        runs=runs,
        shown=Shown(),
        pump=Pump(),
        events=Events(),
        gate=AdmissionGate(),
    )
    return parts, api


def memo(parts: Any) -> Any:
    return types.SimpleNamespace(
        running=lambda: types.SimpleNamespace(runs=parts), ownership=ALL_OF_ONE
    )


async def create(parts: Any, annotations: dict[str, str], status: dict[str, Any]) -> None:
    await admission.admit_run(
        spec={"model": "mock", "goal": "g"},  # type: ignore[arg-type]
        meta={"generation": 1, "annotations": annotations},  # type: ignore[arg-type]
        status=status,  # type: ignore[arg-type]
        namespace=RUN.namespace,
        name=RUN.name,
        uid=RUN.uid,
        retry=0,
        memo=memo(parts),
    )


def stored(api: FakeKube) -> dict[str, Any]:
    found = api.find("agentruns", RUN.name, RUN.namespace)
    assert found is not None
    return found


async def test_a_running_run_whose_events_are_gone_ends_checkpoint_failed_unqueued(
    queued: list[RunKey],
) -> None:
    annotations = {ADMITTED_UID_ANNOTATION: RUN.uid}
    parts, _ = stack(annotations, RUNNING)
    await create(parts, annotations, RUNNING)
    (end,) = parts.shown.ended
    assert end["phase"] is kernel.Phase.CHECKPOINT_FAILED
    assert "holds none of its events" in end["message"]
    assert "agentrun.dev/rerun=true" in end["message"]
    assert (end["seq"], end["tenant"]) == (7, "t")  # not dropped as older than its status
    assert queued == []


async def test_a_run_whose_status_shows_it_admitted_is_lost_without_the_annotation(
    queued: list[RunKey],
) -> None:
    parts, _ = stack({}, RUNNING)
    await create(parts, {}, RUNNING)
    (end,) = parts.shown.ended
    assert "holds none of its events" in end["message"]
    assert queued == []


async def test_a_restored_copy_ends_checkpoint_failed_unqueued(queued: list[RunKey]) -> None:
    annotations = {ADMITTED_UID_ANNOTATION: "uid-original"}
    parts, _ = stack(annotations, {})
    await create(parts, annotations, {})
    (end,) = parts.shown.ended
    assert end["phase"] is kernel.Phase.CHECKPOINT_FAILED
    assert "restored from a backup" in end["message"] and "uid-original" in end["message"]
    assert (end["seq"], end["tenant"]) == (0, None)
    assert queued == []


async def test_a_new_run_is_validated_and_queued(queued: list[RunKey]) -> None:
    parts, _ = stack({}, {})
    await create(parts, {}, {})
    assert queued == [RUN]
    assert parts.shown.ended == []


async def test_an_ended_run_is_not_looked_at(queued: list[RunKey]) -> None:
    parts, _ = stack({ADMITTED_UID_ANNOTATION: RUN.uid}, ENDED)
    await create(parts, {ADMITTED_UID_ANNOTATION: RUN.uid}, ENDED)
    assert parts.runs.calls == [] and parts.shown.ended == [] and queued == []


async def test_a_recovered_run_gets_its_admission_recorded(queued: list[RunKey]) -> None:
    parts, api = stack({}, RUNNING, has_events=True)
    await create(parts, {}, RUNNING)
    assert stored(api)["metadata"]["annotations"] == {ADMITTED_UID_ANNOTATION: RUN.uid}
    assert parts.shown.ended == [] and queued == []


async def test_a_recovered_run_with_its_admission_recorded_is_not_patched(
    queued: list[RunKey],
) -> None:
    annotations = {ADMITTED_UID_ANNOTATION: RUN.uid}
    parts, api = stack(annotations, RUNNING, has_events=True)
    await create(parts, annotations, RUNNING)
    assert [verb for verb, _ in api.calls if verb == "patch"] == []


async def test_a_rerun_asked_of_a_run_still_going_is_ignored_with_a_warning(
    queued: list[RunKey],
) -> None:
    annotations = {ADMITTED_UID_ANNOTATION: RUN.uid, RERUN_ANNOTATION: "true"}
    parts, api = stack(annotations, RUNNING, has_events=True)
    await create(parts, annotations, RUNNING)
    assert RERUN_ANNOTATION not in stored(api)["metadata"]["annotations"]
    ((kind, reason, message),) = parts.events.recorded
    assert (kind, reason) == ("Warning", "RerunIgnored") and "still going" in message
    assert "prepare_rerun" not in parts.runs.calls and queued == []


async def rerun_checks(parts: Any, api: FakeKube, queued: list[RunKey], *, life: int = 1) -> None:
    """The rerun checks, the rerun being the run's life ``life``: counted in its status
    before its subject was purged, and handed to the queue with it (its admission seals it)."""
    obj = stored(api)
    assert parts.runs.calls[-1] == "prepare_rerun"  # its subject purged, its end forgotten
    assert parts.runs.reruns_at_purge == [life] and obj["status"]["reruns"] == life
    assert enqueued[-1]["status"]["reruns"] == life
    assert parts.pump.released == [("t", RUN.uid, life - 1)]  # the slot of the life before
    assert obj["status"]["phase"] == "Pending"
    for cleared in ("terminalReason", "startTime", "lastEventSequence", "usage", "completionTime"):
        assert cleared not in obj["status"]
    assert obj["metadata"]["annotations"] == {}  # the rerun asked, the old admission forgotten
    assert ("Normal", "Rerun") in [(k, r) for k, r, _ in parts.events.recorded]
    assert queued == [RUN] and parts.shown.ended == []


async def test_a_lost_run_with_a_rerun_asked_starts_again_from_turn_0(
    queued: list[RunKey],
) -> None:
    annotations = {ADMITTED_UID_ANNOTATION: RUN.uid, RERUN_ANNOTATION: "true"}
    parts, api = stack(annotations, RUNNING)
    await create(parts, annotations, RUNNING)
    await rerun_checks(parts, api, queued)


async def test_an_ended_run_with_a_rerun_asked_at_resume_starts_again(
    queued: list[RunKey],
) -> None:
    annotations = {ADMITTED_UID_ANNOTATION: RUN.uid, RERUN_ANNOTATION: "true"}
    parts, api = stack(annotations, ENDED)
    await create(parts, annotations, ENDED)
    assert "recover" not in parts.runs.calls
    await rerun_checks(parts, api, queued)


async def update(parts: Any, annotations: dict[str, str], status: dict[str, Any]) -> None:
    await admission.rerun_run(
        spec={"model": "mock", "goal": "g"},  # type: ignore[arg-type]
        meta={"generation": 1, "annotations": annotations},  # type: ignore[arg-type]
        status=status,  # type: ignore[arg-type]
        namespace=RUN.namespace,
        name=RUN.name,
        uid=RUN.uid,
        memo=memo(parts),
    )


async def test_the_rerun_annotation_set_on_an_ended_run_starts_it_again(
    queued: list[RunKey],
) -> None:
    annotations = {ADMITTED_UID_ANNOTATION: RUN.uid, RERUN_ANNOTATION: "true"}
    parts, api = stack(annotations, ENDED)
    await update(parts, annotations, ENDED)
    await rerun_checks(parts, api, queued)


async def test_a_rerun_removes_the_admission_record_after_the_earlier_lifes_lands(
    queued: list[RunKey],
) -> None:
    """The pump writes an admission record beside its pass (``QueuePump.record_later``): a
    run that ended at once may be rerun while its record is on its way; landing after the
    rerun removed it, it would name the new life's uid with no events, a lost checkpoint at
    the next start."""
    annotations = {RERUN_ANNOTATION: "true"}
    parts, api = stack(annotations, ENDED)

    async def late() -> None:
        await api.patch(RUN.ref, {"metadata": {"annotations": {ADMITTED_UID_ANNOTATION: RUN.uid}}})

    parts.pump.late = late
    await update(parts, annotations, ENDED)
    await parts.pump.land()  # a record not waited for would land now
    await rerun_checks(parts, api, queued)


async def test_each_rerun_is_a_later_life_of_the_run(queued: list[RunKey]) -> None:
    annotations = {ADMITTED_UID_ANNOTATION: RUN.uid, RERUN_ANNOTATION: "true"}
    parts, api = stack(annotations, {**ENDED, "reruns": 2})
    await update(parts, annotations, {**ENDED, "reruns": 2})
    await rerun_checks(parts, api, queued, life=3)


async def test_a_cancelled_run_reruns_without_its_cancel(queued: list[RunKey]) -> None:
    """Cancelled, then asked to run again (how a run still going is rerun): the cancel that
    ended it is taken off before the new run is queued, which would otherwise drop it as
    cancelled at once."""
    annotations = {
        ADMITTED_UID_ANNOTATION: RUN.uid,
        RERUN_ANNOTATION: "true",
        CANCEL_ANNOTATION: "true",
    }
    parts, api = stack(annotations, ENDED)
    await update(parts, annotations, ENDED)
    await rerun_checks(parts, api, queued)
    assert set(enqueued[0]["removed"]) == {CANCEL_ANNOTATION, ADMITTED_UID_ANNOTATION}


async def test_the_rerun_annotation_set_on_a_running_run_is_removed_with_a_warning(
    queued: list[RunKey],
) -> None:
    annotations = {ADMITTED_UID_ANNOTATION: RUN.uid, RERUN_ANNOTATION: "true"}
    parts, api = stack(annotations, RUNNING, has_events=True)
    await update(parts, annotations, RUNNING)
    assert stored(api)["metadata"]["annotations"] == {ADMITTED_UID_ANNOTATION: RUN.uid}
    assert [r for _, r, _ in parts.events.recorded] == ["RerunIgnored"]
    assert parts.runs.calls == [] and queued == []


async def test_the_rerun_annotation_set_on_a_queued_run_is_removed_with_a_warning(
    queued: list[RunKey],
) -> None:
    status = {"phase": "Queued", "queuePosition": 1, "tenant": "t"}
    parts, api = stack({RERUN_ANNOTATION: "true"}, status)
    await update(parts, {RERUN_ANNOTATION: "true"}, status)
    assert stored(api)["metadata"]["annotations"] == {}
    assert [r for _, r, _ in parts.events.recorded] == ["RerunIgnored"]
    assert queued == []


async def test_the_rerun_annotation_on_a_run_not_resumed_is_left_to_the_resume(
    queued: list[RunKey],
) -> None:
    annotations = {ADMITTED_UID_ANNOTATION: RUN.uid, RERUN_ANNOTATION: "true"}
    parts, api = stack(annotations, RUNNING)  # not followed: its checkpoint is gone
    await update(parts, annotations, RUNNING)
    assert stored(api)["metadata"]["annotations"] == annotations
    assert parts.events.recorded == [] and parts.runs.calls == [] and queued == []


async def test_a_rerun_already_read_is_not_read_again(queued: list[RunKey]) -> None:
    parts, _ = stack({}, {"phase": "Pending"})  # admit_run read it (kopf's copy is older)
    await update(parts, {RERUN_ANNOTATION: "true"}, ENDED)
    assert parts.events.recorded == [] and parts.runs.calls == [] and queued == []


async def test_a_rerun_that_fails_to_queue_keeps_the_ask_and_kopfs_retry_finishes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    annotations = {ADMITTED_UID_ANNOTATION: RUN.uid, RERUN_ANNOTATION: "true"}
    parts, api = stack(annotations, ENDED)

    async def away(parts: Any, key: RunKey, **_: Any) -> None:
        raise ConnectionResetError("NATS away")

    monkeypatch.setattr(admission, "_validate_and_enqueue", away)
    with pytest.raises(kopf.TemporaryError) as raised:  # kopf tries it again in 3 s
        await update(parts, annotations, ENDED)
    assert isinstance(raised.value.__cause__, ConnectionResetError)
    assert stored(api)["metadata"]["annotations"] == {RERUN_ANNOTATION: "true"}
    assert stored(api)["status"]["phase"] == "Pending"

    seen: list[RunKey] = []

    async def enqueue(parts: Any, key: RunKey, **kw: Any) -> None:
        seen.append(key)
        enqueued.append(kw)

    monkeypatch.setattr(admission, "_validate_and_enqueue", enqueue)
    await update(parts, annotations, ENDED)  # kopf's retry, with its old copy of the object
    assert seen == [RUN] and stored(api)["metadata"]["annotations"] == {}
    assert "RerunIgnored" not in [r for _, r, _ in parts.events.recorded]


async def test_a_rerun_of_an_object_replaced_meanwhile_touches_nothing(
    queued: list[RunKey],
) -> None:
    annotations = {RERUN_ANNOTATION: "true"}
    parts, api = stack(annotations, ENDED)
    stored(api)["metadata"]["uid"] = "uid-newer"
    await update(parts, annotations, ENDED)
    assert parts.runs.calls == [] and parts.pump.released == [] and queued == []
    assert stored(api)["status"]["terminalReason"] == "checkpoint_failed"


def seen(parts: Any, annotations: dict[str, str], status: dict[str, Any]) -> Any:
    parts.writer = types.SimpleNamespace(observe=lambda key, body: None)
    parts.storage = types.SimpleNamespace(observe=lambda uid, status: None)
    parts.tenants = types.SimpleNamespace(policies={})
    parts.reaper = types.SimpleNamespace(observe=lambda key, **_: None)
    return runs.run_seen(
        type="MODIFIED",
        body={},  # type: ignore[arg-type]
        spec={},  # type: ignore[arg-type]
        meta={"generation": 1, "annotations": annotations},  # type: ignore[arg-type]
        status=status,  # type: ignore[arg-type]
        namespace=RUN.namespace,
        name=RUN.name,
        uid=RUN.uid,
        memo=memo(parts),
    )


async def test_a_restored_copy_kopf_took_for_known_ends_when_seen() -> None:
    annotations = {ADMITTED_UID_ANNOTATION: "uid-original"}
    parts, _ = stack(annotations, RUNNING)
    await seen(parts, annotations, RUNNING)
    (end,) = parts.shown.ended
    assert "restored from a backup" in end["message"] and end["seq"] == 7


async def test_a_run_seen_that_is_not_a_restored_copy_is_left_alone() -> None:
    for marks, status in (
        ({ADMITTED_UID_ANNOTATION: RUN.uid}, RUNNING),
        ({ADMITTED_UID_ANNOTATION: "uid-original", RERUN_ANNOTATION: "true"}, {}),
        ({ADMITTED_UID_ANNOTATION: "uid-original"}, ENDED),
    ):
        parts, _ = stack(marks, status)
        await seen(parts, marks, status)
        assert parts.shown.ended == []


async def test_a_run_that_ended_gets_its_uid_recorded_once() -> None:
    parts, api = stack({}, ENDED)  # ended unadmitted, or before the annotation existed
    await seen(parts, {}, ENDED)
    assert stored(api)["metadata"]["annotations"] == {ADMITTED_UID_ANNOTATION: RUN.uid}
    await seen(parts, {ADMITTED_UID_ANNOTATION: RUN.uid}, ENDED)
    assert len([verb for verb, _ in api.calls if verb == "patch"]) == 1
    assert parts.shown.ended == []


async def test_a_failed_record_of_an_ended_run_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    parts, api = stack({}, ENDED)
    api.fail("patch", 503, "Unavailable")
    await seen(parts, {}, ENDED)
    assert "could not record the uid of ns/r" in caplog.text


async def test_a_recovered_run_whose_record_fails_goes_on(queued: list[RunKey]) -> None:
    parts, api = stack({}, RUNNING, has_events=True)
    api.fail("patch", 403, "Forbidden")
    await create(parts, {}, RUNNING)  # no exception: kopf does not retry, nothing ends
    assert parts.shown.ended == [] and queued == []


async def test_a_restored_copy_whose_original_ended_shows_that_end(queued: list[RunKey]) -> None:
    annotations = {ADMITTED_UID_ANNOTATION: "uid-original"}
    parts, _ = stack(annotations, {})
    parts.runs.original_ended = True
    await create(parts, annotations, {})
    assert parts.runs.calls == ["recover", "project_restored uid-original"]
    assert parts.shown.ended == [] and queued == []


async def test_a_lost_run_is_not_taken_for_a_restored_copy(queued: list[RunKey]) -> None:
    annotations = {ADMITTED_UID_ANNOTATION: RUN.uid}
    parts, _ = stack(annotations, RUNNING)
    parts.runs.original_ended = True  # never asked: its own events are gone
    await create(parts, annotations, RUNNING)
    assert [c for c in parts.runs.calls if c.startswith("project")] == []
    assert len(parts.shown.ended) == 1


async def test_a_rerun_is_queued_from_when_it_began(queued: list[RunKey]) -> None:
    """What validation and the queue are handed of a rerun says when it began (the status
    the rerun wrote), so that it queues after the runs made before the rerun, not by the
    object's creation."""
    annotations = {ADMITTED_UID_ANNOTATION: RUN.uid, RERUN_ANNOTATION: "true"}
    parts, _ = stack(annotations, ENDED)
    before = time.time()
    await update(parts, annotations, ENDED)
    (handed,) = enqueued
    began = recovery.queued_since(0.0, handed["status"])
    assert before - 1 <= began <= time.time() + 1
