"""An AgentRun's deletion as the operator sees it: runs hold no finalizer, so the object is
gone when its ``DELETED`` watch event arrives (``handlers.runs.run_seen``). A run that had not
ended leaves its queue and is stopped (its ledger entry settled, its events purged:
``Dispatcher.forget``); a finished one has its events purged; either way the status writer,
the TTL reaper and the storage count forget it. A dead NATS bounds each step, it never stops
the next. A run the status writer finds gone is stopped the same way. A run that still holds
the finalizer earlier operators added has it taken off once it ends or its deletion starts
(first stopped), never while it is going."""

from __future__ import annotations

import asyncio
import types
from typing import Any

import pytest
from kube_support import FakeKube

from agentrun.operator import wiring
from agentrun.operator.evals.status import EVAL_LABEL
from agentrun.operator.handlers import runs
from agentrun.operator.handlers.startup import LEGACY_FINALIZER
from agentrun.operator.platform.shards import ALL_OF_ONE
from agentrun.operator.runs import lifecycle
from agentrun.operator.runs.handled import HandledActions
from agentrun.operator.runs.keys import HOLD_ANNOTATION, RunKey
from agentrun.operator.schedules.spec import CRON_LABEL

RUN = RunKey("ns", "r", "uid-r")
RUNNING = {"phase": "Running", "tenant": "t", "lastEventSequence": 3}
ENDED = {"phase": "Succeeded", "terminalReason": "completed", "tenant": "t"}
ENDED_AT = {"completionTime": "2026-11-30T12:00:00Z"}


class Recorder:
    """Records every call made on the parts the handler reaches."""

    def __init__(self, *, queue_fails: bool = False) -> None:
        self.calls: list[str] = []
        self.queue_fails = queue_fails

    async def forget_queued(self, uid: str) -> None:
        self.calls.append(f"pump.forget_queued {uid}")
        if self.queue_fails:
            raise ConnectionResetError("NATS away")

    async def forget(self, namespace: str, name: str, uid: str) -> None:
        self.calls.append(f"runs.forget {namespace}/{name} {uid}")

    async def purge_deleted(self, namespace: str, name: str, uid: str) -> None:
        self.calls.append(f"runs.purge_deleted {namespace}/{name} {uid}")


def parts_of(recorder: Recorder) -> Any:
    def noted(what: str) -> Any:
        return lambda *args, **_: recorder.calls.append(f"{what} {args[0]}")

    return types.SimpleNamespace(
        pump=recorder,
        runs=recorder,
        api=FakeKube(),
        reaper=types.SimpleNamespace(forget=noted("reaper.forget"), observe=lambda key, **_: None),
        storage=types.SimpleNamespace(
            forget=noted("storage.forget"), observe=lambda uid, status: None
        ),
        writer=types.SimpleNamespace(observe=lambda key, body: None),
        tenants=types.SimpleNamespace(policies={}),
    )


async def seen(parts: Any, status: dict[str, Any], *, type: str, **meta: Any) -> HandledActions:
    """``run_seen`` of ``RUN``'s ``type`` event; what kopf remembers handling of runs after it
    (it remembered ``RUN``'s creation before)."""
    handled = HandledActions()
    handled.handled(RUN.uid, status={}, actions={})
    memo = types.SimpleNamespace(
        running=lambda: types.SimpleNamespace(runs=parts), ownership=ALL_OF_ONE, handled=handled
    )
    metadata = {"generation": 1, "annotations": {}, "resourceVersion": "7", **meta}
    await runs.run_seen(
        type=type,
        body={"metadata": {"uid": RUN.uid, **metadata}, "status": status},  # type: ignore[arg-type]
        spec={},  # type: ignore[arg-type]
        meta=metadata,  # type: ignore[arg-type]
        status=status,  # type: ignore[arg-type]
        namespace=RUN.namespace,
        name=RUN.name,
        uid=RUN.uid,
        memo=memo,
    )
    return handled


async def deleted(parts: Any, status: dict[str, Any]) -> None:
    handled = await seen(parts, status, type="DELETED")
    assert len(handled) == 0  # kopf's memory of the run dropped


@pytest.mark.parametrize(
    "status", [RUNNING, {}, {"phase": "Queued", "tenant": "t"}], ids=["running", "new", "queued"]
)
async def test_a_run_deleted_before_it_ended_leaves_its_queue_and_is_stopped(
    status: dict[str, Any],
) -> None:
    recorder = Recorder()
    await deleted(parts_of(recorder), status)
    assert recorder.calls == [
        f"reaper.forget {RUN}",
        f"storage.forget {RUN.uid}",
        f"pump.forget_queued {RUN.uid}",
        f"runs.forget ns/r {RUN.uid}",
    ]


async def test_a_finished_run_deleted_has_its_events_purged_and_is_not_stopped() -> None:
    recorder = Recorder()
    await deleted(parts_of(recorder), ENDED)
    assert recorder.calls == [
        f"reaper.forget {RUN}",
        f"storage.forget {RUN.uid}",
        f"runs.purge_deleted ns/r {RUN.uid}",
    ]


async def test_a_queue_nats_cannot_reach_does_not_keep_the_run_going(
    caplog: pytest.LogCaptureFixture,
) -> None:
    recorder = Recorder(queue_fails=True)
    await deleted(parts_of(recorder), RUNNING)
    assert recorder.calls[-1] == f"runs.forget ns/r {RUN.uid}"
    assert "could not take ns/r out of its queue" in caplog.text


async def test_a_run_the_status_writer_finds_gone_is_stopped_as_a_deleted_one() -> None:
    """Its ``DELETED`` event was missed (a watch that listed again), or a queued run's position
    was written after it: the writer's 404 hands it over, and it leaves its queue and stops."""
    recorder = Recorder()
    parts = parts_of(recorder)
    gone: asyncio.Queue[Any] = asyncio.Queue()
    gone.put_nowait(RUN)
    parts.writer = types.SimpleNamespace(next_gone=gone.get)
    loop = asyncio.create_task(wiring._stop_gone_runs(parts))
    try:
        async with asyncio.timeout(5):
            while len(recorder.calls) < 2:
                await asyncio.sleep(0.01)
    finally:
        loop.cancel()
    assert recorder.calls == [f"pump.forget_queued {RUN.uid}", f"runs.forget ns/r {RUN.uid}"]


def stored_finalizers(parts: Any) -> list[Any]:
    """The ``metadata.finalizers`` of every patch sent (with the preconditions they carried)."""
    patches = [body["metadata"] for verb, (_, body) in parts.api.calls if verb == "patch"]
    return [(m["finalizers"], m["uid"], m["resourceVersion"]) for m in patches if "finalizers" in m]


async def test_an_earlier_versions_finalizer_stays_while_the_run_goes() -> None:
    recorder = Recorder()
    parts = parts_of(recorder)
    await seen(parts, RUNNING, type="MODIFIED", finalizers=[LEGACY_FINALIZER])
    assert stored_finalizers(parts) == [] and recorder.calls == []


async def test_an_earlier_versions_finalizer_goes_once_the_run_ended() -> None:
    recorder = Recorder()
    parts = parts_of(recorder)
    await seen(parts, ENDED, type="MODIFIED", finalizers=["other.io/keep", LEGACY_FINALIZER])
    assert stored_finalizers(parts) == [(["other.io/keep"], RUN.uid, "7")]
    assert recorder.calls == []


async def test_a_run_holding_it_deleted_while_going_is_stopped_then_released() -> None:
    recorder = Recorder()
    parts = parts_of(recorder)
    stamp = "2026-12-05T06:00:00Z"
    await seen(
        parts, RUNNING, type="MODIFIED", finalizers=[LEGACY_FINALIZER], deletionTimestamp=stamp
    )
    assert recorder.calls == [f"pump.forget_queued {RUN.uid}", f"runs.forget ns/r {RUN.uid}"]
    assert stored_finalizers(parts) == [([], RUN.uid, "7")]


def owner(kind: str, *, controller: bool = True) -> dict[str, Any]:
    """A run's ownerReference naming the object ``o`` of ``kind``."""
    found = {"apiVersion": "agentrun.dev/v1alpha1", "kind": kind, "name": "o", "uid": "u"}
    return {**found, "controller": True} if controller else found


EVAL = {EVAL_LABEL: "o"}
CRON = {CRON_LABEL: "o"}


@pytest.mark.parametrize(
    ("hold", "owners", "labels", "kept"),
    [
        ("grading", [owner("AgentEval")], EVAL, True),
        ("schedule", [owner("CronAgentRun")], CRON, True),
        ("grading", [], EVAL, False),
        ("forever", [owner("AgentEval")], EVAL, False),
        ("schedule", [owner("AgentEval")], EVAL, False),
        ("grading", [owner("AgentEval", controller=False)], EVAL, False),
        ("schedule", [owner("CronAgentRun")], {}, False),
        ("grading", [owner("AgentEval")], {EVAL_LABEL: "other"}, False),
    ],
    ids=[
        "eval",
        "schedule",
        "no-owner",
        "made-up",
        "other-kind",
        "not-controller",
        "unlabelled",
        "other-label",
    ],
)
async def test_only_the_creator_a_hold_names_holds_a_run_from_its_ttl(
    hold: str, owners: list[dict[str, Any]], labels: dict[str, str], kept: bool
) -> None:
    """``agentrun.dev/hold`` set by a user on a run no AgentEval or CronAgentRun controls and
    lists (by its label): nothing ever removes it, and the run (its events, its tenant's
    storage) outlived the tenant's ttlSecondsAfterFinished (and the 1-year most of the run's
    own) for ever."""
    parts = parts_of(Recorder())
    parts.reaper = lifecycle.Reaper(FakeKube(), clock=lambda: 0.0)
    parts.tenants = types.SimpleNamespace(
        policies={"t": types.SimpleNamespace(ttl_after_finished=0)}
    )
    meta = {"annotations": {HOLD_ANNOTATION: hold}, "ownerReferences": owners, "labels": labels}
    await seen(parts, ENDED | ENDED_AT, type="MODIFIED", **meta)
    assert (RUN not in parts.reaper.due) is kept


def test_the_holders_labels_are_those_their_controllers_list_runs_by() -> None:
    assert lifecycle.HOLDERS == {
        "grading": ("AgentEval", EVAL_LABEL),
        "schedule": ("CronAgentRun", CRON_LABEL),
    }
