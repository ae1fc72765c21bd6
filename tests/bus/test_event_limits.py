"""The event stream's own limits, on a real nats-server: a stream made by an earlier release
(no limits) takes them on update; one event may be at most the client's payload cap; full at
``max_bytes`` (``AGENTRUN_EVENT_STREAM_MAX_BYTES``), the stream refuses new events and keeps
every committed one (``discard: new``), and a deleted run's purge makes room again."""

from __future__ import annotations

from collections.abc import AsyncIterator

import nats
import pytest
from nats.js import api

from agentrun import kernel, protocol
from agentrun.bus import EVENTS_PER_RUN, Bus, BusSettings
from agentrun.protocol import RunEvent
from agentrun_dev import natsserver

STREAM_BYTES = 64 * 1024


@pytest.fixture
async def server(own_nats_server: natsserver.NatsServer) -> AsyncIterator[natsserver.NatsServer]:
    yield own_nats_server


async def connect(server: natsserver.NatsServer, **settings: int) -> Bus:
    return await Bus.connect(
        BusSettings(url=server.url, auth=server.auth(), **settings),  # type: ignore[arg-type]
        name="test-event-limits",
    )


def event(uid: str, size: int) -> RunEvent:
    summary = kernel.RunSummary(kernel.Phase.RUNNING, message="m" * size)
    return RunEvent("stop", uid, summary, time=1.0)


async def test_a_stream_of_an_earlier_release_takes_the_limits_and_a_full_one_keeps_its_events(
    server: natsserver.NatsServer,
) -> None:
    nc = await nats.connect(**server.client_options())
    try:  # as an earlier release made it: no limits, old events discarded when full
        await nc.jetstream().add_stream(
            api.StreamConfig(
                name=protocol.STREAM_EVENTS,
                subjects=[protocol.EVENT_SUBJECTS],
                retention=api.RetentionPolicy.LIMITS,
                storage=api.StorageType.FILE,
                allow_direct=True,
            )
        )
    finally:
        await nc.close()
    bus = await connect(server, events_max_bytes=STREAM_BYTES)
    try:
        config = (await bus.js.stream_info(protocol.STREAM_EVENTS)).config
        assert (config.max_bytes, config.max_msgs_per_subject) == (STREAM_BYTES, EVENTS_PER_RUN)
        assert config.max_msg_size == bus.nc.max_payload
        assert (config.discard, config.discard_new_per_subject) == (api.DiscardPolicy.NEW, True)

        kept: list[int] = []
        with pytest.raises(nats.js.errors.APIError) as refused:
            for index in range(100):  # 100 events of 2 KiB: more than 64 KiB
                kept.append(
                    await bus.append_event(
                        "ns", f"r{index}", event(f"u{index}", 2048), expected_seq=0
                    )
                )
        assert "maximum bytes exceeded" in str(refused.value)
        assert 10 < len(kept) < 40
        first = await bus.last_event("ns", "r0")  # committed events are kept
        assert first is not None and first.seq == kept[0]

        await bus.purge_run("ns", "r0")
        await bus.append_event("ns", "again", event("u-again", 1024), expected_seq=0)
    finally:
        await bus.close()


async def test_a_purge_through_a_runs_last_event_keeps_a_newer_runs_events(
    server: natsserver.NatsServer,
) -> None:
    """A deleted run's clean-up purges its subject only through its own last event: a new
    AgentRun of the same name whose events were appended meanwhile keeps them (a purge of the
    whole subject used to take them)."""
    bus = await connect(server)
    try:
        seq = 0
        for _ in range(3):
            seq = await bus.append_event("ns", "same", event("old", 16), expected_seq=seq)
        old_last = seq
        for _ in range(2):
            seq = await bus.append_event("ns", "same", event("new", 16), expected_seq=seq)
        await bus.purge_run("ns", "same", through=old_last)
        left = await bus.read_events("ns", "same")
        assert [e.run_uid for e in left] == ["new", "new"]
        await bus.purge_run("ns", "same")
        assert await bus.read_events("ns", "same") == []
    finally:
        await bus.close()
