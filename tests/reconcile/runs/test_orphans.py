"""Lost turns: the orphan watch finds a running run whose TurnRequest left the work queue with no
newer event, has the dispatcher publish it again (the dispatcher alone changes its views), and
ends the run ``checkpoint_failed`` after ``MAX_REDISPATCHES`` such losses."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest
from kube_support import FakeKube
from seals_support import SIGNER, VERIFIER, sealed

from agentrun import kernel, metrics
from agentrun.bus import CommitConflict, WorkQueue
from agentrun.operator.admission.queue import QueueBoard
from agentrun.operator.platform.events import EventRecorder, Throttle
from agentrun.operator.runs.dispatch import DispatchDeps, Dispatcher
from agentrun.operator.runs.fairness import ReadyTurn
from agentrun.operator.runs.keys import RunKey
from agentrun.operator.runs.orphans import (
    BEHIND_AFTERS,
    MAX_REDISPATCHES,
    STARTUP_AFTERS,
    STUCK_LOOKS,
    OrphanWatch,
)
from agentrun.operator.runs.ports import PendingTurn
from agentrun.operator.runs.seals import RunSeals
from agentrun.operator.runs.writer import StatusWriter
from agentrun.protocol import ModelConfig, RunConfig, RunEvent, TurnRequest

AFTER = 10.0
SUBJECT = "agentrun.event.ns.r"


class Clock:
    now = 1_000.0

    def __call__(self) -> float:
        return self.now


class Bus:
    """The run's event subject and the work queue, in memory."""

    def __init__(self) -> None:
        self.events: list[RunEvent] = []
        self.published: list[tuple[TurnRequest, int]] = []
        """(request, attempt) of every TurnRequest published."""
        self.queued: set[int] = set()
        """Stream sequences of TurnRequests still in the work queue."""
        self.cancelled: list[str] = []
        self.queue = WorkQueue(0, 0, 0, 0, 0, 0)
        """What the workers' consumer reports (``work_queue``): nothing delivered yet."""
        self.looks = 0
        """Times the consumer was read."""
        self.dropped: list[int] = []
        """Stream sequences of TurnRequests taken out of the work queue."""

    async def publish_turn(self, request: TurnRequest, *, tenant: str, attempt: int = 0) -> int:
        self.published.append((request, attempt))
        seq = 100 + len(self.published)
        self.queued.add(seq)
        return seq

    async def turn_queued(self, seq: int) -> bool:
        return seq in self.queued

    async def turn_backlog(self) -> tuple[int, int]:
        return 0, 1  # nothing undelivered, a worker asking

    async def work_queue(self) -> WorkQueue:
        self.looks += 1
        return self.queue

    async def drop_turn(self, seq: int) -> bool:
        if seq not in self.queued:
            return False
        self.queued.remove(seq)
        self.dropped.append(seq)
        return True

    async def append_event(
        self, namespace: str, name: str, event: RunEvent, *, expected_seq: int | None
    ) -> int:
        last = self.events[-1].seq if self.events else 0
        if expected_seq is not None and expected_seq != last:
            raise CommitConflict(f"expected {expected_seq}, last is {last}")
        self.events.append(dataclasses.replace(event, seq=last + 1))
        return last + 1

    async def last_event(self, namespace: str, name: str) -> RunEvent | None:
        return self.events[-1] if self.events else None

    async def first_event(self, namespace: str, name: str) -> RunEvent | None:
        return self.events[0] if self.events else None

    async def broadcast_cancel(self, run_uid: str) -> None:
        self.cancelled.append(run_uid)


class Ends:
    async def settle_ended_run(
        self, event: RunEvent, *, tenant: str, uid: str, life: int | None = None
    ) -> None:
        pass


class NoCaps:
    def max_concurrent_turns(self, tenant: str) -> int | None:
        return None


def admitted_config(clock: Clock) -> RunConfig:
    """The config of run ``ns/r`` (uid ``u``, tenant ``t``), deadline an hour away."""
    return RunConfig(
        uid="u",
        namespace="ns",
        name="r",
        goal="g",
        instructions="",
        tools=(),
        limits=kernel.Limits(),
        model=ModelConfig("mock", "http://x", "scripted", kernel.Pricing(), 32000, 100),
        deadline=clock.now + 3_600,
        tenant="t",
    )


def new_dispatcher(bus: Bus, clock: Clock, api: FakeKube) -> Dispatcher:
    """A dispatcher on ``bus`` with the test keys' seals, no turn caps and unthrottled Events;
    the AgentRun ``ns/r`` (uid ``u``) is on ``api`` (a run is followed while it exists)."""
    api.put("agentruns", {"metadata": {"namespace": "ns", "name": "r", "uid": "u"}, "status": {}})
    events = EventRecorder(api, throttle=Throttle(repeat_after=0, rate=1000, burst=1000))
    seals = RunSeals(SIGNER, VERIFIER, streams=bus, api=api, events=events)  # type: ignore[arg-type]
    deps = DispatchDeps(ends=Ends(), queues=QueueBoard(), events=events, seals=seals, caps=NoCaps())
    return Dispatcher(bus, StatusWriter(api), deps, clock=clock)  # type: ignore[arg-type]


@pytest.fixture
async def stack() -> AsyncIterator[tuple[Bus, Dispatcher, OrphanWatch, Clock]]:
    """A running run admitted (its TurnRequest 0 published) in a dispatcher, and the watch."""
    bus, clock, api = Bus(), Clock(), FakeKube()
    dispatcher = new_dispatcher(bus, clock, api)
    config = admitted_config(clock)
    state = kernel.initial_state(goal="g")
    await bus.append_event(
        "ns", "r", sealed(RunEvent("admitted", "u", state.summary(), config=config)), expected_seq=0
    )
    await dispatcher.on_event(SUBJECT, bus.events[0])
    watch = OrphanWatch(bus, dispatcher, after=AFTER, clock=clock)  # type: ignore[arg-type]
    try:
        yield bus, dispatcher, watch, clock
    finally:
        await dispatcher.cancel_timers()


async def test_a_lost_turn_request_is_published_again_until_the_run_ends_checkpoint_failed(
    stack: tuple[Bus, Dispatcher, OrphanWatch, Clock],
) -> None:
    bus, dispatcher, watch, clock = stack
    assert [attempt for _, attempt in bus.published] == [0]
    for attempt in range(1, MAX_REDISPATCHES + 1):
        bus.queued.clear()  # acked by a worker that gave the turn up
        (turn,) = dispatcher.pending_turns()
        assert not await watch.check(turn)  # looked at too early
        clock.now += AFTER
        assert await watch.check(turn)
        assert [a for _, a in bus.published] == list(range(attempt + 1))
        assert dispatcher.pending_turns()[0].redispatches == attempt
    bus.queued.clear()
    clock.now += AFTER
    assert await watch.check(dispatcher.pending_turns()[0])
    stop = bus.events[-1]
    assert stop.kind == "stop" and stop.phase is kernel.Phase.CHECKPOINT_FAILED
    assert f"left the work queue {MAX_REDISPATCHES + 1} times" in stop.summary.message
    assert len(bus.published) == MAX_REDISPATCHES + 1 and bus.cancelled == ["u"]


async def test_a_turn_request_still_queued_is_left_alone_and_looked_at_later(
    stack: tuple[Bus, Dispatcher, OrphanWatch, Clock],
) -> None:
    bus, dispatcher, watch, clock = stack
    clock.now += AFTER
    assert not await watch.check(dispatcher.pending_turns()[0])
    (turn,) = dispatcher.pending_turns()
    assert turn.checked_at == clock.now and turn.redispatches == 0
    assert len(bus.published) == 1


def undelivered(reason: str) -> float:
    """``agentrun_turns_undelivered_total{reason}`` in this process."""
    for family in metrics.TURNS_UNDELIVERED.collect():
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels == {"reason": reason}:
                return sample.value
    return 0.0


BELOW_FLOOR = WorkQueue(
    delivered=101, ack_floor=101, pending=0, ack_pending=0, waiting=1, messages=1
)
"""What nats-server #4736 shows: the run's TurnRequest (101) still stored, the consumer counting
it delivered and acknowledged, a worker asking for a message."""


async def test_a_turn_request_the_consumer_counts_acknowledged_is_taken_out_and_sent_again(
    stack: tuple[Bus, Dispatcher, OrphanWatch, Clock], caplog: pytest.LogCaptureFixture
) -> None:
    """It stays in the stream, below the ack floor: judged stuck at ``STUCK_LOOKS`` checks in
    a row, it is deleted and published again as a lost one (attempt 1), with one warning
    naming the run and the consumer's figures, counted by reason."""
    bus, _dispatcher, watch, clock = stack
    bus.queue = BELOW_FLOOR
    before = undelivered("below_ack_floor")
    for _ in range(STUCK_LOOKS - 1):
        clock.now += AFTER
        await watch._pass()
    assert [a for _, a in bus.published] == [0] and bus.queued == {101}
    clock.now += AFTER
    await watch._pass()
    assert bus.dropped == [101]
    assert [(r.msg_id, a) for r, a in bus.published] == [("u:0@1", 0), ("u:0@1", 1)]
    assert undelivered("below_ack_floor") == before + 1
    (said,) = [r.getMessage() for r in caplog.records if "never to be delivered" in r.getMessage()]
    assert said == (
        "ns/r: turn 0 stayed in the work queue, never to be delivered (below_ack_floor; "
        "TurnRequest 101, consumer agentrun-workers: delivered 101, ack floor 101, pending 0, "
        "ack pending 0, waiting pulls 1; the stream holds 1 (1 unaccounted)); taken out of the "
        "stream; dispatching it again (1)"
    )
    assert bus.looks == STUCK_LOOKS + 1  # once a look, not per run; once more to confirm


async def test_a_stuck_verdict_must_hold_at_every_check_in_a_row(
    stack: tuple[Bus, Dispatcher, OrphanWatch, Clock],
) -> None:
    """A check that finds the TurnRequest in flight (figures read a moment apart) starts the
    count again."""
    bus, _dispatcher, watch, clock = stack
    in_flight = WorkQueue(101, 100, 0, 1, 0, 1)
    for figures in (
        [BELOW_FLOOR] * (STUCK_LOOKS - 1) + [in_flight] + [BELOW_FLOOR] * (STUCK_LOOKS - 1)
    ):
        bus.queue = figures
        clock.now += AFTER
        await watch._pass()
    assert len(bus.published) == 1 and not bus.dropped
    clock.now += AFTER
    await watch._pass()
    assert bus.dropped == [101] and len(bus.published) == 2


async def test_a_turn_delivered_since_the_passs_look_is_not_taken_out(
    stack: tuple[Bus, Dispatcher, OrphanWatch, Clock], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The consumer is read again before a TurnRequest judged stuck is taken out: one a worker
    took since the pass's look (the consumer recovered meanwhile) is left in its hands, not
    deleted and published again (a second model call), and judged again from the start."""
    bus, _dispatcher, watch, clock = stack
    in_flight = WorkQueue(101, 100, 0, 1, 0, 1)
    reads = iter([BELOW_FLOOR] * STUCK_LOOKS + [in_flight] * (STUCK_LOOKS + 1))

    async def work_queue() -> WorkQueue:
        bus.looks += 1
        return next(reads)

    monkeypatch.setattr(bus, "work_queue", work_queue)
    for _ in range(2 * STUCK_LOOKS):
        clock.now += AFTER
        await watch._pass()
    assert not bus.dropped and len(bus.published) == 1 and bus.queued == {101}


async def test_a_turn_never_delivered_counts_toward_the_end_as_a_lost_one(
    stack: tuple[Bus, Dispatcher, OrphanWatch, Clock],
) -> None:
    """Each copy published again stays undelivered too (beyond delivered, workers asking):
    after ``MAX_REDISPATCHES`` the run ends ``checkpoint_failed``, as for lost turns, its
    message naming the consumer that did not deliver, not a worker that gave the turn up."""
    bus, _dispatcher, watch, clock = stack
    bus.queue = WorkQueue(
        delivered=50, ack_floor=50, pending=1, ack_pending=0, waiting=2, messages=1
    )
    for _ in range((MAX_REDISPATCHES + 1) * STUCK_LOOKS):
        clock.now += AFTER
        await watch._pass()
    stop = bus.events[-1]
    assert stop.kind == "stop" and stop.phase is kernel.Phase.CHECKPOINT_FAILED
    assert f"left the work queue {MAX_REDISPATCHES + 1} times" in stop.summary.message
    assert "stayed in the work queue, never to be delivered" in stop.summary.message
    assert "agentrun-workers) does not deliver" in stop.summary.message
    assert "worker gave it up" not in stop.summary.message
    assert len(bus.dropped) == MAX_REDISPATCHES + 1
    assert [a for _, a in bus.published] == list(range(MAX_REDISPATCHES + 1))


async def test_the_consumer_is_read_once_a_look_and_only_for_a_turn_due(
    stack: tuple[Bus, Dispatcher, OrphanWatch, Clock],
) -> None:
    """Not while every turn was published or seen queued less than ``after`` ago; once for
    every run due."""
    bus, dispatcher, watch, clock = stack
    one = dispatcher.pending_turns

    def two() -> list[PendingTurn]:  # the run and a second one, published at the same time
        (turn,) = one()
        return [turn, dataclasses.replace(turn, key=RunKey("ns", "r2", "u2"), queued_seq=999)]

    dispatcher.pending_turns = two  # type: ignore[method-assign]
    await watch._pass()
    assert bus.looks == 0  # published just now
    clock.now += AFTER
    await watch._pass()
    assert bus.looks == 1
    await watch._pass()
    assert bus.looks == 1  # seen queued just now


async def test_a_run_that_moved_on_meanwhile_is_not_published_again(
    stack: tuple[Bus, Dispatcher, OrphanWatch, Clock],
) -> None:
    bus, dispatcher, watch, clock = stack
    (turn,) = dispatcher.pending_turns()
    bus.queued.clear()
    clock.now += AFTER
    # a newer event was committed but not consumed yet: the stream is ahead of the view
    await bus.append_event("ns", "r", bus.events[0], expected_seq=1)
    assert not await watch.check(turn)
    await dispatcher.on_event(SUBJECT, bus.events[-1])  # consumed: TurnRequest 1 published
    await dispatcher.redispatch(turn)  # a snapshot of the old turn changes nothing
    assert [r.expected_seq for r, _ in bus.published] == [1, 2]
    assert dispatcher.pending_turns()[0].redispatches == 0


async def test_an_event_the_consumer_never_delivers_is_logged_once(
    stack: tuple[Bus, Dispatcher, OrphanWatch, Clock], caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing acts on a run whose newer event the event consumer has not delivered (it is
    the consumer's to deliver), but once it has waited ``BEHIND_AFTERS × after`` it is
    logged, once per event, the runs found in one pass in one line: a stuck consumer is not
    silent, and a lagging one does not log a line per run."""
    bus, dispatcher, watch, clock = stack
    (turn,) = dispatcher.pending_turns()
    bus.queued.clear()  # its worker acked the request and committed event 2
    await bus.append_event(
        "ns", "r", dataclasses.replace(bus.events[0], time=clock.now), expected_seq=1
    )
    clock.now += BEHIND_AFTERS * AFTER - 1
    assert not await watch.check(turn)
    watch.report_behind()
    assert "has not delivered" not in caplog.text  # not yet
    clock.now += 1
    for _ in range(3):
        assert not await watch.check(turn)
        watch.report_behind()
    said = [r.getMessage() for r in caplog.records if "has not delivered" in r.getMessage()]
    assert said == [
        "1 run(s) have a committed event the event consumer has not delivered after 30s or "
        "more (longest: ns/r, event 2 committed 30s ago, the operator last applied event 1): "
        "the consumer is behind or stuck (agentrun_jetstream_consumer_pending)"
    ]
    assert len(bus.published) == 1  # not published again: the run moved on


async def test_a_turn_dropped_before_it_was_published_is_handed_to_the_gate_again(
    stack: tuple[Bus, Dispatcher, OrphanWatch, Clock],
) -> None:
    """The second line of defence: a running run whose turn is neither published nor waiting
    in the turn gate (dropped between the two) gets it offered again once ``after`` passed,
    under the same ``Nats-Msg-Id``, and once published it is the orphan watch's."""
    bus, dispatcher, watch, clock = stack
    turn = bus.events[0]
    await bus.append_event("ns", "r", turn, expected_seq=1)
    refused: list[str] = []

    async def dropped(ready: ReadyTurn) -> bool:
        refused.append(ready.uid)
        return False  # as the gate does for a run it takes to have moved on

    publish = dispatcher.publish_ready
    dispatcher.publish_ready = dropped  # type: ignore[method-assign]
    await dispatcher.on_event(SUBJECT, bus.events[-1])
    dispatcher.publish_ready = publish  # type: ignore[method-assign]
    assert refused == ["u"] and not dispatcher.pending_turns()
    assert await dispatcher.offer_stranded(after=AFTER) == 0  # not yet: looked at too early
    clock.now += AFTER
    await watch._pass()
    (again,) = dispatcher.pending_turns()
    assert [(r.expected_seq, a) for r, a in bus.published] == [(1, 0), (2, 0)]
    assert again.seq == 2 and again.redispatches == 0
    clock.now += AFTER
    assert await dispatcher.offer_stranded(after=AFTER) == 0  # published now: the watch's


KEY = RunKey("ns", "r", "u")


def shown(*, seq: int, version: str = "7", **status: object) -> dict[str, object]:
    """AgentRun ``ns/r`` as a watch event shows it: ``lastEventSequence`` ``seq`` and
    ``status``."""
    return {
        "metadata": {"namespace": "ns", "name": "r", "uid": "u", "resourceVersion": version},
        "status": {"lastEventSequence": seq, **status} if seq else dict(status),
    }


async def test_an_admitted_run_no_view_follows_is_followed_again_once_it_stays_so(
    stack: tuple[Bus, Dispatcher, OrphanWatch, Clock], caplog: pytest.LogCaptureFixture
) -> None:
    """The level-triggered second line: a run whose object shows it admitted and not ended,
    which this process was handed and does not follow (here: its admission found it admitted
    already and left it to an event nobody delivers), is followed again from its events once
    it stayed so for ``after`` seconds: its pending turn published again under the same
    ``Nats-Msg-Id`` (JetStream drops the copy of one still in its duplicate window), with one
    warning naming it."""
    bus, _, _, clock = stack
    second = new_dispatcher(bus, clock, FakeKube())  # the process that owns the run now
    watch = OrphanWatch(bus, second, after=AFTER, clock=clock)  # type: ignore[arg-type]
    await second.start_run(admitted_config(clock), start_time=clock.now, generation=1)
    assert second.handed("u") and not second.is_tracked("u")
    second.writer.observe(KEY, shown(seq=1, phase="Running"))
    try:
        await watch._pass()
        assert not second.pending_turns()  # not yet: kopf's own start-up may follow it
        clock.now += AFTER
        await watch._pass()
        assert not second.pending_turns()  # first found now
        clock.now += AFTER
        await watch._pass()
        (turn,) = second.pending_turns()
        assert turn.seq == 1 and turn.key == KEY
        assert [r.msg_id for r, _ in bus.published] == ["u:0@1", "u:0@1"]
        said = [r.getMessage() for r in caplog.records if "no view followed" in r.getMessage()]
        assert said == [
            "1 admitted, unfinished run(s) had no view followed here for 10s or more "
            "(first: ns/r); following them again from their events"
        ]
        clock.now += AFTER
        assert await watch.follow_unfollowed() == 0  # followed now
        assert len(bus.published) == 2
    finally:
        await second.cancel_timers()


@pytest.mark.parametrize(
    "status",
    [
        {"seq": 0, "phase": "Pending"},  # queued: never admitted
        {"seq": 1, "terminalReason": "completed", "phase": "Succeeded"},  # ended
    ],
)
async def test_a_run_not_admitted_or_ended_is_not_followed_again(
    stack: tuple[Bus, Dispatcher, OrphanWatch, Clock], status: dict[str, object]
) -> None:
    bus, _, _, clock = stack
    second = new_dispatcher(bus, clock, FakeKube())
    watch = OrphanWatch(bus, second, after=AFTER, clock=clock)  # type: ignore[arg-type]
    second.writer.observe(KEY, shown(**status))  # type: ignore[arg-type]
    for _ in range(3):
        assert await watch.follow_unfollowed() == 0
        clock.now += AFTER
    assert not second.pending_turns() and len(bus.published) == 1


async def test_a_followed_run_is_left_to_its_view(
    stack: tuple[Bus, Dispatcher, OrphanWatch, Clock],
) -> None:
    bus, dispatcher, watch, clock = stack
    dispatcher.writer.observe(KEY, shown(seq=1, phase="Running"))
    for _ in range(3):
        assert await watch.follow_unfollowed() == 0
        clock.now += AFTER
    assert len(bus.published) == 1


async def test_an_unfollowed_run_whose_events_are_gone_is_logged_once_and_left_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its events hold no admission of it: nothing to follow; it is left to the operator's
    next start (``runs.recovery`` ends such a run ``checkpoint_failed``), told once."""
    bus, clock = Bus(), Clock()
    dispatcher = new_dispatcher(bus, clock, FakeKube())
    watch = OrphanWatch(bus, dispatcher, after=AFTER, clock=clock)  # type: ignore[arg-type]
    dispatcher.writer.observe(KEY, shown(seq=3, phase="Running"))
    assert await watch.follow_unfollowed() == 0
    for _ in range(3):
        clock.now += STARTUP_AFTERS * AFTER  # not handed here: kopf's start-up had its time
        assert await watch.follow_unfollowed() == 0
    said = [r.getMessage() for r in caplog.records if "no admission of it" in r.getMessage()]
    assert len(said) == 1 and "ns/r" in said[0]
    assert not dispatcher.pending_turns() and not bus.published


async def test_a_run_whose_end_was_applied_here_is_not_followed_again_while_its_status_lags(
    stack: tuple[Bus, Dispatcher, OrphanWatch, Clock],
) -> None:
    """Its view was dropped at its end; its object shows it running until the end's status
    write lands: it is not followed (nor settled, nor its end told) again meanwhile."""
    bus, dispatcher, watch, clock = stack
    await dispatcher.end("ns", "r", "u", kernel.Phase.CANCELLED, "cancelled by a test")
    await dispatcher.on_event(SUBJECT, bus.events[-1])
    assert not dispatcher.is_tracked("u")
    dispatcher.writer.observe(KEY, shown(seq=1, phase="Running"))
    for _ in range(3):
        assert await watch.follow_unfollowed() == 0
        clock.now += AFTER
    assert not dispatcher.is_tracked("u")


class DeletingBus(Bus):
    """``Bus`` that can purge, and whose next ``first_event`` waits for ``gate`` (once)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: asyncio.Event | None = None
        self.reading = asyncio.Event()

    async def first_event(self, namespace: str, name: str) -> RunEvent | None:
        first = self.events[0] if self.events else None
        gate, self.gate = self.gate, None
        if gate is not None:
            self.reading.set()
            await gate.wait()
        return first

    async def purge_run(self, namespace: str, name: str, *, through: int = 0) -> None:
        self.events = [e for e in self.events if through and e.seq > through]

    async def purge_effects(self, run_uid: str) -> None:
        pass


async def test_a_run_deleted_while_the_audit_follows_it_again_is_not_left_followed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The audit read the run's admission, then the run was deleted (ended, its events
    purged, its status forgotten) before it read its last event: it is not followed (a view
    of a deleted run, its deadline timer armed, for ever), nor told as a lost checkpoint."""
    bus, clock = DeletingBus(), Clock()
    dispatcher = new_dispatcher(bus, clock, FakeKube())
    state = kernel.initial_state(goal="g")
    admitted = RunEvent("admitted", "u", state.summary(), config=admitted_config(clock))
    await bus.append_event("ns", "r", sealed(admitted), expected_seq=0)
    watch = OrphanWatch(bus, dispatcher, after=AFTER, clock=clock)  # type: ignore[arg-type]
    dispatcher.writer.observe(KEY, shown(seq=1, phase="Running"))
    try:
        assert await watch.follow_unfollowed() == 0  # first found
        clock.now += STARTUP_AFTERS * AFTER  # not handed here: kopf's start-up had its time
        bus.gate = gate = asyncio.Event()
        audit = asyncio.create_task(watch.follow_unfollowed())
        await bus.reading.wait()  # the audit read the run's admission...
        await dispatcher.forget("ns", "r", "u")  # ...and the AgentRun is deleted meanwhile
        assert not dispatcher.is_tracked("u") and not bus.events
        gate.set()
        await asyncio.gather(audit, return_exceptions=True)
        assert not dispatcher.is_tracked("u"), "a deleted run is followed again, for ever"
        assert "no admission of its life" not in caplog.text
    finally:
        await dispatcher.cancel_timers()


async def test_a_run_not_yet_handed_here_waits_for_the_start_ups_resume_first(
    stack: tuple[Bus, Dispatcher, OrphanWatch, Clock], caplog: pytest.LogCaptureFixture
) -> None:
    """A run found unfollowed that neither its admission nor a resume handed to this process
    (kopf's start-up resume may not have reached it yet) is given ``STARTUP_AFTERS × after``
    seconds before it is followed again: a large restart is not done twice, nor told as a
    lost view."""
    bus, _, _, clock = stack
    second = new_dispatcher(bus, clock, FakeKube())
    watch = OrphanWatch(bus, second, after=AFTER, clock=clock)  # type: ignore[arg-type]
    second.writer.observe(KEY, shown(seq=1, phase="Running"))
    try:
        assert await watch.follow_unfollowed() == 0  # first found
        clock.now += (STARTUP_AFTERS - 1) * AFTER
        assert await watch.follow_unfollowed() == 0
        assert not second.pending_turns() and "no view followed" not in caplog.text
        clock.now += AFTER
        assert await watch.follow_unfollowed() == 1
        (turn,) = second.pending_turns()
        assert turn.key == KEY and second.handed("u")
    finally:
        await second.cancel_timers()
