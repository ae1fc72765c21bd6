"""No change of a tenant's ledger that names many runs writes an atomic batch above
``cas.MAX_BATCH`` messages: nats-server refuses a batch of more than 1,000
(``jetstream.limits.batch.max_msgs``), and a refused change fails the same way at every retry.
Changes of many runs (the sweep's repairs, admissions group-committed) are cut into writes of
bounded size. Checked against the real server."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from decimal import Decimal
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NATS

from agentrun.ledger import Book, BudgetRefusal, LedgerStore, QueuedRun, Repair
from agentrun.ledger.cas import MAX_BATCH
from agentrun.ledger.entries import TenantLimits
from agentrun_dev import natsserver

NOW = 1_800_000_000.0
LIMITS = TenantLimits(tokens=10**9, cost_usd=Decimal(1_000), max_concurrent_runs=5_000)
TENANT = "big"
COST = Decimal("0.000001")

Opener = Callable[..., Awaitable[Any]]


@pytest.fixture
async def open_store(nats_server: natsserver.NatsServer) -> AsyncIterator[Opener]:
    """``await open_store(cls=LedgerStore, **kwargs)``: a store (a process of its own: its own
    connection and cache) on this test's bucket, its clock at ``NOW``."""
    bucket = f"BATCHES_{uuid.uuid4().hex[:8]}"
    clients: list[NATS] = []

    async def opener(cls: type[LedgerStore] = LedgerStore, **kwargs: Any) -> LedgerStore:
        client = await nats.connect(**nats_server.client_options())
        clients.append(client)
        kwargs.setdefault("clock", lambda: NOW)
        store = await LedgerStore.open(client.jetstream(), bucket=bucket, **kwargs)
        if cls is not LedgerStore:
            store = cls(store.kv, **kwargs)
        return store

    yield opener
    await clients[0].jetstream().delete_key_value(bucket)
    for client in clients:
        await client.close()


async def admit(store: LedgerStore, uid: str) -> BudgetRefusal | None:
    run = QueuedRun(uid, "ns", uid, NOW)
    return await store.admit_run(TENANT, run, limits=LIMITS, need=(100, 100 * COST), now=NOW)


async def whole(store: LedgerStore) -> Book:
    """The tenant's ledger read whole, split, its totals the sums over its entries."""
    book = await store.read(TENANT)
    assert book is not None and not book.one_value
    assert book.totals_mismatch() == []
    return book


async def test_admissions_of_many_runs_at_once_are_written_in_bounded_batches(
    open_store: Opener,
) -> None:
    """Forty admissions of 32 runs each at once, group-committed: each write carries as many
    as its batch holds (not all forty: 1,280 runs and the totals), and every run is
    admitted."""
    store = await open_store(layout="split")
    assert await admit(store, "first") is None  # the ledger exists: no write makes it
    runs = [QueuedRun(f"r-{i:04d}", "ns", f"r-{i:04d}", NOW) for i in range(40 * 32)]
    need = (100, 100 * COST)

    async def admit_32(start: int) -> list[BudgetRefusal | None]:
        part = [(run, need) for run in runs[start : start + 32]]
        return await store.admit_runs(TENANT, part, limits=LIMITS, now=NOW)

    answers = await asyncio.gather(*map(admit_32, range(0, len(runs), 32)))
    assert answers == [[None] * 32] * 40
    book = await whole(store)
    assert book.active_runs == 1 + 1_280
    assert store.largest_batch <= MAX_BATCH


async def test_the_sweeps_repair_of_1000_runs_that_ended_unseen_is_written_in_bounded_batches(
    open_store: Opener,
) -> None:
    """A thousand runs of a split ledger ended while no operator watched (their objects and
    events gone): the sweep closes them all in one repair, written ``BATCH_VALUES`` runs a
    write, each slot freed once."""
    store = await open_store(layout="split")
    uids = [f"r-{i:04d}" for i in range(1_000)]
    for start in range(0, len(uids), 100):
        answers = await asyncio.gather(*(admit(store, uid) for uid in uids[start : start + 100]))
        assert answers == [None] * 100
    repairs = [Repair("", uid, None) for uid in uids]
    await store.repair_entry(TENANT, repairs, limits=LIMITS, now=NOW + 60)
    book = await whole(store)
    assert book.active_runs == 0 and book.reserved_tokens == 0
    assert sum(bool(entry.ended) for entry in book.runs.values()) == 1_000
    assert store.largest_batch <= MAX_BATCH
