"""Read a run's committed events straight from JetStream (what the checkpoint really holds)."""

from __future__ import annotations

import asyncio

from agentrun.bus import Bus, BusSettings
from agentrun.ledger import Book, LedgerStore
from agentrun.protocol import RunEvent


def read_events(nats_url: str, namespace: str, name: str) -> list[RunEvent]:
    """Every event on the run's subject, oldest first."""

    async def read() -> list[RunEvent]:
        bus = await Bus.connect(BusSettings(url=nats_url), name="e2e-reader")
        try:
            return await bus.read_events(namespace, name)
        finally:
            await bus.close()

    return asyncio.run(read())


def turn_numbers(events: list[RunEvent]) -> list[int]:
    """The turn index of every committed turn event, in commit order."""
    return [e.record.turn for e in events if e.kind == "turn" and e.record is not None]


def read_book(nats_url: str, tenant: str) -> Book | None:
    """The tenant's ledger entry as stored in JetStream KV now."""

    async def read() -> Book | None:
        bus = await Bus.connect(BusSettings(url=nats_url), name="e2e-ledger-reader")
        try:
            return await (await LedgerStore.open(bus.js)).read(tenant)
        finally:
            await bus.close()

    return asyncio.run(read())
