"""One turn run by two workers (a redelivery while the first worker still runs it, as after a
NATS restart, or by a worker holding the run's state from before the turn committed): real
consumers, a real nats-server (JetStream events and ledger), the scripted model over HTTP.
The turn commits once, and every model call made is charged to the tenant exactly once: the
committed one through the run's usage, the losing one as abandoned."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Callable
from decimal import Decimal
from typing import Any

import pytest
from kube_support import FakeKube
from seals_support import VERIFIER, sealed

from agentrun import kernel, protocol
from agentrun.bus import Bus, BusSettings
from agentrun.ledger import Book, LedgerStore, QueuedRun, Repair, TenantLimits, TurnHold, TurnRef
from agentrun.operator.admission.queue import QueueBoard
from agentrun.operator.admission.settlement import RunSettlement
from agentrun.operator.admission.sweep import LedgerSweep, SweepDeps
from agentrun.operator.platform.events import EventRecorder, Throttle
from agentrun.operator.tenants.registry import Tenants
from agentrun.operator.tenants.writer import TenantStatusWriter
from agentrun.protocol import ModelConfig, RunConfig, RunEvent, TurnRequest
from agentrun.testing import mockllm, scenario
from agentrun.tools import Calculate, Catalog
from agentrun.worker import history
from agentrun.worker.consumer import ConsumerSettings, TurnConsumer
from agentrun.worker.model import ModelClient, RetryPolicy
from agentrun.worker.toolrunner import ToolRunSettings
from agentrun.worker.turn import TurnDeps
from agentrun_dev import natsserver

from .loop import NoSecrets

SCRIPT = """
scenarios:
  - name: slow-first-turn
    turns:
      - tool_calls: [{id: call_1, name: calculate, arguments: {expression: "6*7"}}]
        latency_ms: 1500
        usage: {prompt_tokens: 100, completion_tokens: 10}
      - content: "42"
        usage: {prompt_tokens: 150, completion_tokens: 5}
"""
TURN_0 = 110
"""Tokens of each call of turn 0."""
TURN_1 = 155
SETTINGS = ConsumerSettings(concurrency=4, heartbeat=0.5, hold_ttl=5.0)


NO_ROLLOVER = 100 * 365 * 86_400.0
"""The tenants' budget window: a century, aligned to the epoch (its next start is in 2069), so
the sweep an hour later sees the same window however close to 00:00 UTC the test runs (with
the default 24 h window, the hour crossed midnight from 23:00 on and reset the counters)."""


class Delivery:
    """One delivery of a TurnRequest, as a worker's handler sees it; records what it got."""

    def __init__(self, request: TurnRequest) -> None:
        self.data = protocol.encode_turn_request(request)
        self.subject = protocol.turn_subject("acme")
        self.headers: dict[str, str] | None = None
        self.metadata = _Metadata()
        self.outcome: list[str] = []
        self.signalled: list[float] = []
        """When ``in_progress`` was called (``time.monotonic``)."""

    async def ack(self) -> None:
        self.outcome.append("ack")

    async def nak(self, delay: float | None = None) -> None:
        self.outcome.append("nak")

    async def term(self) -> None:
        self.outcome.append("term")

    async def in_progress(self) -> None:
        self.signalled.append(time.monotonic())


class _Metadata:
    num_delivered = 1
    timestamp = None


class _Redelivered:
    num_delivered = 2
    timestamp = None


class Stack:
    """Workers on their own connections to one nats-server, a tenant and the scripted model."""

    def __init__(self, server: natsserver.NatsServer, mock: mockllm.MockLLM) -> None:
        self.server, self.mock = server, mock
        self.tenant = f"t-{uuid.uuid4().hex[:10]}"
        self.buses: list[Bus] = []
        self.model = ModelClient(RetryPolicy(max_retries=0))

    async def connect(self, identity: str = "admin") -> Bus:
        """A connection of its own (the first one is the test's, never a worker's; it
        provisions the streams, as the operator would)."""
        bus = await Bus.connect(
            BusSettings(self.server.url, auth=self.server.auth(identity)),
            name=f"c{len(self.buses)}",
            provision=identity != "worker",
        )
        self.buses.append(bus)
        return bus

    async def worker(self) -> TurnConsumer:
        """A worker with its own connection and the workers' credentials (closing it is the
        worker dying, to the ledger)."""
        bus = await self.connect("worker")
        ledger = await LedgerStore.open(bus.js, create=False)
        deps = TurnDeps(
            model=self.model,
            catalog=Catalog([Calculate()]),
            secrets=NoSecrets(),
            tool_settings=ToolRunSettings(),
        )
        return TurnConsumer(bus, deps, SETTINGS, seals=VERIFIER, ledger=ledger)

    async def store(self) -> LedgerStore:
        return await LedgerStore.open(self.buses[0].js)

    async def admit(self, **changes: Any) -> TurnRequest:
        """A fresh run, admitted (its event and its tenant slot): its turn 0's request;
        ``changes`` replace fields of its ``RunConfig``."""
        uid = uuid.uuid4().hex
        config = RunConfig(
            uid=uid,
            namespace="ns",
            name=f"dup-{uid[:8]}",
            goal="what is 6*7?",
            instructions="",
            tools=("calculate",),
            limits=kernel.Limits(),
            model=ModelConfig("mock", self.mock.base_url, "scripted", kernel.Pricing(), 32000, 100),
            deadline=time.time() + 60,
            tenant=self.tenant,
        )
        config = dataclasses.replace(config, **changes)
        state = kernel.initial_state(goal=config.goal)
        event = sealed(RunEvent("admitted", uid, state.summary(), config=config, time=time.time()))
        seq = await self.buses[0].append_event("ns", config.name, event, expected_seq=0)
        refusal = await (await self.store()).admit_run(
            self.tenant,
            QueuedRun(uid, "ns", config.name, time.time()),
            limits=TenantLimits(tokens=1_000_000, window_seconds=NO_ROLLOVER),
            need=(0, Decimal(0)),
        )
        assert refusal is None
        return TurnRequest(uid, "ns", config.name, 0, seq)

    async def book(self) -> Book:
        book = await (await self.store()).read(self.tenant)
        assert book is not None
        return book

    async def events(self, request: TurnRequest) -> list[RunEvent]:
        return await self.buses[0].read_events("ns", request.name)

    def model_calls(self) -> int:
        """Requests the scripted model got (a fresh model per test)."""
        return len(self.mock.state.requests)


@contextlib.asynccontextmanager
async def stacked(server: natsserver.NatsServer, script: str = SCRIPT) -> AsyncIterator[Stack]:
    """A ``Stack`` on ``server`` whose scripted model plays ``script``."""
    async with mockllm.MockLLM(scenario.parse_scenarios(script)) as mock:
        s = Stack(server, mock)
        await s.connect()
        await s.store()  # the operator's part: the ledger bucket the workers bind
        try:
            yield s
        finally:
            await s.model.close()
            for bus in s.buses:
                await bus.close()


@pytest.fixture
async def stack(own_nats_server: natsserver.NatsServer) -> AsyncIterator[Stack]:
    """Its own nats-server: its runs' events and ledger entries never reach an operator
    another suite runs in the same session."""
    async with stacked(own_nats_server) as s:
        yield s


async def handle(
    worker: TurnConsumer,
    request: TurnRequest,
    *,
    once: Callable[[], bool] | None = None,
    again: bool = False,
) -> Delivery:
    """Deliver ``request`` to ``worker`` (once ``once()`` holds, polled every 10 ms, 30 s at
    most; ``again``: as JetStream redelivers it); what it did with it."""
    delivery = Delivery(request)
    if again:
        delivery.metadata = _Redelivered()
    if once is not None:
        async with asyncio.timeout(30):
            while not once():
                await asyncio.sleep(0.01)
    await worker._handle(delivery)  # type: ignore[arg-type]
    return delivery


async def test_a_turn_run_by_two_workers_at_once_charges_both_model_calls_once_each(
    stack: Stack,
) -> None:
    """The second delivery starts once the first one's 1.5 s model call is under way and
    takes its hold: the first finds its hold gone at its next refresh and stops its call (its
    budget is no longer held: two calls on one hold let another run take what the first still
    spends), charged what it used as abandoned; it leaves the message to the second, which
    commits. Both calls are charged, each once: the committed one in the run's usage."""
    first, second = await stack.worker(), await stack.worker()
    request = await stack.admit()

    # the second starts on the first's model call, not after a fixed time: on a busy machine
    # the first may not have reached its call yet
    def calling() -> bool:
        return stack.model_calls() >= 1

    a, b = await asyncio.gather(handle(first, request), handle(second, request, once=calling))
    assert (a.outcome, b.outcome) == ([], ["ack"])
    assert stack.model_calls() == 2
    events = await stack.events(request)
    assert [e.kind for e in events] == ["admitted", "turn"]
    assert events[1].owner  # the committed turn names the delivery whose call it holds
    assert events[1].summary.usage.total_tokens == TURN_0
    book = await stack.book()
    assert book.abandoned_tokens > 0  # the cut call: its prompt's bound at least
    assert (book.used_tokens, book.holds) == (TURN_0 + book.abandoned_tokens, {})


async def test_a_redelivery_to_the_worker_running_that_turn_makes_no_second_model_call(
    stack: Stack,
) -> None:
    """JetStream redelivers a turn when its heartbeats come later than ``ack_wait`` (a loaded
    machine: 14 of 1,600 runs in a CI preview, each asked of the model twice by one worker).
    The same worker gets it while its first delivery's model call is under way: it leaves
    the message to that delivery (no ack, no nak, no model call), which commits and acks."""
    worker = await stack.worker()
    request = await stack.admit()

    def calling() -> bool:
        return stack.model_calls() >= 1

    first = asyncio.create_task(handle(worker, request))
    again = await handle(worker, request, once=calling, again=True)
    assert again.outcome == [] and not first.done()
    assert (await first).outcome == ["ack"]
    assert stack.model_calls() == 1
    events = await stack.events(request)
    assert [e.kind for e in events] == ["admitted", "turn"]
    book = await stack.book()
    assert (book.used_tokens, book.abandoned_tokens) == (TURN_0, 0)
    # the next turn of the run is no duplicate: it runs
    following = TurnRequest(request.run_uid, "ns", request.name, 1, events[-1].seq)
    assert (await handle(worker, following)).outcome == ["ack"]
    assert stack.model_calls() == 2


async def test_a_slow_hold_refresh_never_delays_the_in_progress_signal(stack: Stack) -> None:
    """A hold's refresh is a ledger write, which can wait seconds on a contended tenant entry
    (a big tenant's hot key). The ``in_progress`` signal keeps its own cadence meanwhile:
    waiting for the refresh, it came later than ``ack_wait`` and JetStream redelivered the
    turn to another worker, whose model call was charged as abandoned (seen as a second call
    of 14 of 1,600 runs under load)."""
    worker = await stack.worker()
    assert worker.ledger is not None
    make: Callable[..., TurnHold] = worker.ledger.turn_hold
    refreshes: list[float] = []

    def turn_hold(ref: TurnRef, **kwargs: Any) -> TurnHold:
        hold = make(ref, **kwargs)

        async def refresh() -> None:  # a write stuck behind the tenant's other writers
            refreshes.append(time.monotonic())
            await asyncio.sleep(30)

        hold.refresh = refresh  # type: ignore[method-assign]
        return hold

    worker.ledger.turn_hold = turn_hold  # type: ignore[method-assign]
    request = await stack.admit()
    started = time.monotonic()
    delivery = await handle(worker, request)  # turn 0's model call takes 1.5 s
    assert delivery.outcome == ["ack"] and stack.model_calls() == 1
    assert refreshes, "the hold was never refreshed"
    beats = [started, *delivery.signalled]
    gaps = [later - earlier for earlier, later in itertools.pairwise(beats)]
    # the signal every 0.5 s (SETTINGS.heartbeat) through the 1.5 s call; waiting for the
    # stuck refresh it came once (at 0.5 s), then never again
    assert len(delivery.signalled) >= 2, gaps
    assert max(gaps) < 1.25, gaps


def reads_the_events_before_the_commit(worker: TurnConsumer) -> None:
    """Make ``worker``'s read of the run's events, when its reservation finds another
    delivery's answered hold of the turn (``TurnHold.reserve_call``), come just before that
    delivery's commit lands — a race no check closes: it finds the turn not committed and goes
    on to call the model."""

    async def moved_on(request: TurnRequest) -> bool:
        return False

    worker._moved_on = moved_on  # type: ignore[method-assign]


def dies_before_settling(worker: TurnConsumer) -> None:
    """Make ``worker`` die, as far as the ledger can tell, right after its next commit: its
    connection closes before the turn's settlement, so its answered hold stays in the book."""
    assert worker.ledger is not None
    make: Callable[..., TurnHold] = worker.ledger.turn_hold

    def turn_hold(ref: TurnRef, **kwargs: Any) -> TurnHold:
        hold = make(ref, **kwargs)

        async def settle(after: kernel.RunState) -> None:
            await worker.bus.nc.close()
            raise ConnectionError("the worker died between its commit and its settlement")

        hold.settle = settle  # type: ignore[method-assign]
        return hold

    worker.ledger.turn_hold = turn_hold  # type: ignore[method-assign]


async def next_turn(stack: Stack, request: TurnRequest, last: RunEvent) -> None:
    """The run's next turn runs on a fresh worker: its reservation resolves turn 0 with the
    committer turn 0's event names."""
    worker = await stack.worker()
    following = TurnRequest(request.run_uid, "ns", request.name, 1, last.seq)
    assert (await handle(worker, following)).outcome == ["ack"]


async def run_closes(stack: Stack, request: TurnRequest, last: RunEvent) -> None:
    """The operator closes the run on its last event (as when it is deleted now)."""
    settlement = RunSettlement(await stack.store(), QueueBoard())
    await settlement.settle_ended_run(last, tenant=stack.tenant, uid=request.run_uid)


class _TrackedRuns:
    """The dispatcher as the sweep sees it: every run has a live view."""

    def is_tracked(self, uid: str) -> bool:
        return True

    async def end(
        self, namespace: str, name: str, uid: str, phase: kernel.Phase, message: str
    ) -> bool:
        raise AssertionError("the sweep ends no run here")


async def sweep_repairs(stack: Stack, request: TurnRequest, last: RunEvent) -> None:
    """The operator's sweep, an hour later, finds the dead worker's hold expired and repairs
    the entry from the run's last event (the committer it names)."""
    later = time.time() + 3_600.0  # inside the tenant's window (``NO_ROLLOVER``)
    api = FakeKube()
    recorder = EventRecorder(api, throttle=Throttle(repeat_after=60.0, rate=1.0, burst=10))
    deps = SweepDeps(
        store=await stack.store(),
        tenants=Tenants(api),
        board=QueueBoard(),
        runs=_TrackedRuns(),  # type: ignore[arg-type]
        events=stack.buses[0],
        api=api,
        tenant_status=TenantStatusWriter(api, events=recorder),
        clock=lambda: later,
    )
    await LedgerSweep(deps)._repair_entry(await stack.book(), None, later)


RESOLVED_BY = {
    "the next turn": next_turn,
    "the run's close": run_closes,
    "the sweep": sweep_repairs,
}


@pytest.mark.parametrize("resolve", RESOLVED_BY.values(), ids=RESOLVED_BY.keys())
async def test_a_committer_that_died_before_settling_is_charged_once(
    stack: Stack, resolve: Callable[[Stack, TurnRequest, RunEvent], Any]
) -> None:
    """The first worker commits turn 0 and dies before settling, its answered hold left in the
    book. A second worker that still holds the run as it was before that commit runs the turn
    again (its read of the events came just before the commit): it takes the hold over and its
    commit loses. Its own call is charged as abandoned; the dead worker's call, which the
    committed turn holds, is not (before: the takeover charged it as abandoned, and the run's
    usage charged it again)."""
    first, second = await stack.worker(), await stack.worker()
    request = await stack.admit()
    await history.load(
        second.bus, second.cache, request, seals=VERIFIER
    )  # it saw the run before the commit
    reads_the_events_before_the_commit(second)
    dies_before_settling(first)
    assert (await handle(first, request)).outcome == ["ack"]
    events = await stack.events(request)
    assert [e.kind for e in events] == ["admitted", "turn"]
    book = await stack.book()
    assert [h.owner for h in book.holds.values()] == [events[1].owner]

    assert (await handle(second, request)).outcome == ["ack"]
    assert stack.model_calls() == 2
    assert len(await stack.events(request)) == 2  # its commit lost
    book = await stack.book()
    assert (book.used_tokens, book.abandoned_tokens) == (TURN_0, TURN_0)  # its own call only

    await resolve(stack, request, events[1])
    book = await stack.book()
    assert book.holds == {}
    ran_next = resolve is next_turn
    assert book.abandoned_tokens == TURN_0
    assert book.used_tokens == 2 * TURN_0 + (TURN_1 if ran_next else 0)


async def test_a_stale_delivery_of_a_settled_turn_makes_no_model_call(stack: Stack) -> None:
    """A worker that saw the run before turn 0 committed and settled elsewhere gets turn 0's
    request: the ledger refuses its call (the turn is settled), so it calls no model; its
    record cannot commit, and nothing is charged for it."""
    first, second = await stack.worker(), await stack.worker()
    request = await stack.admit()
    await history.load(second.bus, second.cache, request, seals=VERIFIER)
    assert (await handle(first, request)).outcome == ["ack"]
    assert (await handle(second, request)).outcome == ["ack"]
    assert stack.model_calls() == 1
    assert len(await stack.events(request)) == 2
    book = await stack.book()
    assert (book.used_tokens, book.abandoned_tokens, book.holds) == (TURN_0, 0, {})


async def test_a_stale_delivery_of_a_turn_whose_committer_died_unsettled_makes_no_model_call(
    stack: Stack,
) -> None:
    """As above, but the committer died between its commit and its settlement, so the book has
    not settled turn 0 and cannot refuse the call. The stale delivery's reservation finds the
    committer's answered hold and sets it aside; the run's events, read then from the stream's
    leader, show the turn committed: it gives its hold back and calls no model (before: it
    called the model, and ran the tools the answer asked for, for a record that could not
    commit). The committer's call is charged once, through the run, when the turn is
    resolved."""
    first, second = await stack.worker(), await stack.worker()
    request = await stack.admit()
    await history.load(second.bus, second.cache, request, seals=VERIFIER)
    dies_before_settling(first)
    assert (await handle(first, request)).outcome == ["ack"]
    assert (await handle(second, request)).outcome == ["ack"]
    assert stack.model_calls() == 1
    events = await stack.events(request)
    assert len(events) == 2
    book = await stack.book()
    assert (book.used_tokens, book.abandoned_tokens) == (0, 0)
    assert [(h.owner, h.spent_tokens) for h in book.holds.values()] == [(events[1].owner, TURN_0)]

    await next_turn(stack, request, events[1])
    book = await stack.book()
    assert (book.used_tokens, book.abandoned_tokens, book.holds) == (TURN_0 + TURN_1, 0, {})


async def test_a_redelivery_reads_the_runs_events_rather_than_what_its_worker_saw(
    stack: Stack,
) -> None:
    """A redelivered request (its committer died before settling) on a worker that saw the
    run before that commit: the worker reads the run's events, finds the turn committed and
    acks it without a model call."""
    first, second = await stack.worker(), await stack.worker()
    request = await stack.admit()
    await history.load(second.bus, second.cache, request, seals=VERIFIER)
    dies_before_settling(first)
    assert (await handle(first, request)).outcome == ["ack"]
    assert (await handle(second, request, again=True)).outcome == ["ack"]
    assert stack.model_calls() == 1
    book = await stack.book()
    assert (book.used_tokens, book.abandoned_tokens) == (0, 0)  # settled by the next turn


def dies_after_its_call(worker: TurnConsumer) -> None:
    """Make ``worker`` die, as far as the ledger and the bus can tell, right after its next
    model call answered and its usage was recorded on its hold."""
    assert worker.ledger is not None
    make: Callable[..., TurnHold] = worker.ledger.turn_hold

    def turn_hold(ref: TurnRef, **kwargs: Any) -> TurnHold:
        hold = make(ref, **kwargs)
        record = hold.spend

        async def spend(usage: kernel.Usage, *, answered: bool = True) -> None:
            await record(usage, answered=answered)
            if answered:
                await worker.bus.nc.close()

        hold.spend = spend  # type: ignore[method-assign]
        return hold

    worker.ledger.turn_hold = turn_hold  # type: ignore[method-assign]


async def stopped_then_closed(stack: Stack, request: TurnRequest, last: RunEvent) -> None:
    """The run is cancelled after the turn (a ``stop`` event, as the operator appends one),
    and the operator closes it on that event: the turn's committer is read from the stop."""
    state = kernel.stop(last.state(), kernel.Phase.CANCELLED, "cancelled")
    stop = last.stopped(state, time=last.time + 1)
    assert stop.owner == last.owner and stop.stored_before == last.stored
    await stack.buses[0].append_event("ns", request.name, stop, expected_seq=last.seq)
    (*_, stored) = await stack.events(request)
    assert stored.kind == "stop" and stored.owner == last.owner
    await run_closes(stack, request, stored)


LEFT_BEHIND = {
    "the run's close": run_closes,
    "the sweep": sweep_repairs,
    "a stop event's close": stopped_then_closed,
}


@pytest.mark.parametrize("resolve", LEFT_BEHIND.values(), ids=LEFT_BEHIND.keys())
async def test_a_losing_call_left_behind_by_a_dead_worker_is_charged_from_the_committer_named(
    stack: Stack, resolve: Callable[[Stack, TurnRequest, RunEvent], Any]
) -> None:
    """Both deliveries die: the committer between its commit and its settle, the other (which
    saw the run from before that commit) right after its own model call. Both holds are left
    in the book, answered; the one resolving the turn reads its committer from the turn's
    event and charges only the other call as abandoned (before: neither was told apart, and
    the losing call was dropped uncharged)."""
    first, second = await stack.worker(), await stack.worker()
    request = await stack.admit()
    await history.load(second.bus, second.cache, request, seals=VERIFIER)
    reads_the_events_before_the_commit(second)
    dies_before_settling(first)
    dies_after_its_call(second)
    assert (await handle(first, request)).outcome == ["ack"]
    await handle(second, request)
    assert stack.model_calls() == 2
    events = await stack.events(request)
    assert [e.kind for e in events] == ["admitted", "turn"]
    book = await stack.book()
    assert len(book.holds) == 2 and all(h.recorded for h in book.holds.values())
    assert (book.used_tokens, book.abandoned_tokens) == (0, 0)

    await resolve(stack, request, events[1])
    book = await stack.book()
    assert (book.used_tokens, book.abandoned_tokens, book.holds) == (2 * TURN_0, TURN_0, {})


def test_the_turn_event_names_its_committer_through_its_json_and_the_fold() -> None:
    """``owner`` goes through an event's JSON and is what the fold hands the next turn; an
    event that names none (no ledger hold, or written before owners) gives ""."""
    config = RunConfig(
        uid="u",
        namespace="ns",
        name="r",
        goal="g",
        instructions="",
        tools=(),
        limits=kernel.Limits(),
        model=ModelConfig("mock", "http://x", "scripted", kernel.Pricing(), 32000, 100),
        deadline=0.0,
    )
    state = kernel.initial_state(goal="g")
    record = kernel.Stopped(0, kernel.Ending(kernel.Phase.CANCELLED, "stopped"))
    after = kernel.advance(state, record, config.limits)
    admitted = sealed(RunEvent("admitted", "u", state.summary(), config=config))
    named = RunEvent("turn", "u", after.summary(), record=record, owner="d1")
    unnamed = RunEvent("turn", "u", after.summary(), record=record)
    assert b'"owner"' not in unnamed.encode()
    events = [RunEvent.decode(e.encode(), seq=i) for i, e in enumerate((admitted, named), 1)]
    assert events[1].owner == "d1"
    loaded = history.fold(events, run_uid="u", seals=VERIFIER)
    assert loaded is not None and (loaded.committer, loaded.seq) == ("d1", 2)
    loaded = history.fold(
        [events[0], RunEvent.decode(unnamed.encode(), seq=2)], run_uid="u", seals=VERIFIER
    )
    assert loaded is not None and loaded.committer == ""


async def test_a_turn_whose_hold_was_swept_stops_its_model_call(stack: Stack) -> None:
    """A slow worker's hold expired (its refreshes did not land) and the sweep dropped it:
    another run may hold that budget now, so at its next refresh the worker finds its hold
    gone and stops its model call, charged what it used (its prompt's bound at least), and
    leaves the message to redelivery: no commit, no ack. (It went on calling on no hold, and a
    tenant took its budget twice.)"""
    worker = await stack.worker()
    request = await stack.admit()
    running = asyncio.create_task(handle(worker, request))
    async with asyncio.timeout(30):
        while stack.model_calls() < 1:
            await asyncio.sleep(0.01)
    store = await stack.store()
    read = await stack.book()
    sweep = Repair(
        f"{request.run_uid}:0", request.run_uid, None, since=read.slot_since(request.run_uid)
    )
    await store.repair_entry(stack.tenant, [sweep], limits=None, now=time.time() + 3_600)
    async with asyncio.timeout(10):
        delivery = await running
    assert delivery.outcome == []
    assert [e.kind for e in await stack.events(request)] == ["admitted"]
    book = await stack.book()
    assert book.holds == {} and book.used_tokens == book.abandoned_tokens > 0
