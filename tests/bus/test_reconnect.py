"""Every NATS connection of the runtime comes back after any disconnect and its pull
consumers resume: a connection reset, and a connection the server itself closes after a
protocol error (which nats-py, left to itself, treats as final).

The reset goes through the closed server the suite shares (TLS and credentials, as shipped).
The protocol error needs a plain-text server: the proxy writes garbage into the client's byte
stream, which TLS would turn into a failed TLS record instead of the server's ``-ERR``; the
reconnect path after ``-ERR`` does not depend on the transport."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import nats
import pytest
from nats.aio.msg import Msg
from nats.js import api

from agentrun import bus as bus_module
from agentrun.bus import Bus, BusSettings
from agentrun.ledger import LedgerStore, QueuedRun
from agentrun_dev import components, natsserver


class Proxy:
    """A TCP proxy in front of nats-server that can break the connections it carries."""

    def __init__(self, upstream_port: int, *, scheme: str = "nats") -> None:
        self.upstream_port = upstream_port
        self.scheme = scheme
        self.pairs: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = []
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"{self.scheme}://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self.pairs.append((writer, up_writer))
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(source, sink))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        with contextlib.suppress(Exception):
            sink.close()

    async def protocol_error(self) -> None:
        """Send the server garbage on every carried connection: it answers
        ``-ERR 'Unknown Protocol Operation'`` and closes the connection itself."""
        for _, upstream in self.pairs:
            upstream.write(b"BOGUS-OPERATION\r\n")
            with contextlib.suppress(Exception):
                await upstream.drain()
        self.pairs.clear()

    async def reset(self) -> None:
        """Cut every carried connection."""
        for client, upstream in self.pairs:
            for writer in (client, upstream):
                transport = writer.transport
                with contextlib.suppress(Exception):
                    transport.abort()
        self.pairs.clear()

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.reset()
        for task in list(self.tasks):
            task.cancel()


@pytest.fixture(scope="module")
def open_nats_server(
    tmp_path_factory: pytest.TempPathFactory, devenv_launch: components.Launch
) -> Iterator[natsserver.NatsServer]:
    """A plain-text server without auth, for the protocol-error fault only."""
    server = natsserver.start_nats_server(
        tmp_path_factory.mktemp("open-nats"), launch=devenv_launch, closed=False
    )
    yield server
    server.stop()


Fault = Callable[[Proxy], Awaitable[None]]
FAULTS: dict[str, Fault] = {
    "server-closes-after-protocol-error": Proxy.protocol_error,
    "connection-reset": Proxy.reset,
}


@pytest.fixture(params=FAULTS.keys())
async def broken(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Fault, Proxy, Any]]:
    """A fault, a proxy in front of the server it is tried on, and that server."""
    name = request.param
    fixture = "open_nats_server" if name == "server-closes-after-protocol-error" else "nats_server"
    server: natsserver.NatsServer = request.getfixturevalue(fixture)
    scheme, port = server.url.split("://")[0], int(server.url.rsplit(":", 1)[1])
    front = Proxy(port, scheme=scheme)
    await front.start()
    yield FAULTS[name], front, server
    await front.stop()


@pytest.fixture
async def proxy(open_nats_server: natsserver.NatsServer) -> AsyncIterator[Proxy]:
    port = int(open_nats_server.url.rsplit(":", 1)[1])
    front = Proxy(port)
    await front.start()
    yield front
    await front.stop()


async def wait_until(predicate: Callable[[], bool], *, timeout: float = 15.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.05)


async def test_a_pull_consumer_resumes_after_the_connection_breaks(
    broken: tuple[Fault, Proxy, natsserver.NatsServer],
) -> None:
    fault, proxy, nats_server = broken
    suffix = uuid.uuid4().hex[:8]
    stream, subject = f"RECONNECT_{suffix}", f"reconnect.{suffix}"
    bus = await Bus.connect(
        BusSettings(url=proxy.url, auth=nats_server.auth()), name="reconnect-test"
    )
    publisher = await nats.connect(**nats_server.client_options())
    js = publisher.jetstream()
    await js.add_stream(api.StreamConfig(name=stream, subjects=[subject]))
    seen: list[bytes] = []

    async def handle(msg: Msg) -> None:
        seen.append(msg.data)
        await msg.ack()

    async def subscribe() -> object:
        return await bus.js.pull_subscribe(subject, durable="reconnect", stream=stream)

    stopping = asyncio.Event()
    loop = asyncio.create_task(bus.consume(subscribe, handle, stopping=stopping))  # type: ignore[arg-type]
    try:
        await js.publish(subject, b"before")
        await wait_until(lambda: seen == [b"before"])
        await fault(proxy)
        await wait_until(lambda: bus_module.reconnections(bus.nc) >= 1)
        await js.publish(subject, b"after")
        await wait_until(lambda: seen == [b"before", b"after"])
        assert not bus.nc.is_closed
        info = await bus.js.stream_info(stream)
        assert info.state.messages == 2
    finally:
        stopping.set()
        await loop
        await bus.close()
        await js.delete_stream(stream)
        await publisher.close()


async def test_a_handler_that_raises_does_not_end_the_consumer(
    nats_server: natsserver.NatsServer,
) -> None:
    """An exception out of a handler (an ack lost with the connection, a bug) is logged and
    the loop goes on: the next message is handled, and the one that raised, not acked, comes
    again after the ack wait."""
    suffix = uuid.uuid4().hex[:8]
    stream, subject = f"RAISES_{suffix}", f"raises.{suffix}"
    bus = await Bus.connect(BusSettings(url=nats_server.url, auth=nats_server.auth()), name="t")
    js = bus.js
    await js.add_stream(api.StreamConfig(name=stream, subjects=[subject]))
    seen: list[bytes] = []

    async def handle(msg: Msg) -> None:
        seen.append(msg.data)
        if seen == [b"first"]:
            raise ConnectionError("the ack was lost")
        await msg.ack()

    async def subscribe() -> object:
        config = api.ConsumerConfig(ack_wait=1.0)
        return await js.pull_subscribe(subject, durable="raises", stream=stream, config=config)

    stopping = asyncio.Event()
    loop = asyncio.create_task(bus.consume(subscribe, handle, stopping=stopping))  # type: ignore[arg-type]
    try:
        await js.publish(subject, b"first")
        await js.publish(subject, b"second")
        await wait_until(lambda: seen == [b"first", b"second", b"first"])
        assert not loop.done()
    finally:
        stopping.set()
        await loop
        await js.delete_stream(stream)
        await bus.close()


async def test_the_ledger_connection_writes_again_after_the_connection_breaks(
    broken: tuple[Fault, Proxy, natsserver.NatsServer],
) -> None:
    fault, proxy, nats_server = broken
    nc = await bus_module.connect_nats(
        proxy.url, name="reconnect-ledger-test", auth=nats_server.auth()
    )
    store = await LedgerStore.open(nc.jetstream(), bucket="AGENTRUN_LEDGER_RECONNECT_TEST")
    tenant = f"t-{uuid.uuid4().hex[:8]}"

    first, second = (QueuedRun(f"run-{i}", "ns", f"run-{i}", float(i)) for i in (1, 2))
    try:
        assert await store.enqueue(tenant, first) == 1
        await fault(proxy)
        await wait_until(lambda: bus_module.reconnections(nc) >= 1)
        assert await store.enqueue(tenant, second) == 2  # a compare-and-set after reconnecting
        assert [run.uid for run in await store.queue(tenant)] == ["run-1", "run-2"]
    finally:
        await nc.close()


async def test_plain_nats_py_gives_up_after_the_server_closes_on_a_protocol_error(
    proxy: Proxy,
) -> None:
    """The fault is real: a client made the nats-py default way stays closed for good."""
    closed = asyncio.Event()

    async def on_closed() -> None:
        closed.set()

    nc = await nats.connect(proxy.url, max_reconnect_attempts=-1, closed_cb=on_closed)
    try:
        await proxy.protocol_error()
        async with asyncio.timeout(10):
            await closed.wait()
        assert nc.is_closed
    finally:
        with contextlib.suppress(Exception):
            await nc.close()
