"""Chaos: nats-server is SIGKILLed and restarted while two processes' worth of turns reserve,
record and settle by compare-and-set. Every operation is retried the way the runtime retries
it (a turn whose reservation failed is redelivered with a new owner; a failed settlement is
settled again), and the tenant's ledger comes out exact: every turn charged once, no hold left,
nothing abandoned, the totals equal to the sums over the run entries — in the ``split`` layout
with every run inline in the totals (one value per write) and with every run stored apart (an
atomic batch of the run's entry and the totals per write, some of them cut by the kill), and in
the ``single`` layout (the whole ledger one value, as earlier releases store it)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import TypeVar

import pytest
from nats.aio.client import Client as NATS

from agentrun import kernel
from agentrun.bus import connect_nats
from agentrun.ledger import CallNeed, Granted, LedgerStore, QueuedRun, TenantLimits, TurnRef
from agentrun_dev import components, natsserver

T = TypeVar("T")
RUNS, TURNS = 16, 40
DONE: list[TurnRef] = []
"""Turns delivered so far."""
CALL = kernel.Usage(input_tokens=80, output_tokens=20, cost_usd=Decimal("0.00040"))
PRICING = kernel.Pricing(Decimal("2.50"), Decimal("1.25"), Decimal("10"))


class Server:
    """A nats-server of this test's own that can be SIGKILLed and started again (same port,
    same store)."""

    def __init__(self, workdir: Path, launch: components.Launch) -> None:
        self.launch = launch
        self.server = natsserver.start_nats_server(workdir, launch=launch)
        self.component = self.server.component

    @property
    def url(self) -> str:
        return self.server.url

    def kill_and_restart(self, *, down: float) -> None:
        """SIGKILL it, wait ``down`` seconds, start it again."""
        components.kill_component(self.component)
        time.sleep(down)
        old = self.component
        self.component = self.launch.start(old.spec, probe=old.probe, ports=old.ports)

    def stop(self) -> None:
        components.stop_component(self.component)


@pytest.fixture
def server(tmp_path: Path, devenv_launch: components.Launch) -> Iterator[Server]:
    running = Server(tmp_path, devenv_launch)
    yield running
    running.stop()


FAILURES: list[BaseException] = []
"""Operations that failed and were retried (the chaos reached them)."""
SPANS: list[tuple[float, float]] = []
"""When each delivery started and ended (monotonic seconds): one that spans the kill was in
flight through the outage (the client may have held its requests until the server was back)."""


async def retried(op: Callable[[], Awaitable[T]], *, timeout: float = 60.0) -> T:
    """``op()`` until it succeeds (each failure is what a redelivery or a retry would do).

    A failed assertion inside ``op`` is the test failing, not the chaos: it is raised at once,
    never retried into a pass."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                return await op()
            except AssertionError:
                raise
            except Exception as err:
                FAILURES.append(err)
                await asyncio.sleep(random.uniform(0.05, 0.2))


async def test_retried_raises_a_failed_assertion_at_once() -> None:
    """The helper itself: chaos is retried, a failed check of the test is not."""
    calls: list[int] = []

    async def check() -> None:
        calls.append(1)
        raise AssertionError("not Granted")

    with pytest.raises(AssertionError, match="not Granted"):
        await retried(check, timeout=5.0)
    assert calls == [1]


def after_turn(turn: int) -> kernel.RunState:
    """A run's state after ``turn`` committed turns of ``CALL`` each."""
    total = kernel.Usage()
    for _ in range(turn):
        total = total + CALL
    return dataclasses.replace(kernel.initial_state(goal="chaos"), usage=total, turn=turn)


async def deliver(store: LedgerStore, ref: TurnRef) -> None:
    """One delivery of turn ``ref.turn``: reserve, spend, settle (the settlement retried)."""
    started = time.monotonic()
    try:
        await _deliver(store, ref)
    finally:
        SPANS.append((started, time.monotonic()))


async def _deliver(store: LedgerStore, ref: TurnRef) -> None:
    hold = store.turn_hold(ref, ttl=120)
    need = CallNeed(100, 50, PRICING, min_output_tokens=50)
    try:
        answer = await hold.reserve_call(need, before=after_turn(ref.turn))
    except Exception:
        # a reservation whose answer the restart lost may have landed: the worker's ``async
        # with`` exit gives the hold back (the store retrying its write), its call never made;
        # landing after the redelivery set the hold aside and charged its prompt's bound, the
        # release takes that back
        await retried(lambda: store.release_hold(ref, owner=hold.owner))
        raise
    assert isinstance(answer, Granted), answer
    await hold.spend(CALL)
    await retried(lambda: hold.settle(after_turn(ref.turn + 1)))


async def run_turns(store: LedgerStore, tenant: str, uid: str) -> None:
    """One run's turns, each redelivered (a new owner) until its delivery went through."""
    for turn in range(TURNS):
        ref = TurnRef(tenant, uid, "ns", uid, turn)
        await retried(lambda ref=ref: deliver(store, ref))  # type: ignore[misc]
        DONE.append(ref)


@pytest.mark.parametrize(
    ("layout", "inline"),
    [("split", 32), ("split", 0), ("single", 0)],
    ids=["inline", "apart", "single"],
)
async def test_a_nats_server_restart_during_ledger_compare_and_sets_loses_and_doubles_nothing(
    server: Server, layout: str, inline: int
) -> None:
    clients: list[NATS] = [
        await connect_nats(server.url, name=f"chaos-{i}", auth=server.server.auth())
        for i in range(2)
    ]
    stores = [
        await LedgerStore.open(c.jetstream(timeout=2), inline_runs=inline, layout=layout)
        for c in clients
    ]
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    limits = TenantLimits(tokens=10_000_000, cost_usd=Decimal("100"))
    uids = [f"run-{i}" for i in range(RUNS)]
    for uid in uids:
        run = QueuedRun(uid, "ns", uid, 0.0)
        assert await stores[0].admit_run(tenant, run, limits=limits, need=(0, Decimal(0))) is None
    try:
        work = asyncio.gather(
            *(run_turns(stores[i % 2], tenant, uid) for i, uid in enumerate(uids))
        )
        FAILURES.clear()
        DONE.clear()
        SPANS.clear()
        async with asyncio.timeout(60):  # a quarter done: compare-and-sets in flight from both
            while len(DONE) < RUNS * TURNS // 4:
                await asyncio.sleep(0.01)
        assert not work.done()
        # down longer than a JetStream request's 2 s timeout: requests in flight fail, and
        # writes buffered by the client may still land after their caller gave up
        killed = time.monotonic()
        await asyncio.to_thread(server.kill_and_restart, down=3.0)
        await work
        through = [s for s in SPANS if s[0] < killed and s[1] > killed + 3.0]
        assert FAILURES or through, "the restart reached no compare-and-set"
        for uid in uids:
            await retried(
                lambda uid=uid: stores[1].close_run(
                    tenant, uid, after_turn(TURNS).summary(), end=0.0
                )
            )
        book = await retried(lambda: stores[0].read(tenant))
        assert book is not None
        assert book.used_tokens == RUNS * TURNS * CALL.total_tokens
        assert book.used_cost == RUNS * TURNS * CALL.cost_usd
        assert (book.abandoned_tokens, book.holds, book.active) == (0, {}, {})
        assert book.totals_mismatch() == [] and set(book.runs) == set(uids)
        assert all(entry.only_ended for entry in book.runs.values())  # remembered as ended
        assert (book.reserved_tokens, book.active_runs) == (0, 0)
        if layout == "single":
            assert sum(store.batches for store in stores) == 0  # one value: no batch
        elif not inline:
            assert sum(store.batches for store in stores) > RUNS  # group-committed, batched
    finally:
        for client in clients:
            with contextlib.suppress(Exception):
                await client.close()
