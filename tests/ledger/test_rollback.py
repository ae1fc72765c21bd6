"""A tenant's ``used`` cannot be erased by a writer of the ledger bucket (a worker's NATS
credential may write books): within a window ``used`` only grows, so the operator's sweep
holds a floor — what it read, and what the AgentTenant status it wrote says — and restores an
entry rolled back below it (or moved to a window that has not started), counting the rollback
and telling it as an Event. A legitimate new window is no rollback."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal

import nats
import pytest
from kube_support import FakeKube
from prometheus_client import REGISTRY

from agentrun.ledger import Book, LedgerStore, QueuedRun, TenantLimits, UsageFloor, codec
from agentrun.ledger.entries import ENDED_MEMORY
from agentrun.ledger.store import book_key
from agentrun.operator.admission.queue import QueueBoard
from agentrun.operator.admission.sweep import LedgerSweep, SweepDeps
from agentrun.operator.platform.conditions import rfc3339
from agentrun.operator.platform.events import EventRecorder, Throttle
from agentrun.operator.tenants.rebuild import RebuiltUsage
from agentrun.operator.tenants.registry import Tenants
from agentrun.operator.tenants.writer import TenantStatusWriter
from agentrun.protocol import RunEvent
from agentrun_dev import natsserver

HOUR = 3_600.0
T0 = 19_675 * 86_400.0 + 10 * HOUR  # inside a 24h window that started at T0 - 10h
WINDOW = T0 - 10 * HOUR


def entry(*, window: float = WINDOW, tokens: int = 0, cost: str = "0", wall: float = 0.0) -> Book:
    book = Book.new("t", TenantLimits(tokens=1_000), now=window)
    book.used_tokens, book.used_cost, book.used_wall = tokens, Decimal(cost), wall
    return book


FLOOR = UsageFloor(WINDOW, 525, Decimal("0.0525"), 12.0)


@pytest.mark.parametrize(
    "book",
    [
        entry(tokens=0, cost="0.0525", wall=12.0),
        entry(tokens=525, cost="0", wall=12.0),
        entry(tokens=525, cost="0.0525", wall=0.0),
        entry(window=WINDOW - 86_400.0, tokens=9_000, cost="1", wall=99.0),
        entry(window=WINDOW + 86_400.0),
    ],
    ids=["tokens-erased", "cost-erased", "wall-erased", "window-moved-back", "window-not-begun"],
)
def test_an_entry_below_its_floor_undercuts_it_and_is_restored(book: Book) -> None:
    assert book.undercuts(FLOOR, now=T0)
    book.restore(FLOOR, now=T0)
    assert not book.undercuts(FLOOR, now=T0)
    assert (book.window, book.used_tokens, book.used_cost, book.used_wall) == (
        WINDOW,
        525,
        Decimal("0.0525"),
        12.0,
    )


def test_an_entry_above_its_floor_or_in_a_new_window_is_no_rollback() -> None:
    assert not entry(tokens=600, cost="0.06", wall=12.0).undercuts(FLOOR, now=T0)
    later = T0 + 86_400.0
    fresh = entry(window=WINDOW + 86_400.0)  # rolled over: a new window starts at 0
    assert not fresh.undercuts(FLOOR, now=later)


def test_a_floor_rises_within_its_window_and_starts_again_in_the_next() -> None:
    floor = UsageFloor(WINDOW, 10, Decimal(1), 1.0)
    assert floor.raised(WINDOW, 5, Decimal(2), 0.0) == UsageFloor(WINDOW, 10, Decimal(2), 1.0)
    assert floor.raised(WINDOW - 1, 99, Decimal(9), 9.0) == floor
    assert floor.raised(WINDOW + 1, 0, Decimal(0), 0.0) == UsageFloor(WINDOW + 1)


class NoRuns:
    def is_tracked(self, uid: str) -> bool:
        return True

    async def end(self, *args: object) -> bool:
        raise AssertionError("the sweep ends no run here")


class NoEvents:
    async def last_event(self, namespace: str, name: str) -> RunEvent | None:
        return None


@pytest.fixture
async def store(nats_server: natsserver.NatsServer) -> AsyncIterator[LedgerStore]:
    client = await nats.connect(**nats_server.client_options())
    try:
        yield await LedgerStore.open(client.jetstream(), bucket=f"ROLLBACK_{uuid.uuid4().hex[:8]}")
    finally:
        await client.close()


def sweeper(
    store: LedgerStore, tenants: Tenants, api: FakeKube
) -> tuple[LedgerSweep, EventRecorder]:
    events = EventRecorder(api, throttle=Throttle(repeat_after=0, rate=1000, burst=1000))
    deps = SweepDeps(
        store=store,
        tenants=tenants,
        board=QueueBoard(),
        runs=NoRuns(),  # type: ignore[arg-type]
        events=NoEvents(),
        api=api,
        tenant_status=TenantStatusWriter(api, events=events),
    )
    return LedgerSweep(deps), events


def tenant_object(name: str, *, status: dict[str, object] | None = None) -> dict[str, object]:
    return {
        "metadata": {"name": name, "generation": 1},
        "spec": {"namespaces": [f"ns-{name}"], "budget": {"tokens": 100_000}},
        "status": status or {},
    }


async def charged(store: LedgerStore, tenant: str, *, tokens: int) -> None:
    """The tenant's entry, made by an admission, with ``tokens`` settled for one run."""
    limits = TenantLimits(tokens=100_000)
    run = QueuedRun("r1", f"ns-{tenant}", "r1", time.time())
    assert await store.admit_run(tenant, run, limits=limits, need=(0, Decimal(0))) is None
    await store._change(
        tenant,
        lambda b: b.settle("r1", turn=0, tokens=tokens, cost_usd=Decimal(0), now=time.time()),
    )


async def erase(store: LedgerStore, tenant: str) -> None:
    """What an attacker with a worker's credentials can do: write the book with used = 0."""
    book = await store.read(tenant)
    assert book is not None
    book.used_tokens = 0
    await store.kv.put(book_key(tenant), codec.encode_book(book))


def refused() -> float:
    labels = {"reason": "ledger_rollback"}
    return REGISTRY.get_sample_value("agentrun_messages_refused_total", labels) or 0.0


async def test_the_sweep_restores_used_erased_in_the_bucket(store: LedgerStore) -> None:
    tenant, api = f"t-{uuid.uuid4().hex[:8]}", FakeKube()
    tenants = Tenants(api)
    tenants.put(tenant_object(tenant))
    sweep, events = sweeper(store, tenants, api)
    await charged(store, tenant, tokens=525)
    await sweep.sweep()  # seen: 525
    await erase(store, tenant)
    before = refused()
    await sweep.sweep()
    book = await store.read(tenant)
    assert book is not None and book.used_tokens == 525
    assert refused() == before + 1
    await events.drain()
    assert [e["reason"] for e in api.events if e["reason"] == "LedgerRolledBack"] == [
        "LedgerRolledBack"
    ]
    await sweep.sweep()  # restored: nothing more to undo
    assert refused() == before + 1


async def test_a_fresh_operator_restores_from_the_agenttenant_status(store: LedgerStore) -> None:
    """Erased while no operator ran: the floor comes from the status the last one wrote."""
    tenant, api = f"t-{uuid.uuid4().hex[:8]}", FakeKube()
    await charged(store, tenant, tokens=525)
    book = await store.read(tenant)
    assert book is not None
    await erase(store, tenant)
    tenants = Tenants(api)
    status = {"windowStart": rfc3339(book.window), "budget": {"tokens": {"used": 525}}}
    tenants.put(tenant_object(tenant, status=status))
    sweep, _ = sweeper(store, tenants, api)
    await sweep.sweep()
    restored = await store.read(tenant)
    assert restored is not None and restored.used_tokens == 525


def test_a_malformed_status_gives_no_floor() -> None:
    tenants = Tenants(FakeKube())
    tenants.put(tenant_object("x", status={"windowStart": "yesterday"}))
    tenants.put(
        tenant_object(
            "y", status={"windowStart": rfc3339(0), "budget": {"tokens": {"used": "many"}}}
        )
    )
    assert tenants.seen == {}


async def test_the_sweep_makes_a_lost_book_again_with_the_runs_use_of_the_window(
    store: LedgerStore,
) -> None:
    """The bucket lost the book (NATS data wiped): the sweep makes it anew at once, its
    ``used`` rebuilt from the tenant's AgentRuns (``RebuiltUsage``), not from zero, and the
    AgentTenant status shows it; the next sweep sees no rollback in it."""
    tenant, api = f"t-{uuid.uuid4().hex[:8]}", FakeKube()
    tenants = Tenants(api)
    tenants.put(api.put("agenttenants", tenant_object(tenant)))
    now = time.time()
    for name, tokens in (("a", 300), ("b", 225)):
        status = {
            "tenant": tenant,
            "startTime": rfc3339(now - 5),
            "completionTime": rfc3339(now),
            "usage": {"totalTokens": tokens, "costUSD": "0.01", "wallSeconds": 2.0},
        }
        api.put("agentruns", {"metadata": {"name": name, "namespace": "ns"}, "status": status})
    store.rebuild = RebuiltUsage(api, tenants)
    sweep, _ = sweeper(store, tenants, api)
    before = refused()
    await sweep.sweep()
    book = await store.read(tenant)
    assert book is not None
    assert (book.used_tokens, book.used_cost, book.used_wall) == (525, Decimal("0.02"), 4.0)
    await sweep.sweep()
    assert refused() == before
    (written,) = [o for (kind, _, _), o in api.objects.items() if kind == "agenttenants"]
    assert written["status"]["budget"]["tokens"]["used"] == 525


def test_the_status_floor_carries_the_windows_end_from_its_reset_time() -> None:
    tenants = Tenants(FakeKube())
    status = {"windowStart": rfc3339(WINDOW), "resetTime": rfc3339(WINDOW + 3_600.0)}
    tenants.put(tenant_object("x", status=status))
    assert tenants.seen["x"] == UsageFloor(WINDOW, end=WINDOW + 3_600.0)
    tenants.put(tenant_object("y", status={"windowStart": rfc3339(WINDOW), "resetTime": 5}))
    tenants.put(tenant_object("z", status=status | {"resetTime": rfc3339(WINDOW)}))
    assert tenants.seen["y"] == tenants.seen["z"] == UsageFloor(WINDOW)  # end unknown


async def test_the_sweep_lets_an_ended_runs_memory_go_once_it_expired(store: LedgerStore) -> None:
    """A run that ended is remembered as ended (so an admission done again after an operator
    restart takes no slot); the sweep's full read lets that memory go once it expired, and
    with it the run's ledger value."""
    tenant, api = f"t-{uuid.uuid4().hex[:8]}", FakeKube()
    tenants = Tenants(api)
    tenants.put(tenant_object(tenant))
    sweep, _ = sweeper(store, tenants, api)
    await charged(store, tenant, tokens=525)
    assert await store.close_run(tenant, "r1", None, end=time.time())
    await sweep.sweep()
    book = await store.read(tenant)
    assert book is not None and book.has_ended("r1")  # not expired yet: kept
    later = time.time() + ENDED_MEMORY + 1
    sweep.clock = lambda: later
    sweep._read_whole.clear()  # the next sweep reads every run's entry
    await sweep.sweep()
    book = await store.read(tenant)
    assert book is not None and "r1" not in book.runs and book.active_runs == 0
