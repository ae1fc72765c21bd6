"""A worker whose clock runs a little ahead of the operator's rolls the tenant's window first
(every operation rolls at the caller's ``now``) and charges a call in the new window; the
operator's sweep, a moment before the boundary by its own clock, takes that window as begun
(``state.CLOCK_SKEW``), not as a rollback. (It restored the old window's floor: the worker's
charge was erased from both windows, with any skew near a boundary.)"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from decimal import Decimal

from agentrun import kernel
from agentrun.bus import connect_nats
from agentrun.ledger import (
    CallNeed,
    Granted,
    LedgerStore,
    QueuedRun,
    TenantLimits,
    TurnRef,
    UsageFloor,
    window_start,
)

PRICING = kernel.Pricing(Decimal("1"), Decimal("1"), Decimal("1"))
HOUR = 3600.0
W1 = window_start(1_700_000_000.0, HOUR)
END = W1 + HOUR


async def test_a_worker_ahead_by_half_a_second_loses_its_charge_to_the_operators_restore(
    nats_server,
) -> None:
    op_now = [END - 0.25]
    wk_now = [END + 0.25]
    clients = [
        await connect_nats(nats_server.url, name=f"skew-{i}", auth=nats_server.auth())
        for i in range(2)
    ]
    try:
        operator = await LedgerStore.open(
            clients[0].jetstream(timeout=5), bucket="BRK_SKEW", clock=lambda: op_now[0]
        )
        worker = await LedgerStore.open(
            clients[1].jetstream(timeout=5), bucket="BRK_SKEW", clock=lambda: wk_now[0]
        )
        tenant = f"t-{uuid.uuid4().hex[:8]}"
        limits = TenantLimits(tokens=100_000, window_seconds=HOUR)
        q = QueuedRun("a", "ns", "a", 0.0)
        assert await operator.admit_run(tenant, q, limits=limits, need=(0, Decimal(0))) is None
        book = await operator.read(tenant)
        assert book is not None and book.window == W1
        floor = UsageFloor(book.window, *book.usage_floor(), end=book.end)  # the sweep's floor

        ref = TurnRef(tenant, "a", "ns", "a", 0)
        state = dataclasses.replace(kernel.initial_state(goal="s"), turn=0)
        call = kernel.Usage(
            400, 1000, 0, PRICING.cost(input_tokens=400, cached_input_tokens=0, output_tokens=1000)
        )
        async with worker.turn_hold(ref, ttl=60, clock=lambda: wk_now[0]) as hold:
            assert isinstance(
                await hold.reserve_call(CallNeed(400, 1000, PRICING), before=state), Granted
            )
            await hold.spend(call)
            await hold.settle(dataclasses.replace(state, usage=call, turn=1))
        after_worker = await operator.read(tenant)
        assert after_worker is not None and after_worker.used_tokens == 1400

        # the operator's sweep, 0.5 s behind the worker: sees a window not begun -> "rollback"
        seen = await operator.read(tenant)
        assert seen is not None
        if seen.undercuts(floor, now=op_now[0]):
            await operator.repair_entry(tenant, [], limits=limits, now=op_now[0], floor=floor)
        op_now[0] = END + 1.0  # the boundary passes for the operator too
        await operator.repair_entry(tenant, [], limits=limits, now=op_now[0])
        final = await operator.read(tenant)
        assert final is not None
        assert final.used_tokens == 1400, (
            f"the call charged in the new window by the worker is gone: used "
            f"{final.used_tokens} in window {final.window - W1:+.0f}s (the operator's sweep "
            "took the worker's early roll for a rollback and restored the old window)"
        )
    finally:
        for c in clients:
            with contextlib.suppress(Exception):
                await c.close()
