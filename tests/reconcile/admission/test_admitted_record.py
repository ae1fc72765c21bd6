"""What admission leaves on the object for disaster recovery (``runs.recovery``): the admitted
run's uid in ``agentrun.dev/admitted-uid``, never on a newer object of the name; and an end
written for a run not admitted again carries the event sequence its status shows."""

from __future__ import annotations

import asyncio
import logging
import types
from typing import Any

import pytest
from kube_support import FakeKube
from nats.aio.client import Client as NATS

from agentrun import kernel
from agentrun.operator.admission import pump as pump_module
from agentrun.operator.admission.pump import RECORDS_AT_ONCE, QueuePump
from agentrun.operator.admission.queuestatus import QueueStatus
from agentrun.operator.runs.keys import ADMITTED_UID_ANNOTATION, RunKey
from agentrun.operator.tenants.policy import TenantPolicy

from .test_poison import enqueue, make_pump, tenant_object

RUN = RunKey("ns", "r", "uid-r")


def pump(api: FakeKube) -> QueuePump:
    deps = types.SimpleNamespace(store=None, board=None, clock=lambda: 0.0, shown=None, api=api)
    return QueuePump(deps)  # type: ignore[arg-type]


async def test_an_admitted_run_records_its_uid() -> None:
    api = FakeKube()
    api.put("agentruns", {"metadata": {"name": "r", "namespace": "ns", "uid": RUN.uid}})
    await pump(api)._record_admitted(RUN)
    found = api.find("agentruns", "r", "ns")
    assert found is not None
    assert found["metadata"]["annotations"] == {ADMITTED_UID_ANNOTATION: RUN.uid}
    ((_, (_, body)),) = [c for c in api.calls if c[0] == "patch"]
    assert body["metadata"]["uid"] == RUN.uid  # the API server refuses it on another object


async def test_a_failed_record_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    api = FakeKube()
    api.fail("patch", 422, "metadata.uid: field is immutable")
    with caplog.at_level(logging.WARNING):
        await pump(api)._record_admitted(RUN)
    assert "could not record the admission of ns/r" in caplog.text


class Writer:
    def __init__(self) -> None:
        self.submitted: list[tuple[dict[str, Any], int, bool]] = []

    def submit(self, run: RunKey, body: Any, *, seq: int, terminal: bool, **_: Any) -> None:
        self.submitted.append((dict(body), seq, terminal))


def test_an_end_not_admitted_again_carries_the_sequence_its_status_shows() -> None:
    writer = Writer()
    shown = QueueStatus(writer, counter=None, events=None, clock=lambda: 0.0)  # type: ignore[arg-type]
    shown.end_unadmitted(
        RUN, kernel.Phase.CHECKPOINT_FAILED, "gone", tenant="t", generation=1, seq=7
    )
    shown.end_unadmitted(RUN, kernel.Phase.INVALID_SPEC, "bad", tenant="t", generation=1)
    (first, seq, terminal), (_, default_seq, _) = writer.submitted
    assert (first["terminalReason"], seq, terminal) == ("checkpoint_failed", 7, True)
    assert default_seq == 0


class HeldKube(FakeKube):
    """``FakeKube`` whose object PATCHes wait for ``release`` (an API server busy with a
    burst), counting how many wait at once."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.waiting = 0
        self.most_waiting = 0

    async def patch(self, ref: Any, body: Any) -> bool:
        self.waiting += 1
        self.most_waiting = max(self.most_waiting, self.waiting)
        try:
            await self.release.wait()
        finally:
            self.waiting -= 1
        return await super().patch(ref, body)


async def test_a_record_is_written_beside_the_caller_and_waited_for_by_recorded() -> None:
    api = HeldKube()
    api.put("agentruns", {"metadata": {"name": "r", "namespace": "ns", "uid": RUN.uid}})
    queue = pump(api)
    queue.record_later(RUN)  # returns at once: the PATCH is held
    (task,) = queue.running()
    waiting = asyncio.create_task(queue.recorded(RUN.uid))
    await asyncio.sleep(0.05)
    assert not waiting.done() and not task.done()
    api.release.set()
    await asyncio.wait_for(waiting, 2)
    found = api.find("agentruns", "r", "ns")
    assert found is not None and found["metadata"]["annotations"] == {
        ADMITTED_UID_ANNOTATION: RUN.uid
    }
    assert queue.running() == []
    await queue.recorded(RUN.uid)  # none being written: returns at once


async def test_records_are_written_a_few_at_a_time() -> None:
    api = HeldKube()
    queue = pump(api)
    keys = [RunKey("ns", f"r{i}", f"uid-{i}") for i in range(RECORDS_AT_ONCE * 3)]
    for key in keys:
        api.put("agentruns", {"metadata": {"name": key.name, "namespace": "ns", "uid": key.uid}})
        queue.record_later(key)
    await asyncio.sleep(0.05)
    assert api.waiting == RECORDS_AT_ONCE
    api.release.set()
    await asyncio.wait_for(asyncio.gather(*(queue.recorded(k.uid) for k in keys)), 2)
    assert api.most_waiting == RECORDS_AT_ONCE
    assert all(
        (api.find("agentruns", k.name, "ns") or {})["metadata"]["annotations"]
        == {ADMITTED_UID_ANNOTATION: k.uid}
        for k in keys
    )


async def test_a_cancelled_wait_for_a_record_leaves_the_record_going() -> None:
    api = HeldKube()
    api.put("agentruns", {"metadata": {"name": "r", "namespace": "ns", "uid": RUN.uid}})
    queue = pump(api)
    queue.record_later(RUN)
    waiting = asyncio.create_task(queue.recorded(RUN.uid))
    await asyncio.sleep(0.01)
    waiting.cancel()
    api.release.set()
    (task,) = queue.running()
    await asyncio.wait_for(task, 2)
    assert not task.cancelled()
    found = api.find("agentruns", "r", "ns")
    assert found is not None and ADMITTED_UID_ANNOTATION in found["metadata"]["annotations"]


async def test_a_pass_admits_its_runs_without_waiting_for_their_records(client: NATS) -> None:
    api = HeldKube()
    queue, runs, store, tenant = await make_pump(client, api=api)
    await enqueue(queue, tenant, "r")
    await asyncio.wait_for(queue.pump_queue(tenant.name), 2)  # its record's PATCH is held
    assert runs.started == ["r"] and await store.queue(tenant.name) == []
    assert api.waiting == 1
    api.release.set()
    await asyncio.wait_for(asyncio.gather(*queue.running()), 2)
    assert api.waiting == 0


async def test_a_pass_admits_no_more_while_too_many_records_wait_to_be_written(
    client: NATS, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API server slow: admissions stop once ``RECORDS_PENDING`` records wait, so what
    waits for it stays bounded, and go on as records are written."""
    monkeypatch.setattr(pump_module, "RECORDS_PENDING", 2)
    monkeypatch.setattr(pump_module, "ADMIT_BATCH", 1)
    api = HeldKube()
    queue, runs, store, tenant = await make_pump(client, api=api)
    roomy = tenant_object(tenant.name, maxConcurrentRuns=10)
    queue.deps.tenants.put(roomy)
    await enqueue(queue, TenantPolicy.of(roomy), "r1", "r2", "r3", "r4")
    passing = asyncio.create_task(queue.pump_queue(tenant.name))
    await asyncio.sleep(0.2)
    assert runs.started == ["r1", "r2"] and not passing.done()
    assert [q.name for q in await store.queue(tenant.name)] == ["r3", "r4"]
    api.release.set()
    await asyncio.wait_for(passing, 5)
    assert runs.started == ["r1", "r2", "r3", "r4"]
    await asyncio.wait_for(asyncio.gather(*queue.running()), 2)
