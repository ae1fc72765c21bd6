"""The ledger sweep and an active run no process follows whose events have not ended
(``LedgerSweep._find_repairs``): runs hold no finalizer, so an AgentRun deleted while no
operator watched is gone when the next one starts. The sweep stops it as a deleted run (ended,
counted, settled, its events purged: ``LiveRuns.forget``); a run whose status shows an end gets
its events ended; a run whose object is there and going is left to its resume; a run admitted
within the grace is not looked at."""

from __future__ import annotations

import types
from typing import Any

import pytest
from kube_support import FakeKube

from agentrun import kernel
from agentrun.ledger import Active
from agentrun.operator.admission.queue import QueueBoard
from agentrun.operator.admission.sweep import STALE_GRACE, LedgerSweep, SweepDeps

NOW = 1_800_000_000.0
UID = "uid-r"


class Runs:
    """Follows nothing; records what the sweep asks of the live runs."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def is_tracked(self, uid: str) -> bool:
        return False

    async def end(
        self, namespace: str, name: str, uid: str, phase: kernel.Phase, message: str
    ) -> bool:
        self.calls.append(f"end {namespace}/{name} {uid} {phase.value}")
        return True

    async def forget(self, namespace: str, name: str, uid: str) -> None:
        self.calls.append(f"forget {namespace}/{name} {uid}")


class Events:
    """The run's last event: its own, not ended."""

    async def last_event(self, namespace: str, name: str) -> Any:
        return types.SimpleNamespace(run_uid=UID, phase=kernel.Phase.RUNNING)


def run_object(uid: str, status: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "r", "namespace": "ns", "uid": uid}, "spec": {}, "status": status}


async def swept(api: FakeKube, *, since: float = NOW - STALE_GRACE - 1) -> list[str]:
    runs = Runs()
    deps = SweepDeps(
        store=None,  # type: ignore[arg-type]
        tenants=None,  # type: ignore[arg-type]
        board=QueueBoard(),
        runs=runs,  # type: ignore[arg-type]
        events=Events(),
        api=api,
        tenant_status=None,  # type: ignore[arg-type]
        clock=lambda: NOW,
    )
    book = types.SimpleNamespace(expired=lambda now: [], active={UID: Active("ns", "r", since)})
    assert await LedgerSweep(deps)._find_repairs(book, NOW) == []  # type: ignore[arg-type]
    return runs.calls


async def test_a_run_whose_object_was_deleted_while_no_operator_watched_is_stopped_as_deleted() -> (
    None
):
    assert await swept(FakeKube()) == [f"forget ns/r {UID}"]


async def test_a_run_whose_name_holds_a_newer_object_is_stopped_as_deleted() -> None:
    api = FakeKube()
    api.put("agentruns", run_object("uid-newer", {"phase": "Running"}))
    assert await swept(api) == [f"forget ns/r {UID}"]


async def test_a_run_whose_status_shows_its_end_gets_its_events_ended() -> None:
    api = FakeKube()
    api.put(
        "agentruns", run_object(UID, {"phase": "Failed", "terminalReason": "checkpoint_failed"})
    )
    assert await swept(api) == [f"end ns/r {UID} cancelled"]


@pytest.mark.parametrize("since", [NOW - STALE_GRACE - 1, NOW - 1], ids=["stale", "in-grace"])
async def test_a_run_whose_object_is_there_and_going_is_left_to_its_resume(since: float) -> None:
    api = FakeKube()
    api.put("agentruns", run_object(UID, {"phase": "Running"}))
    assert await swept(api, since=since) == []


async def test_a_run_admitted_within_the_grace_is_not_looked_at() -> None:
    assert await swept(FakeKube(), since=NOW - 1) == []
