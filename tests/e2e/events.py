"""Read a run's committed events straight from JetStream (what the checkpoint really holds)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import nats
import nats.js.errors

from agentrun import protocol
from agentrun.bus import Bus, BusSettings
from agentrun.ledger import Book, LedgerStore
from agentrun.protocol import RunEvent
from agentrun_dev.natsserver import NatsServer


def read_events(server: NatsServer, namespace: str, name: str) -> list[RunEvent]:
    """Every event on the run's subject, oldest first."""

    async def read() -> list[RunEvent]:
        bus = await Bus.connect(BusSettings(url=server.url, auth=server.auth()), name="e2e-reader")
        try:
            return await bus.read_events(namespace, name)
        finally:
            await bus.close()

    return asyncio.run(read())


def turn_numbers(events: list[RunEvent]) -> list[int]:
    """The turn index of every committed turn event, in commit order."""
    return [e.record.turn for e in events if e.kind == "turn" and e.record is not None]


def read_book(server: NatsServer, tenant: str) -> Book | None:
    """The tenant's ledger entry as stored in JetStream KV now."""

    async def read() -> Book | None:
        bus = await Bus.connect(
            BusSettings(url=server.url, auth=server.auth()), name="e2e-ledger-reader"
        )
        try:
            return await (await LedgerStore.open(bus.js)).read(tenant)
        finally:
            await bus.close()

    return asyncio.run(read())


def settled_book(
    server: NatsServer,
    tenant: str,
    *,
    timeout: float = 15,
    poll: float = 0.2,
    read: Callable[[Any, str], Book | None] = read_book,
) -> Book:
    """The tenant's ledger entry once no run is active in it and it holds nothing: a run's
    last settlement and its close land just after its terminal status (the worker settles
    after its commit, the operator closes the run around the status it writes), so a book
    read as soon as the runs ended may not hold them yet. "Holds nothing" by its totals too
    (``reserved_tokens``, ``reserved_cost``): a split ledger is read as its totals, then its
    run entries, so a settlement landing between the two reads shows the totals' hold beside
    entries without it. Read with ``read`` every ``poll`` seconds; raises AssertionError after
    ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while True:
        book = read(server, tenant)
        if book is not None and not (
            book.active
            or book.active_runs
            or book.holds
            or book.reserved_tokens
            or book.reserved_cost
        ):
            return book
        assert time.monotonic() < end, f"{tenant}: not settled in {timeout}s: {book}"
        time.sleep(poll)


def wait_answered_hold(
    server: NatsServer, tenant: str, namespace: str, name: str, *, timeout: float = 30
) -> None:
    """Poll the tenant's ledger entry until a hold of run ``namespace/name`` records that its
    model call answered: from then on the turn is in its tool phase, and the call is billed
    whatever happens to the turn. Raises AssertionError after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while True:
        book = read_book(server, tenant)
        holds = [] if book is None else list(book.holds.values())
        if any(h.namespace == namespace and h.name == name and h.recorded for h in holds):
            return
        assert time.monotonic() < end, f"{namespace}/{name}: no answered hold in {timeout}s"
        time.sleep(0.05)


def delete_queued_turns(server: NatsServer, tenant: str) -> int:
    """Delete every TurnRequest of ``tenant`` still in the work queue (JetStream delete msg,
    as an operator of the server could); returns how many were deleted."""

    async def delete() -> int:
        bus = await Bus.connect(
            BusSettings(url=server.url, auth=server.auth()), name="e2e-turn-deleter"
        )
        deleted = 0
        try:
            while True:
                try:
                    raw = await bus.js._jsm.get_last_msg(
                        protocol.STREAM_TURNS, protocol.turn_subject(tenant)
                    )
                except nats.js.errors.NotFoundError:
                    return deleted
                assert raw.seq is not None
                await bus.js._jsm.delete_msg(protocol.STREAM_TURNS, raw.seq)
                deleted += 1
        finally:
            await bus.close()

    return asyncio.run(delete())


def strand_queued_turn(server: NatsServer, tenant: str) -> int:
    """Move the workers' consumer past ``tenant``'s last TurnRequest, which the stream keeps:
    its ack floor at the stream's last message, nothing pending, the state nats-server #4736
    shows after a restart (``$JS.API.CONSUMER.RESET``, from nats-server 2.14, as an operator of
    the server could). Returns that TurnRequest's stream sequence."""

    async def strand() -> int:
        nc = await nats.connect(**server.client_options())
        try:
            js = nc.jetstream()
            raw = await js._jsm.get_last_msg(protocol.STREAM_TURNS, protocol.turn_subject(tenant))
            last = (await js.stream_info(protocol.STREAM_TURNS)).state.last_seq
            consumer = f"{protocol.STREAM_TURNS}.{protocol.WORKERS_CONSUMER}"
            body = json.dumps({"seq": last + 1}).encode()
            answer = json.loads((await nc.request(f"$JS.API.CONSUMER.RESET.{consumer}", body)).data)
            assert "error" not in answer, answer
            assert raw.seq is not None
            return raw.seq
        finally:
            await nc.close()

    return asyncio.run(strand())


def put_book_bytes(server: NatsServer, tenant: str, value: bytes) -> bytes:
    """Overwrite the tenant's ledger entry with ``value`` (e.g. bytes no ledger can decode);
    returns what it held before."""

    async def put() -> bytes:
        bus = await Bus.connect(
            BusSettings(url=server.url, auth=server.auth()), name="e2e-ledger-writer"
        )
        try:
            store = await LedgerStore.open(bus.js)
            before = await store.kv.get(f"book.{tenant}")
            await store.kv.put(f"book.{tenant}", value)
            return before.value or b""
        finally:
            await bus.close()

    return asyncio.run(put())


def purge_events(server: NatsServer, namespace: str, name: str) -> None:
    """Delete every event on the run's subject, as NATS data loss (or a purge by someone
    holding the server's keys) leaves it."""

    async def purge() -> None:
        bus = await Bus.connect(BusSettings(url=server.url, auth=server.auth()), name="e2e-purger")
        try:
            await bus.purge_run(namespace, name)
        finally:
            await bus.close()

    asyncio.run(purge())
