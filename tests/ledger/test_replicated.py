"""Case B04 on a three-server JetStream cluster: many runs of two tenants reserve, spend and
settle by compare-and-set on the ledger bucket at R3 from three connections (one per server)
while the bucket's stream leader is stepped down three times, and again at R1 without
step-downs (the bucket's count lowered again). The runs go on turning until the step-downs are
behind them, however fast the machine, and the expected books are summed from the turns each
run settled. A lost compare-and-set on a replicated bucket
is answered with error 10164, which the ledger must retry as a conflict: no operation fails
with an API error or with ``LedgerUnavailable``, the compare-and-sets were contested
(conflicts retried), and each tenant's book equals the sum of its runs' usage exactly, no
hold left."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import TypeVar

import nats
import nats.errors
import nats.js.api
import nats.js.errors
import pytest
from cluster_nats_support import ELECTION_ERRORS

from agentrun import kernel, protocol
from agentrun.bus import connect_nats
from agentrun.ledger import CallNeed, Granted, LedgerStore, QueuedRun, TenantLimits, TurnRef
from agentrun_dev import natscluster

T = TypeVar("T")
RUNS, TURNS = 40, 8
"""Per test: runs (half per tenant), and the fewest turns each run settles."""
BETWEEN = 40
"""Turns settled (all runs together) before each step-down and after the last one."""
CALL = kernel.Usage(input_tokens=80, output_tokens=20, cost_usd=Decimal("0.00040"))
PRICING = kernel.Pricing(Decimal("2.50"), Decimal("1.25"), Decimal("10"))
ELECTING = ELECTION_ERRORS


@dataclasses.dataclass
class Load:
    done: int = 0
    """Turns settled so far."""
    electing: list[BaseException] = dataclasses.field(default_factory=list)
    """Requests that met an election and were retried."""


async def retried(load: Load, op: Callable[[], Awaitable[T]]) -> T:
    """``op()`` again while it meets an election; anything else fails the test at once."""
    async with asyncio.timeout(30):
        while True:
            try:
                return await op()
            except ELECTING as err:
                load.electing.append(err)
                await asyncio.sleep(0.05)


def after_turn(turn: int) -> kernel.RunState:
    """A run's state after ``turn`` committed turns of ``CALL`` each."""
    total = kernel.Usage()
    for _ in range(turn):
        total = total + CALL
    return dataclasses.replace(kernel.initial_state(goal="b04"), usage=total, turn=turn)


async def deliver(store: LedgerStore, ref: TurnRef, load: Load) -> None:
    """One delivery of turn ``ref.turn``: reserve, spend, settle (the settlement retried)."""
    hold = store.turn_hold(ref, ttl=120)
    need = CallNeed(100, 50, PRICING, min_output_tokens=50)
    answer = await hold.reserve_call(need, before=after_turn(ref.turn))
    assert isinstance(answer, Granted), answer
    await hold.spend(CALL)
    await retried(load, lambda: hold.settle(after_turn(ref.turn + 1)))


async def run_turns(store: LedgerStore, ref: TurnRef, load: Load, stop: asyncio.Event) -> int:
    """One run's turns, at least ``TURNS`` and more until ``stop``, each redelivered (a new
    owner) while its delivery meets an election. Returns the turns settled."""
    turn = 0
    while turn < TURNS or not stop.is_set():
        turn_ref = dataclasses.replace(ref, turn=turn)
        await retried(load, lambda r=turn_ref: deliver(store, r, load))  # type: ignore[misc]
        load.done += 1
        turn += 1
    return turn


async def settled(load: Load, more: int) -> None:
    """Until the runs settled ``more`` turns from now (30 s at most)."""
    target = load.done + more
    async with asyncio.timeout(30):
        while load.done < target:
            await asyncio.sleep(0.01)


async def step_downs(admin: nats.NATS, stream: str, load: Load) -> list[tuple[str, str]]:
    """Three step-downs of ``stream``'s leader, each after the load moved on (the load goes on
    until the caller stops it)."""
    leaders = []
    for _ in range(3):
        await settled(load, BETWEEN)
        leaders.append(await natscluster.step_down(admin, stream))
    return leaders


@pytest.mark.parametrize("replicas", [3, 1], ids=["R3-with-step-downs", "R1"])
async def test_ledger_compare_and_sets_on_a_replicated_bucket_retry_conflicts_and_stay_exact(
    nats_cluster: natscluster.NatsCluster, replicas: int
) -> None:
    bucket = protocol.LEDGER_BUCKET  # the operator may configure no other (at R1 after R3:
    # the count lowered)
    clients = [
        await connect_nats(server.url, name=f"b04-{i}", auth=nats_cluster.auth("operator"))
        for i, server in enumerate(nats_cluster.servers)
    ]
    admin = await nats.connect(**nats_cluster.client_options("admin"))
    try:
        stores = [
            await LedgerStore.open(c.jetstream(timeout=5), bucket=bucket, replicas=replicas)
            for c in clients
        ]
        info = await admin.jetstream().stream_info(protocol.kv_stream(bucket))
        assert info.config.num_replicas == replicas
        tenants = [f"t-{uuid.uuid4().hex[:8]}" for _ in range(2)]
        limits = TenantLimits(tokens=10_000_000, cost_usd=Decimal("100"))
        refs = [TurnRef(tenants[i % 2], f"run-{i}", "ns", f"run-{i}", 0) for i in range(RUNS)]
        for ref in refs:
            run = QueuedRun(ref.run_uid, "ns", ref.run_uid, 0.0)
            need = (0, Decimal(0))
            assert await stores[0].admit_run(ref.tenant, run, limits=limits, need=need) is None
        load, stop = Load(), asyncio.Event()
        work = asyncio.gather(
            *(run_turns(stores[i % 3], r, load, stop) for i, r in enumerate(refs))
        )
        try:
            if replicas > 1:
                leaders = await step_downs(admin, protocol.kv_stream(bucket), load)
                assert all(old != new for old, new in leaders)
                await settled(load, BETWEEN)  # the load went on past the last step-down
        finally:
            stop.set()
        turns = await work
        for i, ref in enumerate(refs):
            close = stores[i % 3].close_run
            summary = after_turn(turns[i]).summary()
            await retried(
                load, lambda r=ref, c=close, s=summary: c(r.tenant, r.run_uid, s, end=0.0)
            )  # type: ignore[misc]
        assert sum(store.conflicts for store in stores) > 0, "no compare-and-set was contested"
        for t, tenant in enumerate(tenants):
            settled_turns = sum(turns[t::2])
            book = await stores[0].read(tenant)
            assert book is not None
            assert book.used_tokens == settled_turns * CALL.total_tokens
            assert book.used_cost == settled_turns * CALL.cost_usd
            assert (book.abandoned_tokens, book.holds, book.active) == (0, {}, {})
    finally:
        for client in [*clients, admin]:
            with contextlib.suppress(Exception):
                await client.close()


async def test_racing_kv_updates_on_a_replicated_bucket_lose_as_conflicts_not_api_errors(
    nats_cluster: natscluster.NatsCluster,
) -> None:
    """What the ledger's retry rests on (nats-py >= 2.15.0): at R3 the losers' error 10164 is
    ``KeyWrongLastSequenceError``, like 10071 on one server."""
    client = await nats.connect(**nats_cluster.client_options("admin"))
    try:
        kv = await client.jetstream(timeout=5).create_key_value(
            nats.js.api.KeyValueConfig(bucket="B04_RACE", history=1, replicas=3)
        )
        losers: list[BaseException] = []
        for round_ in range(5):
            revision = await kv.put(f"race-{round_}", b"0")
            results = await asyncio.gather(
                *(kv.update(f"race-{round_}", b"1", last=revision) for _ in range(20)),
                return_exceptions=True,
            )
            assert sum(isinstance(r, int) for r in results) == 1, results
            losers += [r for r in results if isinstance(r, BaseException)]
        assert losers and all(
            isinstance(r, nats.js.errors.KeyWrongLastSequenceError) for r in losers
        ), {type(r).__name__ for r in losers}
    finally:
        await client.close()
