"""What each identity's work needs still works on the closed bus: the workers pull, extend,
acknowledge and commit turns, read any run's history, write ledger totals, run entries and
effect entries,
and hear cancellations; a reader follows its own namespace's runs; the operator provisions,
publishes, consumes every run's events, inspects the work queue, lists the ledger and purges.
Each through the runtime's own code (``Bus``, ``LedgerStore``, ``EffectLedger``)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator

import nats.errors
import nats.js.errors
import pytest
from nats.js import api

from agentrun import kernel, protocol
from agentrun.bus import Bus, BusSettings
from agentrun.ledger import CallNeed, Granted, LedgerStore, QueuedRun, TenantLimits, TurnRef
from agentrun.natsauth import creds
from agentrun.protocol import RunEvent
from agentrun.worker.effects import EffectLedger
from agentrun_dev import natsserver

from .conftest import NAMESPACE_A, NAMESPACE_B, TENANT_B, Client, RunB, connect, event_subject_b


@pytest.fixture
async def worker_bus(closed_server: natsserver.NatsServer, run_b: RunB) -> AsyncIterator[Bus]:
    bus = await Bus.connect(
        BusSettings(url=closed_server.url, auth=closed_server.auth("worker")),
        name="test-worker",
        provision=False,
    )
    yield bus
    await bus.close()


async def test_a_worker_pulls_extends_commits_and_acknowledges_a_turn(
    worker_bus: Bus, operator_bus: Bus, run_b: RunB
) -> None:
    sub = await worker_bus.turn_subscription()
    [msg] = await sub.fetch(batch=1, timeout=5)
    request = protocol.decode_turn_request(msg.data)
    assert request.run_uid == run_b.uid
    await msg.in_progress()
    history = await worker_bus.read_events(NAMESPACE_B, run_b.name)
    last = await worker_bus.last_event(NAMESPACE_B, run_b.name)
    assert last is not None and [e.seq for e in history] == [last.seq]
    state = kernel.initial_state(goal="tenant B's private goal")
    turn = RunEvent("stop", run_b.uid, state.summary(), time=time.time())
    seq = await worker_bus.append_event(NAMESPACE_B, run_b.name, turn, expected_seq=last.seq)
    await msg.ack_sync()
    assert seq > last.seq
    assert not await operator_bus.turn_queued(run_b.turn_seq)  # acknowledged: gone


@pytest.mark.parametrize("layout", ["split", "single"])
async def test_a_worker_writes_ledger_totals_run_entries_and_effect_entries(
    closed_server: natsserver.NatsServer,
    worker_bus: Bus,
    operator_bus: Bus,
    run_b: RunB,
    layout: str,
) -> None:
    """In either ledger layout (the tenant's, made by the operator's store)."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    operator_store = await LedgerStore.open(operator_bus.js, inline_runs=0, layout=layout)
    run = QueuedRun(uuid.uuid4().hex, NAMESPACE_B, "apart", time.time())
    assert await operator_store.admit_run(tenant, run, limits=TenantLimits(), need=(0, 0)) is None
    # the worker's identity may write the tenant's ledger in its layout (split: atomic batches)
    store = await LedgerStore.open(worker_bus.js, create=False, inline_runs=0)
    hold = store.turn_hold(TurnRef(tenant, run.uid, NAMESPACE_B, "apart", 0))
    assert isinstance(await hold.reserve_call(CallNeed(100, 0, kernel.Pricing())), Granted)
    await hold.spend(kernel.Usage(input_tokens=90))
    state = kernel.initial_state(goal="x")
    await hold.settle(dataclasses.replace(state, usage=kernel.Usage(input_tokens=90), turn=1))
    # split: each change of the run's own entry is an atomic batch with the totals
    assert store.batches >= (2 if layout == "split" else 0) and store.conflicts == 0
    book = await operator_store.read(tenant)
    assert book is not None and book.used_tokens == 90 and book.holds == {}
    effects = await EffectLedger.open(worker_bus.js, create=False)
    call = kernel.CheckedCall(id=f"call_{layout}", name="write", arguments={"x": 1})
    assert await effects.claim(run_b.uid, call) is None  # first claim: send it
    result = kernel.ToolResult(call.id, "write", "ok", False)
    await effects.done(run_b.uid, call, result)
    assert await effects.claim(run_b.uid, call) == result  # replayed, not sent again


async def test_a_worker_hears_cancellations(worker_bus: Bus, operator_bus: Bus) -> None:
    """The worker's identity may subscribe to the broadcasts the operator's may publish (a
    permission refused would leave every broadcast unheard). A broadcast is core NATS, best
    effort — the run's stop event, appended before it, is what stops the run's next commit —
    and under load one broadcast to a subscription just made went unheard (nats-server
    2.15.1, its subscription listed by /connz with no message), so it is sent again."""
    heard: list[str] = []

    async def on_cancel(uid: str) -> None:
        heard.append(uid)

    await worker_bus.on_cancel(on_cancel)
    await worker_bus.nc.flush()
    async with asyncio.timeout(20):
        while not heard:  # a broadcast is best effort: sent again until one is heard
            await operator_bus.broadcast_cancel("some-run")
            await operator_bus.nc.flush()
            await asyncio.sleep(0.5)
    assert set(heard) == {"some-run"}


async def test_a_reader_follows_the_runs_of_its_namespace(
    closed_server: natsserver.NatsServer, run_b: RunB
) -> None:
    auth = closed_server.mint_reader(NAMESPACE_B)
    assert auth.creds_file is not None
    name = creds.read(auth.creds_file).public  # the one consumer name it may create
    client = await connect(closed_server, auth)
    try:
        js = client.js()
        last = await js._jsm.get_last_msg(
            protocol.STREAM_EVENTS, event_subject_b(run_b), direct=True
        )
        assert last.data is not None
        sub = await js.subscribe(
            event_subject_b(run_b),
            stream=protocol.STREAM_EVENTS,
            ordered_consumer=True,
            deliver_policy=api.DeliverPolicy.ALL,
            config=api.ConsumerConfig(name=name),  # the one name its credential may use
        )
        first = await sub.next_msg(timeout=5)
        assert RunEvent.decode(first.data, seq=1).kind == "admitted"
        assert client.errors == []
    finally:
        await client.nc.close()


async def test_the_operator_puts_its_event_consumers_filter_back(
    operator_bus: Bus, admin: Client, run_b: RunB
) -> None:
    """A consumer whose filter was narrowed (by anyone allowed to) would skip every other
    namespace's events for good: binding it again restores the filter."""
    await operator_bus.event_subscription()
    jsm = admin.js()._jsm
    config = (await jsm.consumer_info(protocol.STREAM_EVENTS, protocol.OPERATOR_CONSUMER)).config
    config.filter_subject = f"agentrun.event.{NAMESPACE_A}.>"
    await jsm.add_consumer(protocol.STREAM_EVENTS, config)
    sub = await operator_bus.event_subscription()
    info = await jsm.consumer_info(protocol.STREAM_EVENTS, protocol.OPERATOR_CONSUMER)
    assert info.config.filter_subject == protocol.EVENT_SUBJECTS
    (msg,) = await sub.fetch(batch=1, timeout=5)
    assert msg.subject == event_subject_b(run_b)  # namespace B's events reach it again


async def test_the_operator_inspects_lists_consumes_and_purges(
    operator_bus: Bus, worker_bus: Bus, run_b: RunB
) -> None:
    store = await LedgerStore.open(operator_bus.js)
    assert TENANT_B in await store.tenants()
    assert await store.queue(TENANT_B) == []  # listed from the stream info: no consumer
    assert await operator_bus.pending_turns() >= 0
    assert event_subject_b(run_b) in await operator_bus.event_subjects()
    sub = await operator_bus.event_subscription()
    assert await sub.fetch(batch=1, timeout=5)
    doomed = f"doomed-{uuid.uuid4().hex[:6]}"
    state = kernel.initial_state(goal="g")
    event = RunEvent("stop", "uid", state.summary(), time=time.time())
    await operator_bus.append_event(NAMESPACE_B, doomed, event, expected_seq=0)
    await operator_bus.purge_run(NAMESPACE_B, doomed)
    assert await operator_bus.read_events(NAMESPACE_B, doomed) == []
    # a rerun's effect records (its uid's keys of the effect ledger), and no other run's
    effects = await EffectLedger.open(worker_bus.js, create=False)  # the workers' to write
    call = kernel.CheckedCall(id="0:write:0", name="write", arguments={})
    for uid in ("doomed-uid", run_b.uid):
        await effects.done(uid, call, kernel.ToolResult(call.id, "write", "ok", False))
    await operator_bus.purge_effects("doomed-uid")
    assert await effects.claim("doomed-uid", call) is None
    assert await effects.claim(run_b.uid, call) is not None


async def test_the_operator_deletes_the_workers_consumer_and_makes_it_again(
    operator_bus: Bus,
) -> None:
    """The runbook's repair of a consumer whose state no longer matches the work queue: the
    operator's identity (the NATS pod's ``nats`` CLI) deletes it, and ``ensure_streams`` (the
    orphan watch's, or a start's) makes it again."""
    jsm = operator_bus.js._jsm
    assert await jsm.delete_consumer(protocol.STREAM_TURNS, protocol.WORKERS_CONSUMER)
    with pytest.raises(nats.js.errors.NotFoundError):
        await jsm.consumer_info(protocol.STREAM_TURNS, protocol.WORKERS_CONSUMER)
    await operator_bus.ensure_streams()
    info = await jsm.consumer_info(protocol.STREAM_TURNS, protocol.WORKERS_CONSUMER)
    assert info.config.ack_policy == api.AckPolicy.EXPLICIT


async def test_the_operator_makes_shard_consumers_seated_after_its_one_consumer(
    operator_bus: Bus, run_b: RunB
) -> None:
    """With shards: the operator's identity may make and use ``agentrun-operator-<i>``; one
    made anew starts after the ack floor of ``agentrun-operator`` (the events handled before
    the install was sharded are not handled again), and one that exists is bound as it is."""
    one = await operator_bus.event_subscription()
    with contextlib.suppress(TimeoutError, nats.errors.TimeoutError):
        for msg in await one.fetch(batch=1, timeout=5):
            await msg.ack()
    floor = (await one.consumer_info()).ack_floor.stream_seq
    index = uuid.uuid4().int % 64  # a consumer of this test's own (the operator deletes none)
    shard = protocol.operator_consumer(index, 64)
    assert shard == f"agentrun-operator-{index}"
    sub = await operator_bus.event_subscription(shard, seated_after=protocol.OPERATOR_CONSUMER)
    info = await sub.consumer_info()
    assert info.config.opt_start_seq == floor + 1
    assert info.config.deliver_policy == api.DeliverPolicy.BY_START_SEQUENCE
    again = await operator_bus.event_subscription(shard, seated_after=protocol.OPERATOR_CONSUMER)
    assert (await again.consumer_info()).config.opt_start_seq == floor + 1


async def test_a_worker_started_before_the_operator_waits_for_the_buckets(
    closed_server: natsserver.NatsServer,
) -> None:
    """A worker does not create a bucket: it binds the one the operator makes, once it exists.
    (A bucket of the test's own, so the admin's credentials play both parts here.)"""
    bucket = f"LATE_{uuid.uuid4().hex[:8].upper()}"
    settings = BusSettings(url=closed_server.url, auth=closed_server.auth("admin"))
    worker = await Bus.connect(settings, name="early-worker", provision=False)
    operator = await Bus.connect(settings, name="late-operator", provision=False)
    try:
        waiting = asyncio.create_task(LedgerStore.open(worker.js, bucket=bucket, create=False))
        await asyncio.sleep(1.5)
        assert not waiting.done()  # no bucket, none made
        with pytest.raises(nats.js.errors.BucketNotFoundError):
            await worker.js.key_value(bucket)
        await LedgerStore.open(operator.js, bucket=bucket)  # the operator's part
        store = await asyncio.wait_for(waiting, 10)
        assert store.kv._name == bucket
    finally:
        await worker.close()
        await operator.close()


@pytest.mark.parametrize(
    ("reply", "run"),
    [(None, "victim"), ("_INBOX.x", "victim"), ("$JS.ACK.AGENTRUN_EVENTS.c.1.1.1.1.0", None)],
    ids=["broadcast", "with-an-inbox", "a-jetstream-delivery"],
)
def test_only_a_broadcast_on_a_cancel_subject_cancels(reply: str | None, run: str | None) -> None:
    """A push consumer's deliver subject is its creator's to choose, unchecked against its
    permissions: a namespace reader can aim its own events at another run's cancel subject.
    A message JetStream delivered there (reply ``$JS.ACK.…``) cancels nothing."""
    from agentrun.bus import cancelled_run

    assert cancelled_run(protocol.cancel_subject("victim"), reply) == run


@pytest.mark.parametrize(
    ("headers", "data"),
    [
        ({"Status": "100", "Description": "Idle Heartbeat"}, b""),
        ({"Status": "100", "Description": "FlowControl Request"}, b""),
        (None, b'{"kind": "turn"}'),
    ],
    ids=["an-idle-heartbeat", "a-flow-control-request", "an-event-without-its-reply"],
)
def test_a_push_consumers_status_message_on_a_cancel_subject_cancels_nothing(
    headers: dict[str, str] | None, data: bytes
) -> None:
    """A push consumer aimed at a cancel subject sends idle heartbeats and flow control there
    too, with no ``$JS.ACK`` reply: only the operator's broadcast (no reply, no headers, no
    body) cancels."""
    from agentrun.bus import cancelled_run

    subject = protocol.cancel_subject("victim")
    assert cancelled_run(subject, None, headers=headers, data=data) is None
    assert cancelled_run(subject, None, headers=None, data=b"") == "victim"
