"""No value the ledger writes grows without bound with a tenant's activity: the book entry holds
at most ``MAX_ACTIVE_RUNS`` active runs and the admission queue at most ``MAX_QUEUED_RUNS``
runs, each far below nats-server's max payload (1 MiB by default) with every name at its
longest; one more run waits (book) or ends ``checkpoint_failed`` naming the cause (queue), for
that run only. Checked at the claimed scale against the real server."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from decimal import Decimal
from typing import Any

import nats
import pytest
from kube_support import FakeKube
from nats.aio.client import Client as NATS

from agentrun import kernel
from agentrun.ledger import (
    Active,
    Book,
    BudgetRefusal,
    Hold,
    LedgerStore,
    QueuedRun,
    QueueFull,
    TenantLimits,
    codec,
)
from agentrun.ledger.entries import CONCURRENCY_LIMIT, MAX_ACTIVE_RUNS, Waiter
from agentrun.ledger.store import MAX_QUEUED_RUNS, book_key, queue_key
from agentrun.operator.admission.lookup import RunConfigs
from agentrun.operator.admission.pump import PumpDeps, QueuePump
from agentrun.operator.admission.queue import QueueBoard
from agentrun.operator.admission.queuestatus import QueueStatus
from agentrun.operator.platform import events as recorder
from agentrun.operator.platform.events import EventRecorder
from agentrun.operator.runs import RunKey
from agentrun_dev import natsserver

NOW = 1.8e9
NAMESPACE = "n" * 63  # the longest namespace name
NAME = "r" * 253  # the longest object name
TENANT = "t" * 60
FAR_BELOW = 512 * 1024
"""Half of nats-server's default max payload: what "far below" means here."""


@pytest.fixture
async def client(nats_server: natsserver.NatsServer) -> AsyncIterator[NATS]:
    nc = await nats.connect(**nats_server.client_options())
    yield nc
    await nc.close()


async def open_store(client: NATS) -> LedgerStore:
    return await LedgerStore.open(client.jetstream(), bucket="AGENTRUN_LEDGER_BOUNDS_TEST")


def full_book() -> Book:
    """A tenant entry at the cap: every active run with a hold (its call answered) and a
    waiting call, every number and name at its longest."""
    book = Book.new(
        TENANT,
        TenantLimits(10**12, Decimal("123456.789"), 1e9, 86_400.0, None),
        now=NOW,
    )
    for _ in range(MAX_ACTIVE_RUNS):
        uid = str(uuid.uuid4())
        book.active[uid] = Active(NAMESPACE, NAME, NOW, 12_345, 123_456_789, Decimal("1234.5678"))
        book.holds[f"{uid}:12345"] = Hold(
            uid, 12_345, 1_234_567, Decimal("12.3456789"), NOW + 60, "0123456789abcdef",
            NAMESPACE, NAME, 123_456, Decimal("1.23456789"),
        )  # fmt: skip
        book.waiting[f"{uid}:12346"] = Waiter(NOW, 1_234_567, Decimal("12.3456789"), NOW + 10)
    return book


def test_a_tenant_entry_at_the_active_run_cap_stays_far_below_the_max_payload() -> None:
    size = len(codec.encode_book(full_book()))
    assert size < FAR_BELOW, size


def test_one_run_over_the_cap_waits_for_a_slot_whatever_max_concurrent_runs_says() -> None:
    book = full_book()
    refusal = book.admit("one-more", NAMESPACE, NAME, now=NOW)
    assert isinstance(refusal, BudgetRefusal) and refusal.reason == CONCURRENCY_LIMIT
    assert "the most one tenant's ledger entry holds" in refusal.message
    assert len(book.active) == MAX_ACTIVE_RUNS


async def test_the_full_entry_is_written_and_read_back_by_the_real_server(client: NATS) -> None:
    store = await open_store(client)
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    book = full_book()
    await store.kv.put(book_key(tenant), codec.encode_book(book))
    again = await store.read(tenant)
    assert again is not None and len(again.active) == MAX_ACTIVE_RUNS


def queued(index: int) -> QueuedRun:
    return QueuedRun(str(uuid.uuid4()), NAMESPACE, NAME, NOW + index * 0.001)


async def test_a_full_queue_refuses_only_the_run_that_does_not_fit(client: NATS) -> None:
    store = await open_store(client)
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    runs = [queued(i) for i in range(MAX_QUEUED_RUNS)]
    await store.change_queue(tenant, lambda queue: queue.extend(runs))
    entry = await store.kv.get(queue_key(tenant))
    assert entry.value is not None and len(entry.value) < FAR_BELOW, len(entry.value or b"")
    # in one group-committed write: a run already queued, and one more that does not fit
    again, extra = await asyncio.gather(
        store.enqueue(tenant, runs[10]), store.enqueue(tenant, queued(10**6)),
        return_exceptions=True,
    )  # fmt: skip
    assert again == 11
    assert isinstance(extra, QueueFull) and "admission queue is full (1000 runs wait)" in str(extra)
    assert len(await store.queue(tenant)) == MAX_QUEUED_RUNS


class Ends:
    """The pump's status writer and end counter, recording what they are told."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.counted: list[kernel.RunState] = []

    def submit(
        self,
        key: RunKey,
        body: dict[str, Any],
        *,
        seq: int,
        terminal: bool,
        on_end: Callable[[], None] | None = None,
    ) -> None:
        self.bodies.append(body)
        if on_end is not None:
            on_end()  # the write that ended the object

    def count_end(self, uid: str, state: kernel.RunState, *, tenant: str) -> bool:
        self.counted.append(state)
        return True


class Policy:
    name = "overflowing"


async def test_a_run_the_full_queue_refuses_ends_checkpoint_failed_naming_the_cause(
    client: NATS,
) -> None:
    store = await open_store(client)
    await store.change_queue(
        Policy.name, lambda queue: queue.extend(queued(i) for i in range(MAX_QUEUED_RUNS))
    )
    ends = Ends()
    deps: Any = dict.fromkeys(("tenants", "settlement", "storage"))
    # the run's config builder, only to forget the run it never built for (no reads here)
    deps["configs"] = RunConfigs(None, known_tools={}, tool_specs=lambda names: [], servers=None)  # type: ignore[arg-type]
    api = FakeKube()
    events = EventRecorder(api, throttle=recorder.standard_throttle())
    shown = QueueStatus(ends, ends, events, time.time)
    pump = QueuePump(
        PumpDeps(
            store=store, runs=ends, shown=shown, board=QueueBoard(), events=events, api=api, **deps
        )  # type: ignore[arg-type]
    )
    key = RunKey("ns", "late", str(uuid.uuid4()))
    await pump.enqueue_run(key, Policy(), generation=1, created=NOW + 99)  # type: ignore[arg-type]
    assert [s.phase for s in ends.counted] == [kernel.Phase.CHECKPOINT_FAILED]
    assert "admission queue is full" in ends.bodies[0]["message"]
    assert len(await store.queue(Policy.name)) == MAX_QUEUED_RUNS
    await store.change_queue(Policy.name, lambda queue: queue.clear())
