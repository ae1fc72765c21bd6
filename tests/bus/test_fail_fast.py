"""The CLI's first NATS connect fails fast and quietly: a refused server costs one error
within a few seconds, not a retry loop logging each try (the services keep retrying)."""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import nats.errors
import pytest

from agentrun import natsclient


def refused_url() -> str:
    """A local port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"nats://127.0.0.1:{port}"


async def test_a_fail_fast_connect_to_a_refused_server_raises_once_and_logs_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=natsclient.__name__)
    started = time.monotonic()
    with pytest.raises(nats.errors.NoServersError):
        await natsclient.connect_nats(refused_url(), name="cli", fail_fast=True)
    assert time.monotonic() - started < 4.5  # the services' connect would retry for ever
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_a_service_connect_to_a_refused_server_keeps_trying() -> None:
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(natsclient.connect_nats(refused_url(), name="svc"), 1.5)
