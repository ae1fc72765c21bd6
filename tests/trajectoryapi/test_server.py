"""The trajectory API's server, in process on a real aiohttp server (as ``main`` runs it, with
``handler_cancellation``): a follow whose client left gives its NATS connection up, a quiet
follow sends keep-alive lines, a whole read streams the trajectory object, and reads beyond
the server's share wait, then get 429. Authentication and the access review are the pure
``access`` rules, tested apart; here they let the request through, and NATS is a stand-in."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import urllib.parse
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from agentrun import kernel
from agentrun.protocol import RunEvent
from agentrun.trajectoryapi import access, server

CONSUMER = "reader-0123456789abcdef"
PATH = "/apis/trajectory.agentrun.dev/v1alpha1/namespaces/team-a/agentruntrajectories/r1"
PATH_B = "/apis/trajectory.agentrun.dev/v1alpha1/namespaces/team-b/agentruntrajectories/r1"


class FakeBus:
    """What the server reads: ``follow_payloads`` yields ``events`` (``repeat`` times over,
    counting each in ``pulled``) then waits for ever."""

    def __init__(self, events: list[RunEvent], *, repeat: int = 1) -> None:
        self.events = events
        self.repeat = repeat
        self.pulled = 0

    async def last_sequence(self, namespace: str, name: str, *, any_replica: bool = False) -> int:
        assert any_replica  # a reader's permission allows the direct get only
        return len(self.events) * self.repeat

    async def follow_payloads(
        self, namespace: str, name: str, *, consumer: str | None = None
    ) -> AsyncIterator[tuple[int, bytes]]:
        assert consumer == CONSUMER  # the one name the request's credential may create
        payloads = [event.encode() for event in self.events]
        for seq in range(1, len(payloads) * self.repeat + 1):
            self.pulled += 1
            yield seq, payloads[(seq - 1) % len(payloads)]
        await asyncio.Event().wait()


class Harness:
    def __init__(self, events: list[RunEvent]) -> None:
        self.events = events
        self.repeat = 1
        self.buses: list[FakeBus] = []
        self.open = 0
        self.opened = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.stalled: set[str] = set()
        """Namespaces whose reads wait for NATS until the gate opens."""

    @contextlib.asynccontextmanager
    async def bus(self, namespace: str) -> AsyncIterator[Any]:
        if not self.stalled or namespace in self.stalled:
            await self.gate.wait()
        self.open += 1
        self.opened += 1
        try:
            bus = FakeBus(self.events, repeat=self.repeat)
            self.buses.append(bus)
            yield server.ReaderBus(bus, CONSUMER)  # type: ignore[arg-type]
        finally:
            self.open -= 1


@pytest.fixture
def max_reads() -> int:
    """Whole reads the server serves at once (a test may parametrize it)."""
    return 1


@pytest.fixture
async def serving(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, max_reads: int
) -> AsyncIterator[Any]:
    harness = Harness([])
    monkeypatch.setattr(server, "MAX_READS", max_reads)
    monkeypatch.setattr(server, "READ_TIMEOUT", 5.0)
    monkeypatch.setattr(server, "KEEPALIVE", 0.1)
    monkeypatch.setattr(server, "SLOT_WAIT", 0.3)
    monkeypatch.setattr(access, "authenticate", lambda *a, **k: access.User("alice", (), {}))

    async def allowed(self: server.Server, *_: object) -> dict[str, Any]:
        return {"allowed": True}

    monkeypatch.setattr(server.Server, "_review", allowed)
    monkeypatch.setattr(server.Server, "_bus", lambda self, namespace: harness.bus(namespace))
    app_server = server.Server(proxy=None, api=None, reader=None, scratch=tmp_path)  # type: ignore[arg-type]
    runner = web.AppRunner(app_server.app(), handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield harness, f"http://127.0.0.1:{port}{PATH}", f"http://127.0.0.1:{port}{PATH_B}"
    finally:
        await runner.cleanup()


async def test_a_follow_whose_client_left_gives_its_connection_up(serving: Any) -> None:
    harness, url, _ = serving
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, params={"follow": "true"}) as answer,
    ):
        assert answer.status == 200
        assert await answer.content.readline() == b"\n"  # a keep-alive line, not an event
        assert harness.open == 1
    for _ in range(50):  # the client is gone: the handler ends and closes its connection
        if harness.open == 0:
            break
        await asyncio.sleep(0.1)
    assert harness.open == 0


async def test_a_whole_read_is_the_trajectory_object(serving: Any) -> None:
    harness, url, _ = serving
    async with aiohttp.ClientSession() as session, session.get(url) as answer:
        assert answer.status == 200
        body = json.loads(await answer.read())
    assert body == access.trajectory("team-a", "r1", [])
    assert harness.open == 0


async def test_reads_beyond_the_servers_share_wait_then_get_429(serving: Any) -> None:
    harness, url, _ = serving
    harness.gate.clear()  # the first read holds the one slot, waiting for NATS
    async with aiohttp.ClientSession() as session:
        first = asyncio.create_task(session.get(url))
        await asyncio.sleep(0.1)
        async with session.get(url) as second:
            assert second.status == 429
            assert (await second.json())["reason"] == "TooManyRequests"
        harness.gate.set()
        async with await first as answer:
            assert answer.status == 200


@pytest.mark.parametrize("max_reads", [4])
async def test_one_namespace_holding_reads_leaves_another_namespace_its_read(
    serving: Any,
) -> None:
    harness, url, other = serving
    harness.gate.clear()
    harness.stalled = {"team-a"}  # team-a's reads hang (a slow client or a slow NATS)
    async with aiohttp.ClientSession() as session:
        held = [asyncio.create_task(session.get(url)) for _ in range(server.MAX_READS)]
        await asyncio.sleep(0.1)
        async with session.get(other) as answer:
            assert answer.status == 200, await answer.text()
        harness.gate.set()
        for task in held:
            (await task).release()


async def test_one_namespace_holding_follows_leaves_another_namespace_its_follow(
    serving: Any,
) -> None:
    _, url, other = serving
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        held = []
        for _ in range(server.MAX_FOLLOWS):  # one namespace asks for every follow there is
            answer = await session.get(url, params={"follow": "true"})
            held.append(answer)
        assert any(answer.status == 200 for answer in held)
        async with session.get(other, params={"follow": "true"}) as answer:
            assert answer.status == 200, await answer.text()
        for answer in held:
            answer.release()


BIG = RunEvent("stop", "uid", kernel.RunSummary(kernel.Phase.RUNNING, message="m" * 262_144))
"""An event of 256 KiB."""


async def stalled_client(url: str) -> socket.socket:
    """A client that asks for ``url`` and then reads nothing (a small receive buffer)."""
    parts = urllib.parse.urlsplit(url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16_384)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (parts.hostname, parts.port))
    target = f"{parts.path}?{parts.query}" if parts.query else parts.path
    await loop.sock_sendall(sock, f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return sock


async def settled(count: Callable[[], int]) -> int:
    """``count()`` once it has not changed for half a second (5 s at most)."""
    last = -1
    for _ in range(10):
        await asyncio.sleep(0.5)
        if (now := count()) == last:
            break
        last = now
    return last


@pytest.mark.parametrize("follow", [False, True], ids=["whole read", "follow"])
async def test_a_read_whose_client_takes_nothing_holds_a_few_events_not_the_run(
    serving: Any, follow: bool
) -> None:
    harness, url, _ = serving
    harness.events, harness.repeat = [BIG], 200  # a run of 50 MiB
    sock = await stalled_client(f"{url}?follow=true" if follow else url)
    try:
        pulled = await settled(lambda: sum(bus.pulled for bus in harness.buses))
    finally:
        sock.close()
    # what the sockets' buffers take (about 4 MiB) and FOLLOW_BUFFER, never the run
    assert 0 < pulled <= 40


async def test_a_whole_read_the_store_stops_answering_is_cut_not_finished(
    serving: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness, url, _ = serving
    harness.events = [BIG]
    monkeypatch.setattr(FakeBus, "last_sequence", lambda *a, **k: asyncio.sleep(0, result=2))
    monkeypatch.setattr(server, "ANSWER_TIMEOUT", 0.5)  # the second event never comes
    async with aiohttp.ClientSession() as session, session.get(url) as answer:
        assert answer.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await answer.read()
    assert harness.open == 0
