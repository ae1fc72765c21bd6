"""A rerun's admission seals the life of the run it starts: the queue pump admits a run with
the ``status.reruns`` its object showed when it was queued (``RunConfig.reruns``), so that a
copy of an earlier life's admission is told from it. Against the real nats-server's ledger."""

from __future__ import annotations

import uuid

from nats.aio.client import Client as NATS

from agentrun.operator.platform.spec import ObjectMeta
from agentrun.operator.runs import RunKey, RunObject
from agentrun.operator.runs.spec import RunStatusView
from agentrun.protocol import RunConfig

from .test_poison import make_pump


async def test_the_admitted_config_carries_the_life_the_object_was_queued_in(
    client: NATS,
) -> None:
    pump, runs, _, tenant = await make_pump(client)
    sealed: list[RunConfig] = []
    start = runs.start_run

    async def recording(config: RunConfig, *, start_time: float, generation: int) -> None:
        sealed.append(config)
        await start(config, start_time=start_time, generation=generation)

    runs.start_run = recording  # type: ignore[method-assign]
    spec = {"model": "mock", "goal": "g"}
    obj = RunObject(metadata=ObjectMeta(generation=1), spec=spec, status=RunStatusView(reruns=2))
    key = RunKey("ns", "again", f"again-{uuid.uuid4().hex[:6]}")
    await pump.enqueue_run(key, tenant, generation=1, created=1e9, obj=obj)
    await pump.pump_queue(tenant.name)
    assert [(c.name, c.reruns) for c in sealed] == [("again", 2)]
