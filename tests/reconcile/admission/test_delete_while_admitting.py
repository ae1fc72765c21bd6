"""A queued run deleted while its tenant's pump admits it: the pass prepared it (its object
read before the deletion) and appends its ``admitted`` event after the deletion's clean-up
found no events to end. The deletion must not take it out of its queue meanwhile (the run
would then be admitted and run with no object, its slot taken): it waits for the pass
(``QueuePump.forget_queued``, the tenant's pump lock, as a cancel does), so the stop of the
deleted run (``wiring.stop_deleted`` → ``LiveRuns.forget``: ended through its events, its slot
and hold freed, its events purged) comes after the admission and finds it. Against the real
nats-server's ledger."""

from __future__ import annotations

import asyncio
import types
from decimal import Decimal

from nats.aio.client import Client as NATS

from agentrun.ledger import QueuedRun
from agentrun.operator import wiring
from agentrun.operator.runs import RunKey

from .test_cancel_while_admitting import held_pass
from .test_poison import Runs, enqueue, make_pump


class Forgetting:
    """``LiveRuns.forget`` of the deleted run: records which runs had been started (had their
    ``admitted`` event) when it was called, the events it would end."""

    def __init__(self, runs: Runs) -> None:
        self.runs = runs
        self.saw: list[list[str]] = []

    async def forget(self, namespace: str, name: str, uid: str) -> None:
        self.saw.append(list(self.runs.started))


async def test_a_deletion_during_a_pass_that_admits_the_run_stops_it_after_its_admission(
    client: NATS,
) -> None:
    pump, runs, store, tenant, queued, held, passing = await held_pass(client)
    forgetting = Forgetting(runs)
    parts = types.SimpleNamespace(pump=pump, runs=forgetting)
    deleting = asyncio.create_task(
        wiring.stop_deleted(parts, RunKey("ns", "r", queued.uid))  # type: ignore[arg-type]
    )
    await asyncio.wait({deleting}, timeout=1.0)  # done at once, or waiting for the pass
    held.release.set()
    await passing
    await deleting
    assert runs.started == ["r"]
    assert forgetting.saw == [["r"]], "the deleted run was stopped before its admission"
    assert await store.queue(tenant.name) == []


async def test_a_deleted_run_no_pass_admits_leaves_its_queue(client: NATS) -> None:
    pump, runs, store, tenant = await make_pump(client)
    busy = QueuedRun("busy", "ns", "busy", 0.0)  # the tenant's one slot taken: "r" waits
    assert (
        await store.admit_run(tenant.name, busy, limits=tenant.limits, need=(0, Decimal(0))) is None
    )
    await enqueue(pump, tenant, "r")
    await pump.pump_queue(tenant.name)
    (queued,) = await store.queue(tenant.name)
    await pump.forget_queued(queued.uid)
    assert await store.queue(tenant.name) == []
    assert runs.started == []
