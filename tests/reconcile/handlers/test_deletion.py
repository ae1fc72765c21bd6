"""An AgentRun's deletion as the operator sees it: runs hold no finalizer, so the object is
gone when its ``DELETED`` watch event arrives (``handlers.runs.run_seen``). A run that had not
ended leaves its queue and is stopped (its ledger entry settled, its events purged:
``Dispatcher.forget``); a finished one has its events purged; either way the status writer,
the TTL reaper and the storage count forget it. A dead NATS bounds each step, it never stops
the next."""

from __future__ import annotations

import types
from typing import Any

import pytest

from agentrun.operator.handlers import runs
from agentrun.operator.platform.shards import ALL_OF_ONE
from agentrun.operator.runs.keys import RunKey

RUN = RunKey("ns", "r", "uid-r")
RUNNING = {"phase": "Running", "tenant": "t", "lastEventSequence": 3}
ENDED = {"phase": "Succeeded", "terminalReason": "completed", "tenant": "t"}


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
        reaper=types.SimpleNamespace(forget=noted("reaper.forget")),
        storage=types.SimpleNamespace(forget=noted("storage.forget")),
        writer=types.SimpleNamespace(observe=noted("writer.observe")),
    )


async def deleted(parts: Any, status: dict[str, Any]) -> None:
    memo = types.SimpleNamespace(
        running=lambda: types.SimpleNamespace(runs=parts), ownership=ALL_OF_ONE
    )
    await runs.run_seen(
        type="DELETED",
        body={"metadata": {"uid": RUN.uid}, "status": status},  # type: ignore[arg-type]
        spec={},  # type: ignore[arg-type]
        meta={"generation": 1, "annotations": {}},  # type: ignore[arg-type]
        status=status,  # type: ignore[arg-type]
        namespace=RUN.namespace,
        name=RUN.name,
        uid=RUN.uid,
        memo=memo,
    )


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
