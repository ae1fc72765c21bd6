"""The bus on a three-server JetStream cluster (issue 23; case B04's event-stream half): the
operator provisions every stream and bucket at ``AGENTRUN_NATS_REPLICAS``, raising those made
at R1; a count the servers cannot hold is refused saying what to set; a lost conditional append
on a replicated stream (error 10164, not only 10071) is a ``CommitConflict``; a leader step-down
during appends loses no acknowledged event."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
import urllib.request
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats
import nats.errors
import nats.js.api
import nats.js.errors
import pytest
from cluster_nats_support import ELECTION_ERRORS

from agentrun import buckets, kernel, protocol
from agentrun.bus import (
    APPEND_RETRY_SECONDS,
    WRONG_LAST_SEQUENCE_CODES,
    Bus,
    BusSettings,
    CommitConflict,
)
from agentrun.ledger import LedgerStore
from agentrun.protocol import RunEvent
from agentrun_dev import natscluster, natsserver

T = TypeVar("T")

STREAMS = (
    protocol.STREAM_TURNS,
    protocol.STREAM_EVENTS,
    protocol.kv_stream(protocol.LEDGER_BUCKET),
    protocol.kv_stream(protocol.EFFECTS_BUCKET),
)


async def provision(url: str, auth: object, replicas: int) -> Bus:
    """What the operator does at start (``operator.wiring.start_parts``), at ``replicas``."""
    bus = await Bus.connect(
        BusSettings(url=url, auth=auth, replicas=replicas),  # type: ignore[arg-type]
        name="test-replicated",
    )
    config = buckets.effects_config(replicas=replicas)
    await buckets.open_bucket(bus.js, config, create=True)
    await LedgerStore.open(bus.js, replicas=replicas)
    return bus


async def replicas(bus: Bus) -> dict[str, int]:
    found = {}
    for stream in STREAMS:
        info = await bus.js.stream_info(stream)
        found[stream] = int(info.config.num_replicas or 1)
    return found


async def settled(bus: Bus, stream: str, *, timeout: float = 20.0) -> None:
    """Wait until ``stream`` has a leader and two current replicas."""
    deadline = time.monotonic() + timeout
    while True:
        cluster = (await bus.js.stream_info(stream)).cluster
        assert cluster is not None
        peers = cluster.replicas or []
        if cluster.leader and len(peers) == 2 and all(p.current for p in peers):
            return
        assert time.monotonic() < deadline, f"{stream} not settled at R3: {cluster}"
        await asyncio.sleep(0.1)


async def retried(call: Callable[[], Awaitable[T]], *, timeout: float = 30.0) -> T:
    """``await call()``, again while a stream elects a leader (``ELECTION_ERRORS``), as the
    runtime retries; TimeoutError after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                return await call()
            except ELECTION_ERRORS:
                await asyncio.sleep(0.2)


def event(uid: str, turn: int) -> RunEvent:
    return RunEvent("stop", uid, kernel.RunSummary(kernel.Phase.RUNNING, turn=turn), time=1.0)


async def test_streams_and_buckets_made_at_one_replica_are_raised_to_three_keeping_data(
    nats_cluster: natscluster.NatsCluster,
) -> None:
    auth = nats_cluster.auth("operator")
    bus = await provision(nats_cluster.url, auth, 1)
    try:
        assert await replicas(bus) == dict.fromkeys(STREAMS, 1)
        seq = await bus.append_event("ns", "kept", event("u-kept", 1), expected_seq=0)
        kv = await bus.js.key_value(protocol.LEDGER_BUCKET)
        await kv.put("book.kept", b"{}")
    finally:
        await bus.close()
    bus = await provision(nats_cluster.url, auth, 3)
    try:
        assert await replicas(bus) == dict.fromkeys(STREAMS, 3)
        for stream in STREAMS:  # the new peers catch up and a leader is elected
            await settled(bus, stream)
        assert [e.seq for e in await bus.read_events("ns", "kept")] == [seq]
        kv = await bus.js.key_value(protocol.LEDGER_BUCKET)
        assert (await kv.get("book.kept")).value == b"{}"
    finally:
        await bus.close()


async def test_more_replicas_than_the_cluster_has_are_refused_saying_what_to_set(
    nats_cluster: natscluster.NatsCluster,
) -> None:
    with pytest.raises(buckets.ReplicasRefused, match="AGENTRUN_NATS_REPLICAS"):
        await provision(nats_cluster.url, nats_cluster.auth("operator"), 5)


async def test_a_single_server_refuses_three_replicas_for_streams_and_buckets(
    own_nats_server: natsserver.NatsServer,
) -> None:
    auth = own_nats_server.auth("operator")
    with pytest.raises(buckets.ReplicasRefused, match="at most the servers"):
        await provision(own_nats_server.url, auth, 3)
    # the refused connect closed its connection: no client is left reconnecting behind it
    with urllib.request.urlopen(f"{own_nats_server.monitor_url}/connz", timeout=5) as answer:
        names = [c.get("name") for c in json.load(answer).get("connections", [])]
    assert "test-replicated" not in names, names
    nc = await nats.connect(**own_nats_server.client_options("operator"))
    try:
        with pytest.raises(buckets.ReplicasRefused, match="KV_AGENTRUN_EFFECTS"):
            config = buckets.effects_config(replicas=3)
            await buckets.open_bucket(nc.jetstream(), config, create=True)
    finally:
        await nc.close()


async def test_racing_appends_on_a_replicated_stream_commit_once_the_others_conflict(
    nats_cluster: natscluster.NatsCluster,
) -> None:
    bus = await provision(nats_cluster.url, nats_cluster.auth("operator"), 3)
    codes: list[int] = []
    try:
        first = await bus.append_event("ns", "race", event("u-race", 0), expected_seq=0)
        with pytest.raises(CommitConflict):  # stale, alone
            await bus.append_event("ns", "race", event("u-race", 1), expected_seq=first - 1)
        for turn in range(1, 6):
            last = (await bus.read_events("ns", "race"))[-1].seq
            results = await asyncio.gather(
                *(
                    bus.append_event("ns", "race", event("u-race", turn), expected_seq=last)
                    for _ in range(20)
                ),
                return_exceptions=True,
            )
            assert sum(isinstance(r, int) for r in results) == 1, results
            conflicts = [r for r in results if not isinstance(r, int)]
            assert all(isinstance(r, CommitConflict) for r in conflicts), conflicts
            codes += [r.__cause__.err_code for r in conflicts]  # type: ignore[union-attr]
        assert len(await bus.read_events("ns", "race")) == 6
    finally:
        await bus.close()
    assert set(codes) <= WRONG_LAST_SEQUENCE_CODES
    assert 10164 in codes, "the replicated stream never answered 10164: the path is untested"


ELECTING = ELECTION_ERRORS


async def write_chain(
    bus: Bus, name: str, stop: asyncio.Event, acked: list[tuple[int, int]]
) -> int:
    """Append events to run ``name``, each on the last, until ``stop``; a failed request (a
    leader election in flight) is retried on the run's last event as read again. Returns the
    retries."""
    retries, turn, last = 0, 0, 0
    while not stop.is_set():
        try:
            seq = await bus.append_event("ns", name, event(name, turn), expected_seq=last)
        except (CommitConflict, *ELECTING):
            retries += 1  # the write may have landed: go on from what the stream holds
            await asyncio.sleep(0.05)
            with contextlib.suppress(*ELECTING):
                found = await bus.last_event("ns", name)
                last = 0 if found is None else found.seq
                turn = 0 if found is None else found.summary.turn + 1
            continue
        acked.append((seq, turn))
        last, turn = seq, turn + 1
    return retries


async def test_a_leader_step_down_during_appends_loses_no_acknowledged_event(
    nats_cluster: natscluster.NatsCluster,
) -> None:
    bus = await provision(nats_cluster.url, nats_cluster.auth("operator"), 3)
    bus.js = bus.nc.jetstream(timeout=2)  # a request lost in an election costs 2 s, not 10
    admin = await nats.connect(**nats_cluster.client_options("admin"))
    acked: dict[str, list[tuple[int, int]]] = {f"chain-{i}": [] for i in range(6)}
    stop = asyncio.Event()
    try:
        writers = asyncio.gather(*(write_chain(bus, n, stop, found) for n, found in acked.items()))
        leaders = []
        for _ in range(3):  # each after the writers appended again (past a lost request's 2 s)
            before = sum(map(len, acked.values()))
            async with asyncio.timeout(15):
                while sum(map(len, acked.values())) < before + 30:
                    await asyncio.sleep(0.05)
            leaders.append(await natscluster.step_down(admin, protocol.STREAM_EVENTS))
        await asyncio.sleep(0.3)
        stop.set()
        await asyncio.wait_for(writers, timeout=20)
        assert all(old != new for old, new in leaders)
        for name, found in acked.items():
            stored = [(e.seq, e.summary.turn) for e in await bus.read_events("ns", name)]
            assert set(found) <= set(stored), name  # every acknowledged event is kept
            turns = [turn for _, turn in stored]
            assert turns == list(range(len(turns))), name  # each turn once, in order
    finally:
        stop.set()
        await admin.close()
        await bus.close()


async def test_every_server_reads_an_acknowledged_event_at_once_through_a_step_down(
    nats_cluster: natscluster.NatsCluster,
) -> None:
    # A worker or operator on any server reads its run's events right after an append was
    # acknowledged, as the worker does with the event its TurnRequest was built on: each read
    # asks the stream's leader (a direct get is answered by the reader's own server, which may
    # not have applied the append yet; issue 23). Only namespace readers use direct gets.
    bus = await provision(nats_cluster.url, nats_cluster.auth("operator"), 3)
    readers = [
        await Bus.connect(
            BusSettings(url=url, auth=nats_cluster.auth("worker")), name="reader", provision=False
        )
        for url in nats_cluster.urls
    ]
    admin = await nats.connect(**nats_cluster.client_options("admin"))
    behind: list[tuple[str, int, int]] = []
    try:
        for n in range(60):
            if n == 30:
                await natscluster.step_down(admin, protocol.STREAM_EVENTS)
            append = functools.partial(bus.append_event, "ns", "raw", event("u-raw", n))
            seq = await retried(functools.partial(append, expected_seq=None))
            for i, reader in enumerate(readers):
                last = await retried(functools.partial(reader.last_event, "ns", "raw"))
                read = await retried(
                    functools.partial(reader.read_events, "ns", "raw", after_seq=seq - 1)
                )
                if last is None or last.seq != seq or [e.seq for e in read] != [seq]:
                    behind.append((f"n{i + 1}", seq, 0 if last is None else last.seq))
        assert behind == []
        infos = {s: (await bus.js.stream_info(s)).config for s in STREAMS}
        # the ledgers' KV reads (nats-py direct only when the bucket allows it) ask the leader
        assert {s: bool(c.allow_direct) for s, c in infos.items()} == {
            protocol.STREAM_TURNS: False,
            protocol.STREAM_EVENTS: True,  # for namespace readers' direct gets
            protocol.kv_stream(protocol.LEDGER_BUCKET): False,
            protocol.kv_stream(protocol.EFFECTS_BUCKET): False,
        }
    finally:
        await admin.close()
        for reader in readers:
            await reader.close()
        await bus.close()


class LostAnswers:
    """A JetStream context whose first `lost` publishes reach the stream but whose answers
    are lost (``nats.errors.TimeoutError`` raised after the real publish), as when the
    leader that stored the event dies before its ack gets through."""

    def __init__(self, js: object, lost: int) -> None:
        self._js, self.lost, self.sent = js, lost, 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._js, name)

    async def publish(self, *args: object, **kwargs: object) -> object:
        ack = await self._js.publish(*args, **kwargs)  # type: ignore[attr-defined]
        self.sent += 1
        if self.sent <= self.lost:
            raise nats.errors.TimeoutError
        return ack


async def test_an_append_whose_answer_was_lost_is_sent_again_and_stored_once(
    nats_cluster: natscluster.NatsCluster,
) -> None:
    bus = await provision(nats_cluster.url, nats_cluster.auth("operator"), 3)
    try:
        first = await bus.append_event("ns", "lost", event("u-lost", 0), expected_seq=0)
        real = bus.js
        bus.js = LostAnswers(real, lost=2)  # type: ignore[assignment]
        seq = await bus.append_event("ns", "lost", event("u-lost", 1), expected_seq=first)
        assert bus.js.sent == 3  # type: ignore[attr-defined]
        bus.js = real
        stored = await bus.read_events("ns", "lost")
        assert [(e.seq, e.summary.turn) for e in stored] == [(first, 0), (seq, 1)]
        # another writer's append on the same base is still refused: the copies did not
        # turn the commit rule off
        with pytest.raises(CommitConflict):
            await bus.append_event("ns", "lost", event("u-lost", 1), expected_seq=first)
    finally:
        await bus.close()


async def test_an_append_while_the_stream_has_no_quorum_lands_once_it_is_back(
    nats_cluster: natscluster.NatsCluster,
) -> None:
    bus = await provision(nats_cluster.url, nats_cluster.auth("operator"), 3)
    bus.js = bus.nc.jetstream(timeout=2)
    down = nats_cluster.servers[1:]  # the bus's own server (n1) stays up
    try:
        first = await bus.append_event("ns", "quorum", event("u-q", 0), expected_seq=0)
        for server in down:
            await asyncio.to_thread(server.stop)
        append = asyncio.create_task(
            bus.append_event("ns", "quorum", event("u-q", 1), expected_seq=first)
        )
        await asyncio.sleep(5.0)  # unanswered meanwhile: one server of three has no quorum
        assert not append.done(), str(append.exception())
        await asyncio.to_thread(down[0].restart)
        seq = await asyncio.wait_for(append, timeout=APPEND_RETRY_SECONDS - 5.0)
        stored = await retried(functools.partial(bus.read_events, "ns", "quorum"))
        assert [(e.seq, e.summary.turn) for e in stored] == [(first, 0), (seq, 1)]
    finally:
        for server in down:
            if not server.component.is_alive():
                await asyncio.to_thread(server.restart)
        for index in (2, 3):
            await asyncio.to_thread(natscluster.wait_caught_up, nats_cluster, f"n{index}")
        await bus.close()
