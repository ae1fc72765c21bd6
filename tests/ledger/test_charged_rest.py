"""A call charged as abandoned at what its hold had recorded — its slow worker's hold swept as
expired, or set aside by a redelivery whose commit resolved the turn — while its response
still streamed is charged the rest of what it used when its delivery gives it up, and a
delivery whose hold was set aside still records its progress there. (The call was charged
only what the hold had recorded: 500 of 3,400 tokens, 1,100 of two calls' 4,000.)"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest

from agentrun import kernel
from agentrun.bus import connect_nats
from agentrun.ledger import CallNeed, Granted, LedgerStore, QueuedRun, Repair, TenantLimits, TurnRef

PRICING = kernel.Pricing(Decimal("1"), Decimal("1"), Decimal("1"))
T0 = 1_700_000_000.0
LIMITS = TenantLimits(tokens=100_000)


def usage(output: int) -> kernel.Usage:
    cost = PRICING.cost(input_tokens=400, cached_input_tokens=0, output_tokens=output)
    return kernel.Usage(400, output, 0, cost, estimated=True)


@contextlib.asynccontextmanager
async def stores(
    server: Any, count: int, now: list[float]
) -> AsyncIterator[tuple[str, list[LedgerStore]]]:
    """A fresh tenant with run ``a`` admitted, and ``count`` ledger stores on connections of
    their own (processes, as far as the ledger can tell), on the clock ``now[0]``."""
    clients = [
        await connect_nats(server.url, name=f"rest-{i}", auth=server.auth()) for i in range(count)
    ]
    try:
        opened = [
            await LedgerStore.open(
                c.jetstream(timeout=5), bucket="LEDGER_CHARGED_REST", clock=lambda: now[0]
            )
            for c in clients
        ]
        tenant = f"t-{uuid.uuid4().hex[:8]}"
        q = QueuedRun("a", "ns", "a", 0.0)
        assert await opened[0].admit_run(tenant, q, limits=LIMITS, need=(0, Decimal(0))) is None
        yield tenant, opened
    finally:
        for c in clients:
            with contextlib.suppress(Exception):
                await c.close()


@pytest.mark.parametrize("how", ["exit-uncommitted", "abandon-failure-record"])
async def test_output_streamed_after_the_sweep_charged_a_slow_workers_hold_is_charged(
    nats_server, how: str
) -> None:
    now = [T0]
    async with stores(nats_server, 2, now) as (tenant, (operator, worker)):
        limits = LIMITS
        ref = TurnRef(tenant, "a", "ns", "a", 0)
        need = CallNeed(400, 4000, PRICING, min_output_tokens=128)
        state = dataclasses.replace(kernel.initial_state(goal="p"), turn=0)
        async with worker.turn_hold(ref, ttl=60, clock=lambda: now[0]) as hold:
            assert isinstance(await hold.reserve_call(need, before=state), Granted)
            await hold.spend(usage(100), answered=False)  # SpendWatch.progress: 100 so far
            assert hold.recorded
            now[0] += 61  # refreshes did not land; the hold expired
            read = await operator.read(tenant)
            assert read is not None
            swept = Repair(ref.key, "a", None, since=read.slot_since("a"))
            await operator.repair_entry(tenant, [swept], limits=limits)
            await hold.spend(usage(3000), answered=False)  # the stream went on: 3000 delivered
            final = usage(3000)
            if how == "abandon-failure-record":
                await hold.abandon(final)  # SpendWatch.charge_abandoned: commits its failure
            else:
                hold.note(final)  # cancelled mid-stream: leaves the block uncommitted
        book = await operator.read(tenant)
        assert book is not None
        assert book.used_tokens == final.total_tokens, (
            f"the call used {final.total_tokens} tokens; the tenant was charged "
            f"{book.used_tokens} (only what the hold had recorded when the sweep dropped it)"
        )


async def test_a_redelivery_that_commits_charges_the_first_deliverys_whole_call(
    nats_server,
) -> None:
    """The same without any expiry: the first delivery streams (its progress recorded on its
    hold), JetStream redelivers the turn (ack_wait passed), the second delivery sets the
    first's hold aside, commits and settles — charging the first's call as abandoned at the
    partial usage recorded. The first's stream goes on (recorded on its hold set aside, then
    gone); its commit loses; it abandons its whole call and is charged the rest."""
    now = [T0]
    async with stores(nats_server, 3, now) as (tenant, (operator, w1, w2)):
        ref = TurnRef(tenant, "a", "ns", "a", 0)
        need = CallNeed(400, 4000, PRICING, min_output_tokens=128)
        state = dataclasses.replace(kernel.initial_state(goal="p"), turn=0)
        first = w1.turn_hold(ref, ttl=60, clock=lambda: now[0])
        assert isinstance(await first.reserve_call(need, before=state), Granted)
        await first.spend(usage(100), answered=False)  # progress while streaming
        now[0] += 31  # ack_wait: redelivered
        second = w2.turn_hold(ref, ttl=60, clock=lambda: now[0])
        granted = await second.reserve_call(need, before=state)
        assert isinstance(granted, Granted) and granted.contested
        await second.spend(usage(200))
        committed = usage(200)
        await second.settle(dataclasses.replace(state, usage=committed, turn=1))
        await first.spend(usage(3000), answered=False)  # its stream went on
        await first.abandon(usage(3000))  # its commit lost: it charges its call as it leaves
        book = await operator.read(tenant)
        assert book is not None
        want = committed.total_tokens + usage(3000).total_tokens
        assert book.used_tokens == want, (
            f"two calls used {want} tokens; the tenant was charged {book.used_tokens}: the "
            "losing delivery's call only at what its hold had recorded when it was set aside"
        )
