"""Fixtures of the admission tests that meet the real nats-server's ledger."""

from __future__ import annotations

from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client as NATS

from agentrun_dev import natsserver


@pytest.fixture
async def client(nats_server: natsserver.NatsServer) -> AsyncIterator[NATS]:
    """A client of the session's nats-server, closed after the test."""
    nc = await nats.connect(**nats_server.client_options())
    yield nc
    await nc.close()
