"""A run cancelled while its tenant's pump admits it: the pass prepared it (its object read
before the cancel annotation) and appends its ``admitted`` event after the cancel found no
events to end. The cancel must not take it out of its queue and show it ended meanwhile (the
run would then run, charged, behind a status saying ``cancelled``): it waits for the pass, and
a run the pass admitted is ended through its events. Against the real nats-server's ledger."""

from __future__ import annotations

import asyncio
from typing import Any

from nats.aio.client import Client as NATS

from agentrun import kernel
from agentrun.operator.handlers import runs as run_handlers
from agentrun.operator.runs import RunKey
from agentrun.protocol import RunConfig

from .test_poison import enqueue, make_pump


class HeldStart:
    """``LiveRuns.start_run`` held until released: the pass is between its preparation of the
    run and its ``admitted`` event."""

    def __init__(self, start: Any) -> None:
        self.start = start
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, config: RunConfig, **kwargs: Any) -> None:
        self.entered.set()
        await self.release.wait()
        await self.start(config, **kwargs)


async def held_pass(client: NATS) -> tuple[Any, Any, Any, Any, Any, HeldStart, asyncio.Task[Any]]:
    """One run ``r`` queued, and its tenant's pump pass under way, held between the run's
    preparation and its ``admitted`` event: the pump, runs, store and tenant of
    ``make_pump``, the queued run, the hold (release it with ``held.release.set()``) and the
    pass's task."""
    pump, runs, store, tenant = await make_pump(client)
    await enqueue(pump, tenant, "r")
    (queued,) = await store.queue(tenant.name)
    held = runs.start_run = HeldStart(runs.start_run)
    passing = asyncio.create_task(pump.pump_queue(tenant.name))
    await held.entered.wait()
    return pump, runs, store, tenant, queued, held, passing


async def test_a_cancel_during_a_pass_that_admits_the_run_leaves_the_run_to_end_by_its_events(
    client: NATS,
) -> None:
    pump, runs, store, tenant, queued, held, passing = await held_pass(client)
    cancelling = asyncio.create_task(pump.cancel_queued(RunKey("ns", "r", queued.uid), tenant.name))
    await asyncio.wait({cancelling}, timeout=1.0)  # done at once, or waiting for the pass
    held.release.set()
    await passing
    assert runs.started == ["r"]
    assert await cancelling is False  # not queued: the caller ends it through its events
    assert "r" not in runs.bodies  # no status ending it unadmitted
    assert await store.queue(tenant.name) == []


class Memo:
    """``memo.running()``: the live runs (whose first ``end`` finds no events: the run is
    admitted while its cancel waits for the pass) and the pump (which admitted it)."""

    def __init__(self) -> None:
        self.ended: list[kernel.Phase] = []
        self.runs = self
        self.pump = self

    def running(self) -> Any:
        return self

    async def end(self, namespace: str, name: str, uid: str, phase: kernel.Phase, _: str) -> bool:
        self.ended.append(phase)
        return len(self.ended) > 1  # its admitted event is there at the second look

    async def cancel_queued(self, key: RunKey, tenant: str | None = None) -> bool:
        return False  # the pass it waited for admitted it


async def test_a_cancel_ends_a_run_admitted_while_it_waited_for_its_queue() -> None:
    memo = Memo()
    await run_handlers.cancel_run(
        status={"tenant": "t"}, namespace="ns", name="r", uid="u", memo=memo, retry=0
    )
    assert memo.ended == [kernel.Phase.CANCELLED, kernel.Phase.CANCELLED]
