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
from agentrun.settings import ProcessSettings
from agentrun_dev import natsserver


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


async def test_a_service_given_several_servers_connects_to_one_that_answers(
    nats_server: natsserver.NatsServer,
) -> None:
    """``AGENTRUN_NATS_URL`` as a comma-separated list (a NATS cluster): the first server down,
    the process starts on the next."""
    refused = refused_url()
    urls = f"{refused} , {nats_server.url}"
    assert natsclient.server_urls(urls) == [refused, nats_server.url]
    nc = await asyncio.wait_for(
        natsclient.connect_nats(urls, name="svc", auth=nats_server.auth("operator")), 20
    )
    try:
        assert nc.connected_url is not None
        assert nc.connected_url.port == int(nats_server.url.rsplit(":", 1)[1])
    finally:
        await nc.close()


def test_a_server_list_is_checked_for_passwords_in_every_url() -> None:
    with pytest.raises(ValueError, match="AGENTRUN_NATS_URL holds credentials"):
        ProcessSettings(nats_url="tls://a:4222,tls://user:secret@b:4222")
    with pytest.raises(ValueError, match="no NATS server URL"):
        natsclient.server_urls(" , ")
