"""A stopping process closes its NATS connections within a bound, and a pull loop that lost
its consumer leaves no subscription behind.

Found in CI: two workers given SIGTERM after the NATS store was lost and made again took their
whole 20 s stop timeout and were killed, though nothing was in flight. nats-py drains a
connection by waiting for every subscription's queue to be marked done; a pull subscription
that once found a late message waiting takes it without marking it, so the drain waits for its
timeout (30 s by default). The pull loop also dropped its subscription after a failed fetch
without unsubscribing it, so every failure (a stream lost, a server restarting) left one more
registered on the connection and its interest on the server.

On the suite's closed nats-server (TLS, credentials)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
import uuid

from nats.aio.msg import Msg
from nats.js import api

from agentrun import natsclient
from agentrun.bus import Bus, BusSettings
from agentrun_dev import natsserver


def subscriptions(server: natsserver.NatsServer, name: str) -> int:
    """Subscriptions the server holds for the connection named ``name`` (``/connz``)."""
    with urllib.request.urlopen(f"{server.monitor_url}/connz?subs=1", timeout=5) as answer:
        connz = json.load(answer)
    found = [c for c in connz["connections"] if c.get("name") == name]
    assert len(found) == 1, [c.get("name") for c in connz["connections"]]
    return int(found[0]["subscriptions"])


async def test_close_returns_within_its_bound_though_a_subscription_never_drains(
    nats_server: natsserver.NatsServer,
) -> None:
    """A message left unconsumed in a subscription's queue holds nats-py's drain until its
    timeout; ``Bus.close`` returns within ``DRAIN_SECONDS`` (plus a flush), not nats-py's 30 s."""
    bus = await Bus.connect(
        BusSettings(url=nats_server.url, auth=nats_server.auth()), name="close-bound"
    )
    subject = f"agentrun.test.drain.{uuid.uuid4().hex[:8]}"
    await bus.nc.subscribe(subject)  # no callback: its messages wait for next_msg
    await bus.nc.publish(subject, b"never taken")
    await bus.nc.flush()
    started = time.monotonic()
    await bus.close()
    took = time.monotonic() - started
    assert bus.nc.is_closed
    assert natsclient.DRAIN_SECONDS - 1 <= took < natsclient.DRAIN_SECONDS + 3, took


async def test_closing_a_connection_that_is_reconnecting_closes_it(
    nats_server: natsserver.NatsServer,
) -> None:
    """nats-py refuses to drain a connection while it reconnects; ``close_nats`` closes it."""
    nc = await natsclient.connect_nats(
        nats_server.url, name="close-reconnecting", auth=nats_server.auth()
    )
    nc._status = nc.RECONNECTING  # as it is between a lost server and the next one
    await natsclient.close_nats(nc)
    assert nc.is_closed
    await natsclient.close_nats(nc)  # closed already: nothing to do, nothing raised


async def test_a_pull_loop_whose_consumer_is_gone_leaves_no_subscription_behind(
    nats_server: natsserver.NatsServer,
) -> None:
    """Each failed fetch (here: the stream deleted under the loop, on a bus that provisions
    nothing) unsubscribes the subscription it gives up; once the stream is back the loop
    consumes again on one subscription."""
    name = f"pull-leak-{uuid.uuid4().hex[:8]}"
    bus = await Bus.connect(
        BusSettings(url=nats_server.url, auth=nats_server.auth()), name=name, provision=False
    )
    stream, subject = f"LEAK_{uuid.uuid4().hex[:8]}", f"agentrun.test.leak.{uuid.uuid4().hex[:8]}"
    config = api.StreamConfig(name=stream, subjects=[subject])
    await bus.js.add_stream(config)
    seen: list[bytes] = []

    async def handle(msg: Msg) -> None:
        seen.append(msg.data)
        await msg.ack()

    async def subscribe() -> object:
        return await bus.js.pull_subscribe(subject, durable="leak", stream=stream)

    idle = subscriptions(nats_server, name)  # the client's own (its request inbox)
    stopping = asyncio.Event()
    loop = asyncio.create_task(bus.consume(subscribe, handle, stopping=stopping))  # type: ignore[arg-type]
    try:
        await bus.js.publish(subject, b"before")
        async with asyncio.timeout(15):
            while seen != [b"before"]:
                await asyncio.sleep(0.05)
        bound = subscriptions(nats_server, name)
        assert bound > idle
        await bus.js.delete_stream(stream)
        await asyncio.sleep(4.5)  # at least two failed fetches, a second apart
        await bus.js.add_stream(config)
        await bus.js.publish(subject, b"after")
        async with asyncio.timeout(15):
            while seen != [b"before", b"after"]:
                await asyncio.sleep(0.05)
        assert subscriptions(nats_server, name) == bound
    finally:
        stopping.set()
        await loop
        await bus.js.delete_stream(stream)
        await bus.close()
