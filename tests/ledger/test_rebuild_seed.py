"""A book the operator makes because it does not exist (the bucket or the book was lost) is
seeded with what the tenant's window used (the store's ``rebuild`` hook); a book that exists
is never re-seeded, and a store without the hook (a worker's) makes no book."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from decimal import Decimal

import nats
import pytest
from clock_support import steady_clock

from agentrun.ledger import (
    Active,
    Book,
    LedgerStore,
    QueuedRun,
    Seed,
    TenantLimits,
    UsageFloor,
    window_start,
)
from agentrun.ledger.store import book_key
from agentrun_dev import natsserver

HOUR = 3_600.0
LIMITS = TenantLimits(tokens=10_000, window_seconds=HOUR)


class Rebuild:
    """Answers a fixed use for the window it is asked about, and counts the asks."""

    def __init__(self, tokens: int, cost: str, wall: float) -> None:
        self.use = (tokens, Decimal(cost), wall)
        self.asked: list[tuple[str, float, float]] = []

    async def __call__(self, tenant: str, window: float, end: float) -> Seed:
        self.asked.append((tenant, window, end))
        running = Active("ns", "running", window, -1, 200, Decimal("0.02"))
        return Seed(UsageFloor(window, *self.use, end=end), {"uid-running": running})


@pytest.fixture
async def client(nats_server: natsserver.NatsServer) -> AsyncIterator[nats.NATS]:
    conn = await nats.connect(**nats_server.client_options())
    yield conn
    await conn.close()


async def store_with(client: nats.NATS, rebuild: Rebuild | None) -> LedgerStore:
    bucket = f"SEED_{uuid.uuid4().hex[:8]}"
    # one hour-long window for the module however close to an hour's end it runs
    return await LedgerStore.open(
        client.jetstream(), bucket=bucket, rebuild=rebuild, clock=steady_clock
    )


def run(uid: str) -> QueuedRun:
    return QueuedRun(uid, "ns", uid, steady_clock())


async def test_an_admission_that_makes_the_book_seeds_the_windows_use(client: nats.NATS) -> None:
    rebuild = Rebuild(700, "0.07", 12.5)
    store = await store_with(client, rebuild)
    refusal = await store.admit_run("acme", run("r1"), limits=LIMITS, need=(0, Decimal(0)))
    assert refusal is None
    book = await store.read("acme")
    assert book is not None
    assert (book.used_tokens, book.used_cost, book.used_wall) == (700, Decimal("0.07"), 12.5)
    start = window_start(steady_clock(), HOUR)
    assert rebuild.asked == [("acme", start, start + HOUR)]
    assert sorted(book.active) == ["r1", "uid-running"]


async def test_a_book_that_exists_is_never_reseeded(client: nats.NATS) -> None:
    rebuild = Rebuild(700, "0", 0.0)
    store = await store_with(client, rebuild)
    await store.admit_run("acme", run("r1"), limits=LIMITS, need=(0, Decimal(0)))
    rebuild.use = (9_000, Decimal(0), 0.0)
    await store.admit_run("acme", run("r2"), limits=LIMITS, need=(0, Decimal(0)))
    await store.repair_entry("acme", [], limits=LIMITS)
    book = await store.read("acme")
    assert book is not None and book.used_tokens == 700
    assert len(rebuild.asked) == 1


async def test_the_sweeps_repair_makes_a_missing_book_seeded_too(client: nats.NATS) -> None:
    rebuild = Rebuild(42, "0", 0.0)
    store = await store_with(client, rebuild)
    await store.repair_entry("acme", [], limits=LIMITS)
    book = await store.read("acme")
    assert book is not None and (book.used_tokens, list(book.active)) == (42, ["uid-running"])


async def test_a_store_without_the_hook_makes_an_empty_book(client: nats.NATS) -> None:
    store = await store_with(client, None)
    await store.admit_run("acme", run("r1"), limits=LIMITS, need=(0, Decimal(0)))
    book = await store.read("acme")
    assert book is not None and book.used_tokens == 0


def test_a_seed_of_another_window_adds_nothing() -> None:
    book = Book.new("acme", LIMITS, now=10 * HOUR + 5)
    running = {"u": Active("ns", "r", 9 * HOUR, -1, 5, Decimal(0))}
    book.seed(Seed(UsageFloor(9 * HOUR, 500, Decimal(1), 1.0, end=10 * HOUR), running))
    assert (book.used_tokens, book.used_cost, book.used_wall, book.active) == (
        0,
        Decimal(0),
        0.0,
        {},
    )
    book.used_tokens = 800
    book.seed(Seed(UsageFloor(10 * HOUR, 500, Decimal(1), 1.0, end=11 * HOUR)))
    assert (book.used_tokens, book.used_cost, book.used_wall) == (800, Decimal(1), 1.0)


def test_a_seeded_running_run_is_charged_only_what_is_new_and_its_wall_clock_live() -> None:
    window = 10 * HOUR
    book = Book.new("acme", LIMITS, now=window + 600)
    mine = Active("ns", "mine", window - 300, -1, 200, Decimal("0.02"))  # began before it
    book.seed(Seed(UsageFloor(window, 200, Decimal("0.02"), 0.0, end=window + HOUR), {"u": mine}))
    book.admit("other", "ns", "other", now=window + 600)
    assert book.active["u"].since == window  # its wall clock is charged from the window's start
    assert mine.since == window - 300  # the seed is not changed: a retried write seeds again
    assert book.wall_used(window + 600) == 600.0
    assert book.settle("u", turn=3, tokens=260, cost_usd=Decimal("0.026"), now=window + 700) == (
        60,
        Decimal("0.006"),
    )
    assert book.used_tokens == 260
    assert book.close(
        "u", turn=3, tokens=260, cost_usd=Decimal("0.026"), end=window + 900, now=window + 900
    )
    assert book.used_wall == 900.0
    kept = Book.new("acme", LIMITS, now=window + 5)
    kept.admit("u", "ns", "mine", now=window + 5)
    kept.admit("v", "ns", "more", now=window + 5)
    kept.settle("v", turn=0, tokens=900, cost_usd=Decimal("0.09"), now=window + 5)
    more = Active("ns", "more", window, -1, 300, Decimal("0.03"))
    kept.seed(Seed(UsageFloor(window, 500, end=window + HOUR), {"u": mine, "v": more}))
    assert kept.active_runs == 2 and kept.active["u"].since == window + 5  # slots stay
    # charged at least what the seed counts for them (its floor holds that much of each)
    assert (kept.active["u"].tokens, kept.active["u"].cost_usd) == (200, Decimal("0.02"))
    assert (kept.active["v"].turn, kept.active["v"].tokens) == (0, 900)
    assert kept.settle("u", turn=0, tokens=260, cost_usd=Decimal("0.026"), now=window + 6) == (
        60,
        Decimal("0.006"),
    )


async def remove(store: LedgerStore, how: str, key: str) -> None:
    """Delete ``key`` (nats-py's ``delete``) or purge it (its purge marker, without the
    rollup nats-py's ``purge`` adds)."""
    if how == "delete":
        await store.kv.delete(key)
        return
    subject = f"$KV.{store.kv._name}.{key}"  # type: ignore[attr-defined]
    await store.kv._js.publish(subject, b"", headers={"KV-Operation": "PURGE"})  # type: ignore[attr-defined]


@pytest.mark.parametrize("how", ["delete", "purge"])
async def test_a_deleted_or_purged_book_is_made_again_and_seeded(
    client: nats.NATS, how: str
) -> None:
    """A key deleted or purged leaves a marker: the book is created over it (not refused as a
    lost compare-and-set forty times), by the store that knew it and by a fresh one. (A purge
    marker carries no rollup: the bucket refuses rollups, ``buckets.forbid_rollups``.)"""
    rebuild = Rebuild(300, "0", 0.0)
    store = await store_with(client, rebuild)
    await store.admit_run("acme", run("r1"), limits=LIMITS, need=(0, Decimal(0)))
    await remove(store, how, book_key("acme"))
    assert await store.read("acme") is None
    rebuild.use = (900, Decimal(0), 0.0)
    await store.repair_entry("acme", [], limits=LIMITS)
    book = await store.read("acme")
    assert book is not None and book.used_tokens == 900
    assert len(rebuild.asked) == 2
    await remove(store, how, book_key("acme"))
    fresh = await LedgerStore.open(client.jetstream(), bucket=store.kv._name, rebuild=rebuild)  # type: ignore[attr-defined]
    await fresh.admit_run("acme", run("r2"), limits=LIMITS, need=(0, Decimal(0)))
    again = await fresh.read("acme")
    assert again is not None and again.used_tokens == 900 and "r2" in again.active
