"""What the operator's store watch reads (``Bus.streams_created``), on a real nats-server: the
creation times of the streams it made survive a restart of nats-server with its store intact,
and a restart with the store wiped leaves them missing, then made anew with a new time."""

from __future__ import annotations

import asyncio

from agentrun import protocol
from agentrun.bus import Bus, BusSettings
from agentrun_dev import natsserver

MAIN = (protocol.STREAM_TURNS, protocol.STREAM_EVENTS)


async def test_creation_times_survive_a_restart_and_change_when_the_store_is_wiped(
    own_nats_server: natsserver.NatsServer,
) -> None:
    server = own_nats_server
    bus = await Bus.connect(BusSettings(url=server.url, auth=server.auth()), name="test-store")
    try:
        made = await bus.streams_created((*MAIN, "NOT_MADE"))
        assert set(made) == set(MAIN) and all(made.values())

        await asyncio.to_thread(server.restart)
        assert await asked_again(bus) == made

        await asyncio.to_thread(server.restart, wipe_store=True)
        assert await asked_again(bus) == {}
        await bus.ensure_streams()
        anew = await bus.streams_created(MAIN)
        assert set(anew) == set(MAIN) and all(anew[n] != made[n] for n in MAIN)
    finally:
        await bus.close()


async def asked_again(bus: Bus) -> dict[str, object]:
    """``streams_created`` of the main streams once the reconnected client gets an answer."""
    async with asyncio.timeout(30):
        while True:
            try:
                return dict(await bus.streams_created(MAIN))
            except Exception:  # reconnecting
                await asyncio.sleep(0.2)
