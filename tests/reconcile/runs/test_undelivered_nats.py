"""A TurnRequest the workers' consumer will never deliver, on a real nats-server: the orphan
watch takes it out of the work queue and publishes it again, and a worker then runs and commits
the turn; a turn in a worker's hands, one waiting out a nak's delay and one queued behind a
busy worker are left alone.

The stuck state is the one nats-server #4736 reports after a restart: the consumer's ack floor
past a message the stream still holds (``num_pending`` 0, nothing awaiting an ack, a worker
asking). It is made here with the server's consumer reset (``$JS.API.CONSUMER.RESET``, from
nats-server 2.14), as the admin identity: a work-queue stream refuses a consumer created with
a start sequence past its messages."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import nats
import nats.errors
import pytest
from kube_support import FakeKube
from nats.aio.msg import Msg
from seals_support import sealed

from agentrun import kernel, protocol
from agentrun.bus import MSG_ID, Bus, BusSettings, WorkQueue, WorkQueueMissing
from agentrun.operator.runs.dispatch import Dispatcher
from agentrun.operator.runs.orphans import STUCK_LOOKS, OrphanWatch
from agentrun.operator.runs.ports import PendingTurn
from agentrun.protocol import RunEvent
from agentrun_dev import components, natsserver

from .test_orphans import AFTER, Clock, admitted_config, new_dispatcher, undelivered


@dataclasses.dataclass
class Harness:
    """A real nats-server, the operator's bus, a dispatcher and its orphan watch on it (a fake
    clock: each look is ``AFTER`` seconds after the last), and the runs admitted."""

    server: natsserver.NatsServer
    bus: Bus
    api: FakeKube
    clock: Clock
    dispatcher: Dispatcher
    watch: OrphanWatch

    async def admit(self) -> str:
        """Admit a run of a name and uid of its own (its TurnRequest 0 published); its uid."""
        uid = f"u-{uuid.uuid4().hex[:8]}"
        config = dataclasses.replace(admitted_config(self.clock), uid=uid, name=uid)
        meta = {"namespace": "ns", "name": uid, "uid": uid}
        self.api.put("agentruns", {"metadata": meta, "status": {}})
        state = kernel.initial_state(goal="g")
        event = sealed(RunEvent("admitted", uid, state.summary(), config=config))
        await self.bus.append_event("ns", uid, event, expected_seq=0)
        await self.apply_last(uid)
        return uid

    async def apply_last(self, uid: str) -> None:
        """Hand the dispatcher run ``uid``'s last event, as the event consumer would."""
        last = await self.bus.last_event("ns", uid)
        assert last is not None
        await self.dispatcher.on_event(protocol.event_subject("ns", uid), last)

    def turn(self, uid: str) -> PendingTurn:
        (turn,) = [t for t in self.dispatcher.pending_turns() if t.key.uid == uid]
        return turn

    async def figures(self, check: Callable[[WorkQueue], bool]) -> WorkQueue:
        """The workers' consumer's figures once ``check`` holds (within 5 s)."""
        deadline = time.monotonic() + 5
        while not check(figures := await self.bus.work_queue()):
            assert time.monotonic() < deadline, f"never so: {figures.describe()}"
            await asyncio.sleep(0.05)
        return figures

    async def looks(self, count: int) -> None:
        """``count`` passes of the watch, ``AFTER`` seconds apart (a worker's pulls go on)."""
        for _ in range(count):
            self.clock.now += AFTER
            await self.watch._pass()
            await asyncio.sleep(0.2)


@pytest.fixture
async def harness(tmp_path: Path, devenv_launch: components.Launch) -> AsyncIterator[Harness]:
    server = natsserver.start_nats_server(tmp_path / "nats", launch=devenv_launch)
    try:
        settings = BusSettings(url=server.url, auth=server.auth("operator"))
        bus = await Bus.connect(settings, name="test-operator")
        clock, api = Clock(), FakeKube()
        dispatcher = new_dispatcher(bus, clock, api)  # type: ignore[arg-type]
        watch = OrphanWatch(bus, dispatcher, after=AFTER, clock=clock)
        try:
            yield Harness(server, bus, api, clock, dispatcher, watch)
        finally:
            await dispatcher.cancel_timers()
            await bus.close()
    finally:
        server.stop()


class Worker:
    """A worker's part, on the workers' identity: pulls TurnRequests one at a time and commits
    each (a ``turn`` event on the one it was built on) then acks it; ``hold(request)`` True
    keeps that one in progress instead (a long turn), and no more is pulled while ``busy``."""

    def __init__(self, bus: Bus, *, hold: Callable[[protocol.TurnRequest], bool]) -> None:
        self.bus = bus
        self.hold = hold
        self.taken: list[tuple[str, int]] = []
        """(``Nats-Msg-Id``, stream sequence) of every TurnRequest delivered."""
        self.held: list[Msg] = []
        self.capacity = 1
        """Turns held at once before it stops pulling."""

    async def run(self, stopping: asyncio.Event) -> None:
        sub = await self.bus.turn_subscription()
        try:
            while not stopping.is_set():
                for msg in self.held:
                    await msg.in_progress()
                if len(self.held) >= self.capacity:
                    await asyncio.sleep(0.2)  # busy: no pull request waits
                    continue
                with contextlib.suppress(nats.errors.TimeoutError):
                    for msg in await sub.fetch(1, timeout=0.5):
                        await self._take(msg)
        finally:
            await sub.unsubscribe()

    async def _take(self, msg: Msg) -> None:
        request = protocol.decode_turn_request(msg.data)
        self.taken.append(((msg.headers or {})[MSG_ID], msg.metadata.sequence.stream))
        if self.hold(request):
            self.held.append(msg)
            return
        summary = kernel.RunSummary(kernel.Phase.RUNNING, turn=request.turn + 1)
        event = RunEvent("turn", request.run_uid, summary, time=time.time())
        await self.bus.append_event(
            request.namespace, request.name, event, expected_seq=request.expected_seq
        )
        await msg.ack_sync()


@contextlib.asynccontextmanager
async def working(
    server: natsserver.NatsServer, hold: Callable[[protocol.TurnRequest], bool]
) -> AsyncIterator[Worker]:
    """A ``Worker`` pulling on its own connection until the block ends."""
    bus = await Bus.connect(
        BusSettings(url=server.url, auth=server.auth("worker")), name="test-worker", provision=False
    )
    worker, stopping = Worker(bus, hold=hold), asyncio.Event()
    task = asyncio.create_task(worker.run(stopping))
    try:
        yield worker
    finally:
        stopping.set()
        await asyncio.wait_for(task, timeout=5)
        await bus.close()


async def reset_consumer(server: natsserver.NatsServer, *, seq: int) -> None:
    """Move the workers' consumer to deliver from stream sequence ``seq`` on (its ack floor
    ``seq - 1``), whatever the stream holds below it."""
    nc = await nats.connect(**server.client_options("admin"))
    try:
        subject = f"$JS.API.CONSUMER.RESET.{protocol.STREAM_TURNS}.{protocol.WORKERS_CONSUMER}"
        answer = json.loads((await nc.request(subject, json.dumps({"seq": seq}).encode())).data)
        assert "error" not in answer, answer
    finally:
        await nc.close()


async def eventually(check: Callable[[], bool], *, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within the timeout"
        await asyncio.sleep(0.05)


async def test_a_turn_request_below_the_consumers_ack_floor_is_sent_again_and_committed(
    harness: Harness,
) -> None:
    uid = await harness.admit()
    stuck = harness.turn(uid).queued_seq
    await reset_consumer(harness.server, seq=stuck + 1)
    figures = await harness.bus.work_queue()  # nats-server #4736, as measured
    assert (figures.delivered, figures.ack_floor) == (stuck, stuck)
    assert (figures.pending, figures.ack_pending, figures.unaccounted) == (0, 0, 1)
    before = undelivered("below_ack_floor")
    async with working(harness.server, hold=lambda _: False) as worker:
        await harness.figures(lambda figures: figures.waiting == 1)  # a worker asks...
        await asyncio.sleep(0.5)
        assert worker.taken == []  # ...and the consumer delivers it nothing
        await harness.looks(STUCK_LOOKS - 1)
        assert worker.taken == [] and await harness.bus.turn_queued(stuck)
        await harness.looks(1)
        assert not await harness.bus.turn_queued(stuck)
        await eventually(lambda: len(worker.taken) == 1)
    (msg_id, seq), turn = worker.taken[0], harness.turn(uid)
    assert msg_id.endswith(":1") and seq > stuck  # published again under a fresh id
    assert undelivered("below_ack_floor") == before + 1
    await harness.apply_last(uid)  # the worker's commit, as the event consumer hands it over
    assert harness.turn(uid).turn == turn.turn + 1 == 1
    events = await harness.bus.read_events("ns", uid)
    assert [e.kind for e in events] == ["admitted", "turn"]


async def test_turns_in_flight_waiting_out_a_nak_or_behind_busy_workers_are_left_alone(
    harness: Harness,
) -> None:
    """A turn in a worker's hands (kept in progress), another queued behind it while that
    worker pulls nothing; then the first nak'd with a delay while the worker, running the
    second, asks for more: over many looks, nothing is taken out or sent again."""
    long, queued = await harness.admit(), await harness.admit()
    seqs = {uid: harness.turn(uid).queued_seq for uid in (long, queued)}
    before = {reason: undelivered(reason) for reason in ("not_delivered", "delivered_not_pending")}
    async with working(harness.server, hold=lambda _: True) as worker:
        figures = await harness.figures(lambda figures: figures.ack_pending == 1)
        assert figures.delivered == seqs[long] < seqs[queued]
        assert (figures.pending, figures.waiting, figures.unaccounted) == (1, 0, 0)
        await harness.looks(STUCK_LOOKS + 2)
        await worker.held.pop().nak(delay=60)
        worker.capacity = 2
        figures = await harness.figures(lambda figures: figures.waiting == 1)
        assert (figures.ack_pending, figures.pending, figures.unaccounted) == (2, 0, 0)
        assert figures.delivered == seqs[queued]
        await harness.looks(STUCK_LOOKS + 2)
    assert [seq for _, seq in worker.taken] == [seqs[long], seqs[queued]]
    for uid in (long, queued):
        assert harness.turn(uid).queued_seq == seqs[uid] and harness.turn(uid).redispatches == 0
        assert await harness.bus.turn_queued(seqs[uid])
    assert before == {reason: undelivered(reason) for reason in before}


async def delete_consumer(server: natsserver.NatsServer) -> None:
    """Delete the workers' consumer, as the admin identity (by hand, or lost with a store)."""
    nc = await nats.connect(**server.client_options("admin"))
    try:
        await nc.jetstream().delete_consumer(protocol.STREAM_TURNS, protocol.WORKERS_CONSUMER)
    finally:
        await nc.close()


async def test_a_missing_workers_consumer_is_made_again_and_delivers_the_turns_stored(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    await delete_consumer(harness.server)
    with pytest.raises(WorkQueueMissing):
        await harness.bus.work_queue()
    uid = await harness.admit()  # its TurnRequest stored, no consumer to deliver it
    queued = harness.turn(uid).queued_seq
    await harness.looks(1)
    assert "made it again" in caplog.text
    figures = await harness.bus.work_queue()
    assert (figures.pending, figures.delivered) == (1, 0)
    async with working(harness.server, hold=lambda _: False) as worker:
        await eventually(lambda: len(worker.taken) == 1)
    assert worker.taken[0][1] == queued  # the stored one, not a copy
    await harness.apply_last(uid)
    assert harness.turn(uid).turn == 1 and harness.turn(uid).redispatches == 0


async def test_turns_queued_while_the_consumer_awaits_its_most_acks_are_left_alone(
    harness: Harness,
) -> None:
    """The workers' consumer limited to one unacknowledged message (``max_ack_pending``, as a
    JetStream account or server limit makes it): a turn in a worker's hands, a second queued
    behind it while that worker, with room for two, asks for more and is served nothing; over
    many looks, the second is neither taken out nor sent again (before, it was judged
    ``not_delivered``, deleted and published again each time, and its run ended
    ``checkpoint_failed`` after three)."""
    config = harness.bus.workers_consumer()
    config.max_ack_pending = 1
    await harness.bus.js._jsm.add_consumer(protocol.STREAM_TURNS, config)
    long, queued = await harness.admit(), await harness.admit()
    seqs = {uid: harness.turn(uid).queued_seq for uid in (long, queued)}
    before = undelivered("not_delivered")
    async with working(harness.server, hold=lambda _: True) as worker:
        worker.capacity = 2
        figures = await harness.figures(lambda f: f.ack_pending == 1 and f.waiting == 1)
        assert (figures.delivered, figures.pending) == (seqs[long], 1)
        await harness.looks(STUCK_LOOKS + 2)
        assert [seq for _, seq in worker.taken] == [seqs[long]]
    for uid in (long, queued):
        assert harness.turn(uid).queued_seq == seqs[uid] and harness.turn(uid).redispatches == 0
        assert await harness.bus.turn_queued(seqs[uid])
    assert undelivered("not_delivered") == before
