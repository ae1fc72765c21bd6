"""Credentials rotate without losing a turn: a worker's creds file is replaced (as a Kubernetes
Secret volume is updated in place), the old user is revoked (the account's revocation list,
the server reloaded), the server closes the old user's connection, and the worker's connection
comes back with the new file and goes on consuming; the old credentials are refused from then
on."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.aio.msg import Msg

from agentrun import natsclient, protocol
from agentrun.bus import Bus, BusSettings
from agentrun.natsauth import Role, creds
from agentrun.protocol import TurnRequest
from agentrun_dev import components, natsserver


@pytest.fixture
def server(tmp_path: Path, devenv_launch: components.Launch) -> Iterator[natsserver.NatsServer]:
    running = natsserver.start_nats_server(tmp_path / "nats", launch=devenv_launch)
    yield running
    running.stop()


def replace_file(path: Path, text: str) -> None:
    """Swap the file's content in one rename, as the kubelet swaps a Secret volume."""
    staged = path.with_suffix(".new")
    staged.write_text(text)
    os.replace(staged, path)


async def test_a_rotated_and_revoked_worker_credential_loses_no_turn(
    server: natsserver.NatsServer, tmp_path: Path
) -> None:
    authority = server.authority()
    mounted = tmp_path / "worker.creds"
    old = authority.mint(Role.WORKER, name="worker-old")
    mounted.write_text(old.text())
    ca = server.auth().ca_file  # type: ignore[union-attr]
    operator = await Bus.connect(
        BusSettings(url=server.url, auth=server.auth("operator")), name="operator"
    )
    worker = await Bus.connect(
        BusSettings(url=server.url, auth=natsclient.NatsAuth(mounted, ca)),
        name="worker",
        provision=False,
    )
    handled: list[int] = []

    async def handle(msg: Msg) -> None:
        handled.append(protocol.decode_turn_request(msg.data).turn)
        await msg.ack()

    stopping = asyncio.Event()
    loop = asyncio.create_task(worker.consume(worker.turn_subscription, handle, stopping=stopping))
    try:
        for turn in (0, 1):
            await operator.publish_turn(TurnRequest("uid", "ns", "run", turn, 1), tenant="t")
        await until(lambda: handled == [0, 1])

        new = authority.mint(Role.WORKER, name="worker-new")
        replace_file(mounted, new.text())
        time.sleep(1.1)  # a revocation covers JWTs issued up to its second
        server.revoke(old.public)
        await until(lambda: natsclient.reconnections(worker.nc) >= 1)
        for turn in (2, 3):
            await operator.publish_turn(TurnRequest("uid", "ns", "run", turn, 1), tenant="t")
        await until(lambda: handled == [0, 1, 2, 3])
        assert creds.read(mounted).public == new.public

        stale = tmp_path / "stale.creds"
        stale.write_text(old.text())
        options = natsclient.connect_options(natsclient.NatsAuth(stale, ca))
        with pytest.raises(nats.errors.Error, match=r"(?i)authorization violation|revoked"):
            await nats.connect(server.url, allow_reconnect=False, **options)
    finally:
        stopping.set()
        with contextlib.suppress(Exception):
            await loop
        await worker.close()
        await operator.close()


async def until(predicate: object, *, timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():  # type: ignore[operator]
            await asyncio.sleep(0.05)
