"""A run's lives through the operator's admission and settlement, against the real
nats-server's ledger: the pump admits a rerun naming the life its object shows (the one its
admission seals), and the close or release of an earlier life, still on its way when the rerun
was admitted, leaves the rerun's slot alone."""

from __future__ import annotations

import uuid
from decimal import Decimal

from nats.aio.client import Client as NATS

from agentrun import kernel
from agentrun.ledger import LedgerStore, QueuedRun, TenantLimits
from agentrun.operator.admission.queue import QueueBoard
from agentrun.operator.admission.settlement import RunSettlement
from agentrun.operator.runs.keys import RunKey
from agentrun.operator.runs.spec import ObjectMeta, RunObject, RunStatusView
from agentrun.protocol import RunEvent

from .test_poison import make_pump

LIMITS = TenantLimits(tokens=100_000, max_concurrent_runs=4)


async def test_the_pump_admits_a_rerun_naming_the_life_its_object_shows(client: NATS) -> None:
    pump, runs, store, tenant = await make_pump(client)
    obj = RunObject(
        metadata=ObjectMeta(generation=1),
        spec={"model": "mock", "goal": "g"},
        status=RunStatusView(reruns=2),
    )
    key = RunKey("ns", "again", f"again-{uuid.uuid4().hex[:6]}")
    await pump.enqueue_run(key, tenant, generation=1, created=1e9, obj=obj)
    await pump.pump_queue(tenant.name)
    assert runs.started == ["again"]
    book = await store.read(tenant.name)
    assert book is not None and book.active[key.uid].life == 2


async def test_an_earlier_life_s_close_and_release_leave_the_rerun_s_slot_alone(
    client: NATS,
) -> None:
    """Life 0's close (its terminal event, 5,000 tokens) and a release of it, both retried
    after life 1 was admitted, neither free life 1's slot nor charge it; life 1's close does."""
    store = await LedgerStore.open(client.jetstream())
    settlement = RunSettlement(store, QueueBoard())
    tenant, uid = f"t-{uuid.uuid4().hex[:8]}", f"u-{uuid.uuid4().hex[:8]}"
    run, need = QueuedRun(uid, "ns", "r", 1e9), (0, Decimal(0))
    assert await store.admit_run(tenant, run, limits=LIMITS, need=need, life=0) is None
    await settlement.release_unstarted(tenant, uid=uid, life=0)  # the rerun frees life 0
    assert await store.admit_run(tenant, run, limits=LIMITS, need=need, life=1) is None
    usage = kernel.Usage(input_tokens=5_000, cost_usd=Decimal(0))
    first = kernel.RunSummary(kernel.Phase.COMPLETED, turn=3, steps=3, usage=usage)
    await settlement.settle_ended_run(RunEvent("turn", uid, first), tenant=tenant, uid=uid, life=0)
    await settlement.release_unstarted(tenant, uid=uid, life=0)
    book = await store.read(tenant)
    assert book is not None
    assert book.active[uid].life == 1 and book.used_tokens == 0 and not book.has_ended(uid)
    second = kernel.RunSummary(kernel.Phase.COMPLETED, turn=1, steps=1, usage=kernel.Usage(40, 0))
    await settlement.settle_ended_run(RunEvent("turn", uid, second), tenant=tenant, uid=uid, life=1)
    book = await store.read(tenant)
    assert book is not None
    assert uid not in book.active and book.used_tokens == 40 and book.has_ended(uid)
