"""The operator's ``Dispatcher`` and its ``OrphanWatch`` on a real nats-server (JetStream), with
the status writer and the ledger replaced by recorders and Kubernetes Events posted to the
in-memory API server port: what each committed event makes it do —
publish the next TurnRequest (once, however often it is dispatched: ``Nats-Msg-Id``), write
the status at once or coalesced, settle and count an end once — and a lost turn dispatched
again three times before the run ends ``checkpoint_failed``."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import pytest
from kube_support import FakeKube
from nats.js import JetStreamContext
from seals_support import SIGNER, VERIFIER

from agentrun import kernel, protocol
from agentrun.bus import Bus, BusSettings
from agentrun.operator.platform.events import EventRecorder, Throttle
from agentrun.operator.runs import RunKey
from agentrun.operator.runs.dispatch import DispatchDeps, Dispatcher
from agentrun.operator.runs.keys import RUNS
from agentrun.operator.runs.orphans import MAX_REDISPATCHES, OrphanWatch
from agentrun.operator.runs.ports import PendingTurn
from agentrun.operator.runs.seals import RunSeals
from agentrun.operator.runs.waiting import WaitingCheck
from agentrun.operator.runs.writer import StatusWriter
from agentrun.protocol import ModelConfig, RunConfig, RunEvent
from agentrun_dev import natsserver


class Submitted:
    """A status writer that keeps what it is given: ``(seq, phase, urgent)`` per submit."""

    def __init__(self) -> None:
        self.bodies: list[tuple[int, str, bool]] = []
        self.ends: list[Callable[[], None]] = []
        self.gone: set[str] = set()
        """uids whose object is gone (``exists`` answers False)."""

    def submit(
        self,
        run: RunKey,
        body: Mapping[str, Any],
        *,
        seq: int,
        terminal: bool,
        on_end: Callable[[], None] | None = None,
    ) -> None:
        self.bodies.append((seq, str(body["phase"]), terminal))
        if on_end is not None:
            self.ends.append(on_end)

    def forget(self, run: RunKey) -> None:
        pass

    async def exists(self, run: RunKey) -> bool:
        return run.uid not in self.gone

    def reruns(self, run: RunKey) -> int:
        return 0  # every run here is in its first life


class Settled:
    """The ledger's end of a run: which runs were settled, from which event."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, str, str]] = []
        self.lives: list[int | None] = []
        """The life each close named (``LedgerStore.close_run``: a rerun's slot is left alone
        by an earlier life's close)."""

    async def settle_ended_run(
        self, event: RunEvent, *, tenant: str, uid: str, life: int | None = None
    ) -> None:
        self.runs.append((tenant, uid, event.kind))
        self.lives.append(life)


class NoQueues:
    def queued_counts(self) -> Mapping[str, int]:
        return {}


class NoCaps:
    """No tenant caps its turns in flight (``maxConcurrentTurns`` unset everywhere)."""

    def max_concurrent_turns(self, tenant: str) -> int | None:
        return None


class Recorded:
    """The Kubernetes Events the dispatcher records, posted through the API server port."""

    def __init__(self) -> None:
        self.api = FakeKube()
        self.recorder = EventRecorder(
            self.api, throttle=Throttle(repeat_after=0.0, rate=1000.0, burst=1000)
        )

    async def reasons(self) -> list[str]:
        """The reason of every occasion recorded so far, once per time it happened (an Event
        posted again for the same occasion counts up, as on the API server)."""
        await self.recorder.drain()
        return [str(e["reason"]) for e in self.api.events for _ in range(int(e["count"]))]


@pytest.fixture
async def bus(own_nats_server: natsserver.NatsServer) -> AsyncIterator[Bus]:
    settings = BusSettings(own_nats_server.url, auth=own_nats_server.auth())
    connected = await Bus.connect(settings, name="dispatch")
    try:
        yield connected
    finally:
        await connected.close()


def dispatcher(bus: Bus, writer: Any = None) -> tuple[Dispatcher, Submitted, Settled, Recorded]:
    """A dispatcher on ``bus``; its status writer ``writer``, else a ``Submitted``."""
    writer, settled, events = writer or Submitted(), Settled(), Recorded()
    seals = RunSeals(SIGNER, VERIFIER, streams=bus, api=FakeKube(), events=events.recorder)
    made = Dispatcher(
        bus,
        writer,  # type: ignore[arg-type]
        DispatchDeps(
            ends=settled, queues=NoQueues(), events=events.recorder, seals=seals, caps=NoCaps()
        ),
    )
    return made, writer, settled, events


def config(**limits: Any) -> RunConfig:
    uid = uuid.uuid4().hex
    return RunConfig(
        uid=uid,
        namespace="ns",
        name=f"run-{uid[:8]}",
        goal="ship it",
        instructions="",
        tools=("deploy",),
        limits=kernel.Limits(**limits),
        model=ModelConfig(
            "mock", "http://127.0.0.1:9/v1", "scripted", kernel.Pricing(), 32000, 100
        ),
        deadline=time.time() + 600,
        tenant="acme",
    )


async def admitted(bus: Bus, run: Dispatcher, cfg: RunConfig) -> RunEvent:
    """Admit ``cfg`` and hand its admitted event to ``run`` as the consumer would."""
    await run.start_run(cfg, start_time=time.time(), generation=1)
    (event,) = await bus.read_events(cfg.namespace, cfg.name)
    await run.on_event(protocol.event_subject(cfg.namespace, cfg.name), event)
    return event


def pending(run: Dispatcher, cfg: RunConfig) -> PendingTurn:
    """The dispatcher's snapshot of ``cfg``'s dispatched turn."""
    (turn,) = [t for t in run.pending_turns() if t.key.uid == cfg.uid]
    return turn


async def queued(bus: Bus, seq: int) -> protocol.TurnRequest:
    """The TurnRequest at stream sequence ``seq`` of the work queue, and its message id."""
    found = await bus.nc.jsm().get_msg(protocol.STREAM_TURNS, seq=seq)
    return protocol.decode_turn_request(found.data or b"")


async def turns_in_queue(bus: Bus) -> int:
    info = await bus.nc.jsm().stream_info(protocol.STREAM_TURNS)
    return int(info.state.messages)


async def test_an_admitted_run_is_dispatched_once_however_often_its_event_is_seen(
    bus: Bus,
) -> None:
    """A redelivered event is ignored by the view; a restarted operator dispatches the turn
    again, and the ``Nats-Msg-Id`` ``<run-uid>:<turn>@<expected-seq>`` makes JetStream drop
    the copy."""
    cfg = config()
    first, writer, _, _ = dispatcher(bus)
    before = await turns_in_queue(bus)
    event = await admitted(bus, first, cfg)
    view = pending(first, cfg)
    request = await queued(bus, view.queued_seq)
    assert (request.run_uid, request.turn, request.expected_seq) == (cfg.uid, 0, event.seq)
    assert request.stored == len(event.encode()) > 0  # the worker reserves memory by it
    found = await bus.nc.jsm().get_msg(protocol.STREAM_TURNS, seq=view.queued_seq)
    assert (found.headers or {}).get("Nats-Msg-Id") == f"{cfg.uid}:0@{event.seq}"
    assert writer.bodies == [(event.seq, "Running", False)]  # coalesced: nobody to ask

    await first.on_event(protocol.event_subject(cfg.namespace, cfg.name), event)  # redelivered
    restarted, _, _, _ = dispatcher(bus)
    assert await restarted.recover(cfg.namespace, cfg.name, cfg.uid, generation=1)
    assert pending(restarted, cfg).queued_seq == view.queued_seq  # the duplicate's ack
    assert await turns_in_queue(bus) == before + 1
    await first.cancel_timers()
    await restarted.cancel_timers()


async def test_an_admission_the_consumer_sees_before_start_run_tracks_it_is_dispatched(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The event consumer may see a run's ``admitted`` event while ``start_run`` is still
    between its append and tracking the run's view: the consumer, finding no view, reads the
    run's first event to build one, and ``start_run`` tracks its own meanwhile. Whichever view
    was tracked first is the one both go on with, so turn 0 is published (it was handed to
    the turn gate on a second view, which the gate, reading the tracked one, took for a run
    that had moved on: turn 0 was dropped and the run stayed Running until an operator
    restart)."""
    cfg = config()
    run, _, _, _ = dispatcher(bus)
    subject = protocol.event_subject(cfg.namespace, cfg.name)
    reading, release = asyncio.Event(), asyncio.Event()
    real_first, real_append = bus.first_event, bus.append_event
    consumer: list[asyncio.Task[None]] = []

    async def first_event_held(namespace: str, name: str) -> RunEvent | None:
        reading.set()
        await release.wait()  # start_run goes on meanwhile
        return await real_first(namespace, name)

    async def append_then_seen(
        namespace: str, name: str, event: RunEvent, *, expected_seq: int | None
    ) -> int:
        seq = await real_append(namespace, name, event, expected_seq=expected_seq)
        (stored,) = await bus.read_events(namespace, name)
        consumer.append(asyncio.create_task(run.on_event(subject, stored)))
        await reading.wait()  # the consumer found no view and reads the first event
        return seq

    monkeypatch.setattr(bus, "first_event", first_event_held)
    monkeypatch.setattr(bus, "append_event", append_then_seen)
    before = await turns_in_queue(bus)
    await run.start_run(cfg, start_time=time.time(), generation=1)
    release.set()
    await consumer[0]
    request = await queued(bus, pending(run, cfg).queued_seq)
    assert (request.run_uid, request.turn) == (cfg.uid, 0)
    assert await turns_in_queue(bus) == before + 1
    await run.cancel_timers()


def deadline_timers(cfg: RunConfig) -> int:
    """Deadline timers of run ``cfg`` still running on this event loop."""
    name = f"deadline-{cfg.uid}"
    return sum(1 for t in asyncio.all_tasks() if t.get_name() == name and not t.done())


async def test_a_run_followed_already_and_recovered_keeps_one_deadline_timer(bus: Bus) -> None:
    """After a share change kopf resumes every run, and ``recover`` finds a run the event
    consumer already follows: its deadline timer is not started twice, and stopping the parts
    leaves no timer running. (The second timer was never cancelled: every share change and
    every stop under load waited kopf's 5 s for it as a hung task.)"""
    cfg = config()
    run, _, _, _ = dispatcher(bus)
    await admitted(bus, run, cfg)
    assert deadline_timers(cfg) == 1
    assert await run.recover(cfg.namespace, cfg.name, cfg.uid, generation=1)
    assert await run.recover(cfg.namespace, cfg.name, cfg.uid, generation=1)
    assert deadline_timers(cfg) == 1
    await run.cancel_timers()
    assert deadline_timers(cfg) == 0


def awaiting_approval(start: kernel.RunState) -> kernel.RunState:
    limits = kernel.Limits(approval_tools=frozenset({"deploy"}))
    call = kernel.CheckedCall("d1", "deploy", {"version": "1"})
    held = kernel.Answered(
        0, kernel.ToolCalls((), None), calls=(call,), held=("d1",), usage=kernel.Usage(100, 10)
    )
    return kernel.advance(start, held, limits)


async def test_a_run_waiting_for_a_person_is_written_at_once_and_an_end_is_settled_once(
    bus: Bus,
) -> None:
    cfg = config()
    run, writer, settled, events = dispatcher(bus)
    event = await admitted(bus, run, cfg)
    waiting = awaiting_approval(kernel.initial_state(goal=cfg.goal))
    assert waiting.phase is kernel.Phase.AWAITING_APPROVAL
    turn = RunEvent("turn", cfg.uid, waiting.summary(), time=time.time())
    seq = await bus.append_event(cfg.namespace, cfg.name, turn, expected_seq=event.seq)
    subject = protocol.event_subject(cfg.namespace, cfg.name)
    await run.on_event(subject, (await bus.read_events(cfg.namespace, cfg.name))[-1])
    assert writer.bodies[-1] == (seq, "AwaitingApproval", True)  # a person to ask: at once
    assert await events.reasons() == ["ApprovalRequested"]
    command = f"kubectl agentrun approve {cfg.name} -n {cfg.namespace} (or deny)"
    assert command in events.api.events[0]["message"]  # works as shown from any context

    assert await run.end(cfg.namespace, cfg.name, cfg.uid, kernel.Phase.CANCELLED, "cancelled")
    stop = (await bus.read_events(cfg.namespace, cfg.name))[-1]
    assert (stop.kind, stop.phase) == ("stop", kernel.Phase.CANCELLED)
    await run.on_event(subject, stop)
    assert writer.bodies[-1] == (stop.seq, "Cancelled", True)
    assert settled.runs == [("acme", cfg.uid, "stop")]
    assert not run.is_tracked(cfg.uid)
    (ended,) = writer.ends
    ended()
    ended()  # the end counted and its Event recorded once, however often it is written
    assert await events.reasons() == ["ApprovalRequested", "Cancelled"]
    assert not await run.end(cfg.namespace, cfg.name, cfg.uid, kernel.Phase.CANCELLED, "again")


async def lose(subscription: JetStreamContext.PullSubscription) -> None:
    """A worker takes the run's TurnRequest and gives it up (acks it without committing)."""
    (msg,) = await subscription.fetch(1, timeout=10)
    await msg.ack_sync()


async def test_a_rerun_inside_the_duplicate_window_queues_its_turn_0_again(bus: Bus) -> None:
    """A rerun keeps the run's uid and purges its subject: its turn 0, built on the new
    admission, is queued, not dropped by the duplicate window as the first run's turn 0 (it
    was, under ``<run-uid>:<turn>``: the rerun lost a dispatch before its turn ever ran)."""
    cfg = config()
    run, _, _, _ = dispatcher(bus)
    first = await admitted(bus, run, cfg)
    queued_first = pending(run, cfg).queued_seq
    await run.prepare_rerun(cfg.namespace, cfg.name, cfg.uid)
    again = await admitted(bus, run, cfg)
    assert again.seq > first.seq
    rerun = pending(run, cfg)
    assert rerun.queued_seq > queued_first  # a new message, not the first one's duplicate ack
    request = await queued(bus, rerun.queued_seq)
    assert (request.run_uid, request.turn, request.expected_seq) == (cfg.uid, 0, again.seq)
    assert await bus.turn_queued(queued_first) and await bus.turn_queued(rerun.queued_seq)


async def test_a_turn_lost_four_times_ends_the_run_checkpoint_failed(bus: Bus) -> None:
    cfg = config()
    run, _, _, _ = dispatcher(bus)
    await bus.nc.jsm().purge_stream(protocol.STREAM_TURNS)  # earlier tests' turns
    subscription = await bus.turn_subscription()
    event = await admitted(bus, run, cfg)
    watch = OrphanWatch(bus, run, after=0.0)
    assert not await watch.check(pending(run, cfg))  # still queued: nothing to do
    for attempt in range(1, MAX_REDISPATCHES + 1):
        await lose(subscription)
        assert await watch.check(pending(run, cfg))
        found = await bus.nc.jsm().get_msg(protocol.STREAM_TURNS, seq=pending(run, cfg).queued_seq)
        assert (found.headers or {}).get("Nats-Msg-Id") == f"{cfg.uid}:0@{event.seq}:{attempt}"
        again = protocol.decode_turn_request(found.data or b"")
        assert again.stored == len(event.encode())  # sent again, with the run's stored bytes
        last = await bus.last_event(cfg.namespace, cfg.name)
        assert last is not None and last.kind == "admitted"
    assert pending(run, cfg).redispatches == 3
    await lose(subscription)
    assert await watch.check(pending(run, cfg))
    last = await bus.last_event(cfg.namespace, cfg.name)
    assert last is not None and (last.kind, last.phase) == ("stop", kernel.Phase.CHECKPOINT_FAILED)
    assert last.summary.message == (
        "turn 0 left the work queue 4 times without being committed "
        "(its TurnRequest was lost or its worker gave it up)"
    )
    await run.cancel_timers()


async def test_a_deleted_run_is_stopped_settled_counted_told_and_purged(bus: Bus) -> None:
    """Its object gone (no finalizer), ``forget`` ends the run ``cancelled`` — counted and told
    here, as no status write can make a gone object terminal —, settles its ledger entry from
    that end and purges its events; a second clean-up of the same run (the status writer
    finding it gone too) changes nothing."""
    cfg = config()
    run, _, settled, events = dispatcher(bus)
    await admitted(bus, run, cfg)
    await run.forget(cfg.namespace, cfg.name, cfg.uid)
    assert await bus.read_events(cfg.namespace, cfg.name) == []
    assert settled.runs == [("acme", cfg.uid, "stop")]
    assert await events.reasons() == ["Cancelled"]
    assert not run.is_tracked(cfg.uid)
    assert not run.count_end(cfg.uid, kernel.initial_state(goal=cfg.goal), tenant="acme")
    await run.forget(cfg.namespace, cfg.name, cfg.uid)
    assert settled.runs == [("acme", cfg.uid, "stop")]
    assert await events.reasons() == ["Cancelled"]


@pytest.mark.parametrize("how", ["ended", "deleted"])
async def test_a_run_s_close_names_the_life_its_admission_sealed(bus: Bus, how: str) -> None:
    """A rerun's end (its third life here), whether its events end it or its deletion does,
    closes its ledger entry naming that life, so that the close of an earlier life, still on
    its way, and this one never take each other's slot."""
    cfg = dataclasses.replace(config(), reruns=2)
    run, _, settled, _ = dispatcher(bus)
    await admitted(bus, run, cfg)
    if how == "deleted":
        await run.forget(cfg.namespace, cfg.name, cfg.uid)
    else:
        assert await run.end(cfg.namespace, cfg.name, cfg.uid, kernel.Phase.CANCELLED, "stop")
        stop = (await bus.read_events(cfg.namespace, cfg.name))[-1]
        await run.on_event(protocol.event_subject(cfg.namespace, cfg.name), stop)
    assert settled.runs == [("acme", cfg.uid, "stop")] and settled.lives == [2]


async def test_a_deleted_runs_clean_up_leaves_a_new_run_of_the_same_name_alone(bus: Bus) -> None:
    """``kubectl delete`` returns at once, so a new AgentRun of the same name can be admitted
    before the old one's clean-up runs: that clean-up neither ends, settles nor purges the new
    run's events."""
    old = config()
    run, _, settled, _ = dispatcher(bus)
    await admitted(bus, run, old)
    new = dataclasses.replace(old, uid=uuid.uuid4().hex)
    await bus.purge_run(new.namespace, new.name)  # the new run's admission starts its subject
    await admitted(bus, run, new)
    await run.forget(old.namespace, old.name, old.uid)
    (kept,) = await bus.read_events(new.namespace, new.name)
    assert (kept.run_uid, kept.kind) == (new.uid, "admitted")
    assert run.is_tracked(new.uid) and settled.runs == []


async def test_a_deleted_run_no_process_followed_is_counted_and_told_too(bus: Bus) -> None:
    """Deleted while no operator ran: the next one's ledger sweep stops it (``forget``) though
    it follows nothing of it; the end is counted and told all the same, with no span."""
    cfg = config()
    first, _, _, _ = dispatcher(bus)
    await admitted(bus, first, cfg)
    later, _, settled, events = dispatcher(bus)  # the next operator process
    assert not later.is_tracked(cfg.uid)
    await later.forget(cfg.namespace, cfg.name, cfg.uid)
    assert settled.runs == [("acme", cfg.uid, "stop")]
    assert await events.reasons() == ["Cancelled"]
    assert await bus.read_events(cfg.namespace, cfg.name) == []


async def test_a_run_deleted_while_no_operator_ran_gets_no_further_turn(bus: Bus) -> None:
    """The next operator reads a committed turn of a run it does not follow yet whose object
    was deleted meanwhile (a new AgentRun may hold its name, so the start-up purge by name
    leaves its events): it dispatches nothing of it (before: it published the deleted run's next
    turn, a model call charged to the tenant) and leaves it to the clean-up of deleted runs."""
    cfg = config()
    first, _, _, _ = dispatcher(bus)
    event = await admitted(bus, first, cfg)
    await first.cancel_timers()
    state = kernel.initial_state(goal=cfg.goal)
    turn = RunEvent("turn", cfg.uid, state.summary(), time=time.time())
    await bus.append_event(cfg.namespace, cfg.name, turn, expected_seq=event.seq)
    later, writer, _, _ = dispatcher(bus)  # the next operator process
    writer.gone.add(cfg.uid)
    before = await turns_in_queue(bus)
    subject = protocol.event_subject(cfg.namespace, cfg.name)
    await later.on_event(subject, (await bus.read_events(cfg.namespace, cfg.name))[-1])
    assert not later.is_tracked(cfg.uid) and writer.bodies == []
    assert await turns_in_queue(bus) == before
    writer.gone.clear()  # the object is there: followed, its next turn published
    await later.on_event(subject, (await bus.read_events(cfg.namespace, cfg.name))[-1])
    assert later.is_tracked(cfg.uid) and await turns_in_queue(bus) == before + 1
    await later.cancel_timers()


async def waiting_for_a_person(bus: Bus, run: Dispatcher, cfg: RunConfig, *, at: float) -> None:
    """Admit ``cfg`` and commit a turn, made at ``at``, that leaves it waiting for a person."""
    event = await admitted(bus, run, cfg)
    waiting = awaiting_approval(kernel.initial_state(goal=cfg.goal))
    turn = RunEvent("turn", cfg.uid, waiting.summary(), time=at)
    await bus.append_event(cfg.namespace, cfg.name, turn, expected_seq=event.seq)
    subject = protocol.event_subject(cfg.namespace, cfg.name)
    await run.on_event(subject, (await bus.read_events(cfg.namespace, cfg.name))[-1])


def writing_to_an_api(bus: Bus) -> tuple[FakeKube, StatusWriter, Dispatcher]:
    """An in-memory API server, a real status writer on it, a dispatcher writing through it."""
    api = FakeKube()
    writer = StatusWriter(api, interval=0.0)
    run, _, _, _ = dispatcher(bus, writer)
    return api, writer, run


def seen_in_a_watch(api: FakeKube, writer: StatusWriter, cfg: RunConfig) -> None:
    """``cfg``'s object stored, and known to ``writer`` as a watch event shows it (no read
    needed to write)."""
    meta = {"namespace": cfg.namespace, "name": cfg.name, "uid": cfg.uid}
    seen = api.put(RUNS, {"metadata": meta})
    writer.observe(RunKey(cfg.namespace, cfg.name, cfg.uid), seen)


async def test_a_run_waiting_for_a_person_whose_object_went_unseen_is_found_gone(
    bus: Bus,
) -> None:
    """A waiting run writes nothing, so no status write finds its object gone: the waiting-run
    check reads it once it has waited a period, and hands a gone one out as a write would."""
    api, writer, run = writing_to_an_api(bus)
    waiting, going = config(), config()
    for cfg in (waiting, going):
        seen_in_a_watch(api, writer, cfg)
    start = time.time()
    await waiting_for_a_person(bus, run, waiting, at=start)
    await admitted(bus, run, going)  # running: its next status write finds out
    now = start + 30.0
    check = WaitingCheck(run, writer, every=60.0, clock=lambda: now)
    reads = [what for verb, what in api.calls if verb == "get"]

    assert await check.check() == 0  # waited less than a period: not read
    assert [what for verb, what in api.calls if verb == "get"] == reads
    now = start + 60.0
    assert await check.check() == 0  # read once, there
    assert len([verb for verb, _ in api.calls if verb == "get"]) == len(reads) + 1

    del api.objects[(RUNS, "ns", going.name)]
    api.fail("get", 503)
    del api.objects[(RUNS, "ns", waiting.name)]
    assert await check.check() == 0  # the API server away reads as there; the next pass reads
    assert await check.check() == 1
    async with asyncio.timeout(5):
        assert await writer.next_gone() == RunKey("ns", waiting.name, waiting.uid)
    with pytest.raises(TimeoutError):  # the running run is left to its next write
        await asyncio.wait_for(writer.next_gone(), 0.2)


async def test_a_run_replaced_by_a_new_object_of_its_name_while_waiting_is_found_gone(
    bus: Bus,
) -> None:
    api, writer, run = writing_to_an_api(bus)
    cfg = config()
    start = time.time()
    seen_in_a_watch(api, writer, cfg)
    await waiting_for_a_person(bus, run, cfg, at=start)
    api.put(RUNS, {"metadata": {"namespace": "ns", "name": cfg.name, "uid": "new"}})
    check = WaitingCheck(run, writer, every=60.0, clock=lambda: start + 60.0)
    assert await check.check() == 1
    assert await writer.next_gone() == RunKey("ns", cfg.name, cfg.uid)


async def test_the_waiting_run_check_reads_at_most_its_bound_a_pass_longest_unread_first(
    bus: Bus,
) -> None:
    api, writer, run = writing_to_an_api(bus)
    first, second = config(), config()
    start = time.time()
    for cfg, at in ((second, start + 1.0), (first, start)):
        seen_in_a_watch(api, writer, cfg)
        await waiting_for_a_person(bus, run, cfg, at=at)
    now = start + 61.0
    check = WaitingCheck(run, writer, every=60.0, most=1, clock=lambda: now)

    def read() -> list[str]:
        names = [what.name for verb, what in api.calls if verb == "get"]
        api.calls.clear()
        return names

    read()
    for _ in range(3):
        assert await check.check() == 0
        now += 60.0
    assert read() == [first.name, second.name, first.name]  # the one waiting longest first


def tenant_of(namespace: str) -> str:
    """Tenant B binds namespace ``other``, tenant A every other one (``Tenants.party``)."""
    return "tenant/b" if namespace == "other" else "tenant/a"


@pytest.mark.parametrize(
    ("crowded", "party"),
    [
        pytest.param(["ns"] * 3, None, id="one-namespace-crowded"),
        pytest.param(["a-0", "a-1", "a-2"], tenant_of, id="one-tenants-namespaces-crowded"),
    ],
)
async def test_the_waiting_run_checks_reads_go_to_the_tenants_and_namespaces_in_turn(
    bus: Bus, crowded: list[str], party: Callable[[str], str] | None
) -> None:
    """A namespace with many waiting runs, or a tenant with waiting runs in many namespaces,
    does not use up a pass's reads: with room for two, the crowded one's longest-waiting run
    and the other tenant's run are read."""
    api, writer, run = writing_to_an_api(bus)
    if party is not None:
        writer.party = party
    waiting = [dataclasses.replace(config(), namespace=namespace) for namespace in crowded]
    other = dataclasses.replace(config(), namespace="other")
    start = time.time()
    for at, cfg in enumerate([*waiting, other]):
        seen_in_a_watch(api, writer, cfg)
        await waiting_for_a_person(bus, run, cfg, at=start + at)
    check = WaitingCheck(run, writer, every=60.0, most=2, clock=lambda: start + 120.0)
    api.calls.clear()
    assert await check.check() == 0
    read = [(what.namespace, what.name) for verb, what in api.calls if verb == "get"]
    assert read == [(crowded[0], waiting[0].name), ("other", other.name)]
