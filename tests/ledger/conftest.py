"""Fixtures of the ledger's tests against a real nats-server: ``store``, a ``LedgerStore`` on a
bucket of its own whose clock reads ``NOW``, and ``tenant``, a fresh tenant name per test."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import nats
import pytest

from agentrun.ledger import LedgerStore
from agentrun_dev import natsserver

NOW = 1_700_000_000.0
"""The ``store``'s clock (epoch seconds)."""
TEST_BUCKET = "AGENTRUN_LEDGER_TEST"
"""Not the stack's bucket: an e2e operator sweeping in this session must not touch these books."""


@pytest.fixture
async def store(nats_server: natsserver.NatsServer) -> AsyncIterator[LedgerStore]:
    client = await nats.connect(**nats_server.client_options())
    try:
        yield await LedgerStore.open(client.jetstream(), bucket=TEST_BUCKET, clock=lambda: NOW)
    finally:
        await client.close()


@pytest.fixture
def tenant() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"
