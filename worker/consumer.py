"""The worker's pull loop: fetch TurnRequests, run each turn, commit, then ack.

Delivery rules: ack only after the turn event is committed; ``in_progress``
heartbeats while a turn runs so JetStream does not redeliver it; a request whose base event is
not the run's last event is stale (the turn was already committed, or the run moved on) and is
acked without running, but a history read that ends *before* the base event is behind (the read
missed an acknowledged append) and the request is read again shortly (``BEHIND_DELAY``); a
commit that loses the compare-and-set is dropped, never retried. A
request for a run whose config the operator did not seal (``history.load`` raises
``trust.Untrusted``) is refused: acked without a model call, a Secret read or a tool call,
counted in ``agentrun_messages_refused_total``; the operator, which reads the same events, ends
the run (or re-seals one admitted before seals existed, and dispatches it again).

Stopping (SIGTERM) drains: nothing more is fetched, the turns in flight run on (heartbeats and
hold refreshes too) for the drain time, and only those still running then are cancelled and
naked for another worker — a model call so cut is asked again elsewhere, and charged as
abandoned like any call cut before its end (its prompt's bound, and the output delivered if
its answer had begun to arrive: the provider read the prompt; ``budget.SpendWatch``); a write
call in flight is not cut (``toolrunner``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from typing import NamedTuple

import nats.errors
from nats.aio.msg import Msg
from opentelemetry import context as otel_context

from agentrun import display, kernel, loops, metrics, protocol, telemetry
from agentrun.bus import Bus, CommitConflict, EventTooLarge
from agentrun.ledger import (
    DEFAULT_HOLD_TTL,
    LedgerCorrupt,
    LedgerStore,
    LedgerUnavailable,
    TurnHold,
    TurnRef,
)
from agentrun.protocol import RunEvent, TurnRequest
from agentrun.settings import RUN_EVENT_MAX_BYTES, TURN_MEMORY_BYTES, TURN_MEMORY_SHARES
from agentrun.trust import Untrusted, Verifier

from . import history, memory
from .secrets import SecretUnavailable
from .turn import PhaseClock, TurnDeps, execute_turn, off_loop

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class ConsumerSettings:
    """Concurrency and timing of one worker process."""

    concurrency: int = 64
    """Turns (of different runs) in flight at once."""
    heartbeat: float = 10.0
    """Seconds between ``in_progress`` signals while a turn runs (well under ack_wait); the
    turn's ledger hold is refreshed at the same interval, in a loop of its own (a slow ledger
    never delays the signal)."""
    hold_ttl: float = DEFAULT_HOLD_TTL
    """Seconds a ledger hold outlives its last refresh (a dead worker's hold is released
    after at most this plus the operator's sweep interval)."""
    drain: float = 0.0
    """Seconds a stopping worker lets the turns it holds run to their commit after it stopped
    fetching (``AGENTRUN_TERMINATION_GRACE`` less ``AGENTRUN_DRAIN_MARGIN``); turns still
    running then are cancelled and left for another worker (a write call in flight completes
    and records its outcome first). 0 cancels them at once."""
    run_event_max_bytes: int = RUN_EVENT_MAX_BYTES
    """Bytes one run's events may take; a run at it ends ``checkpoint_failed`` before its
    next model call."""
    turn_memory_bytes: int = TURN_MEMORY_BYTES
    """Bytes of memory the turns in flight may reserve at once (``memory.TurnMemory``)."""
    turn_memory_shares: int = TURN_MEMORY_SHARES
    """Tenant shares of that memory."""


BEHIND_DELAY = 0.5
"""Seconds before a TurnRequest whose history read came back behind it is read again."""
BEHIND_DELIVERIES = 10
"""Deliveries of a TurnRequest whose history reads end before its base event, after which it
is taken as stale (its run deleted) and acked: no read lags a leader's ack for that long."""
NEWER_SCHEMA_DELAY = 30.0
"""Seconds before a message written in a newer wire schema is offered again (to a newer
worker, during a rolling upgrade)."""
TURN_SUBJECT_PREFIX = protocol.turn_subject("")
"""``agentrun.turn.``: a TurnRequest's subject is this and its tenant's subject token."""


def is_transient(err: BaseException) -> bool:
    """Whether a turn that raised ``err`` should wait and be retried however long the fault
    lasts (NATS trouble, an unreadable or contended ledger entry, an API server that cannot
    be asked now), rather than end its run on a repeat."""
    if isinstance(err, nats.errors.MaxPayloadError | EventTooLarge):
        return False  # deterministic: the same turn would not fit again
    return isinstance(
        err,
        nats.errors.Error
        | LedgerUnavailable
        | LedgerCorrupt
        | SecretUnavailable
        | protocol.UnsupportedSchema,  # the run's events: a newer worker wrote them
    )


async def commit_turn(
    bus: Bus,
    request: TurnRequest,
    run: history.LoadedRun,
    record: kernel.TurnRecord,
    *,
    owner: str = "",
) -> tuple[kernel.TurnRecord, history.LoadedRun]:
    """Fold ``record`` into ``run`` and append it as the turn's event on top of
    ``request.expected_seq``, naming ``owner`` (the delivery's ledger hold owner, whose model
    call the record holds; "" without a ledger); returns the record committed and the run
    after it (its state, the event's stream sequence, the run's stored bytes). An event over
    the bus's message cap is committed once more with the record the kernel shrinks it to
    (``kernel.shrink_record``: a corrective turn that keeps the call's usage), so model
    output or tool results never make a turn uncommittable.

    Raises ``CommitConflict`` (the run moved on) and ``EventTooLarge`` (even the shrunk
    record does not fit: the caller ends the run ``checkpoint_failed``).
    """
    after = await off_loop(run.config, kernel.advance, run.state, record, run.config.limits)
    try:
        return record, await _append_turn(bus, request, run, after, record, owner)
    except EventTooLarge as err:
        log.warning("turn %s: %s; committing it shrunk", request.msg_id, err)
        record = kernel.shrink_record(record, size=err.size, cap=err.cap)
        after = await off_loop(run.config, kernel.advance, run.state, record, run.config.limits)
        return record, await _append_turn(bus, request, run, after, record, owner)


async def _append_turn(
    bus: Bus,
    request: TurnRequest,
    run: history.LoadedRun,
    after: kernel.RunState,
    record: kernel.TurnRecord,
    owner: str,
) -> history.LoadedRun:
    event = RunEvent(
        "turn",
        request.run_uid,
        after.summary(),
        record=record,
        time=time.time(),
        owner=owner,
        stored_before=run.stored,
    )
    seq = await bus.append_event(
        request.namespace, request.name, event, expected_seq=request.expected_seq
    )
    stored = run.stored + len(event.encode())
    return dataclasses.replace(run, state=after, seq=seq, committer=owner, stored=stored)


def _turn_ref(request: TurnRequest, config: protocol.RunConfig) -> TurnRef:
    """The ledger's name of ``request``'s turn: of its run's tenant, and of the run's life its
    admission sealed (``config.reruns``), so that a rerun's slot refuses this delivery if the
    run runs again meanwhile (``TurnRef.life``)."""
    return TurnRef(
        config.tenant,
        request.run_uid,
        request.namespace,
        request.name,
        request.turn,
        life=config.reruns,
    )


def _storage_full(run: history.LoadedRun, settings: ConsumerSettings) -> str:
    """Why a run whose events reached the per-run bound ends (before another model call)."""
    return (
        f"the run's events take {run.stored} bytes of the event stream, at its limit of "
        f"{settings.run_event_max_bytes} (AGENTRUN_RUN_EVENT_MAX_BYTES); no more turns can be "
        "checkpointed"
    )


class Committed(NamedTuple):
    """A turn this worker committed: its record, the state after it, its phase timings."""

    record: kernel.TurnRecord
    after: kernel.RunState
    clock: PhaseClock


@dataclasses.dataclass(slots=True)
class _Running:
    """One delivery of a TurnRequest being handled here, and why it was cut, if it was."""

    msg_id: str
    task: asyncio.Task[None]
    """Its handler's task."""
    cancelled: bool = False
    """Its run was cancelled or deleted: the turn is void (acked)."""
    lost: bool = False
    """Its ledger hold is gone: the turn is left to whichever delivery has it, or to
    redelivery."""
    waiting: bool = False
    """It waits for room in the worker's turn memory (nothing read, held or called yet)."""


class TurnConsumer:
    """Runs turns pulled from the shared ``agentrun-workers`` consumer until stopped."""

    def __init__(
        self,
        bus: Bus,
        deps: TurnDeps,
        settings: ConsumerSettings,
        *,
        seals: Verifier,
        ledger: LedgerStore | None = None,
    ) -> None:
        """``seals``: checks that a run's config is the operator's; ``ledger``: the tenant
        budget ledger (``None``: no tenant budgets, for tests)."""
        self.bus = bus
        self.seals = seals
        self.deps = deps
        self.settings = settings
        self.ledger = ledger
        self._holds: dict[str, TurnHold] = {}
        """Run uid → the ledger hold of its turn running here (each delivery removes only its
        own, as from ``_inflight``)."""
        self.cache = history.RunCache()
        self.memory = memory.TurnMemory(
            settings.turn_memory_bytes, shares=settings.turn_memory_shares
        )
        self._inflight: dict[str, _Running] = {}
        """Run uid → the delivery of its TurnRequest running here: the latest, when the run's
        next turn came while the handler of the one before was still ending (its commit
        landed, its hold settling, its ack on the way). A handler removes only its own entry,
        never the next turn's: a cancel or a lost hold must still find that one."""
        self._stopping = asyncio.Event()
        self.turns_committed = 0

    def stop(self) -> None:
        """Stop fetching; the turns in flight get ``settings.drain`` seconds to commit, then
        those still running are cancelled and naked for another worker. Heartbeats, ledger
        hold refreshes and cancellation broadcasts go on meanwhile. A turn still waiting for
        room in the turn memory is naked at once."""
        if not self._stopping.is_set():
            log.info(
                "stopping: no new turns; %d in flight get %.0fs to finish",
                len(self._inflight),
                self.settings.drain,
            )
        self._stopping.set()
        for running in self._inflight.values():
            if running.waiting:  # not started: another worker takes it now, not after the drain
                running.task.cancel()

    @property
    def draining(self) -> bool:
        """Whether ``stop`` was called (the worker takes no new turns)."""
        return self._stopping.is_set()

    @property
    def in_flight(self) -> int:
        """Turns this worker is running now."""
        return len(self._inflight)

    async def _on_cancel(self, run_uid: str) -> None:
        """The run was cancelled or deleted (its broadcast): cancel its turn running here —
        a cut of the tenant's, so a model call awaiting its answer is charged its prompt's
        bound (``budget.SpendWatch``)."""
        running = self._inflight.get(run_uid)
        if running is not None:
            running.cancelled = True
            running.task.cancel()
        self.cache.drop(run_uid)

    def _hold_lost(self, run_uid: str) -> None:
        """The ledger no longer has the hold of the run's turn running here (swept as expired
        while this worker was slow, or taken by another delivery of the turn): its budget is
        held no more, so the turn is cancelled — its model call cut, charged what it used
        (``budget.SpendWatch``) — and its TurnRequest left to whichever delivery has the turn,
        or to redelivery."""
        running = self._inflight.get(run_uid)
        if running is not None and not running.lost:
            log.warning("the ledger hold of run %s is gone: its turn here stops", run_uid)
            running.lost = True
            running.task.cancel()

    async def run(self) -> None:
        """Fetch and dispatch until ``stop``; returns once every turn in flight committed or,
        past the drain time, was cancelled and handed back (naked)."""
        await self.bus.on_cancel(self._on_cancel)
        metrics.CONCURRENCY.set(self.settings.concurrency)
        metrics.TURN_MEMORY_LIMIT.set(self.settings.turn_memory_bytes)
        await self.bus.consume(
            self.bus.turn_subscription,
            self._handle,
            stopping=self._stopping,
            concurrency=self.settings.concurrency,
            drain=self.settings.drain,
        )

    async def _heartbeat(self, msg: Msg, run_uid: str) -> None:
        """Every ``heartbeat`` seconds until cancelled: tell NATS the message is in progress,
        and refresh the run's hold, each on a cadence of its own. A refresh is a ledger write
        that can wait seconds on a contended tenant entry; were the signal to wait for it,
        JetStream would redeliver the turn (past ``ack_wait``) to another worker, whose model
        call would be charged as abandoned. Either's failure is left to its next pass."""

        async def signal() -> None:
            with contextlib.suppress(Exception):
                await msg.in_progress()

        async def refresh() -> None:
            hold = self._holds.get(run_uid)
            if hold is not None and not await hold.refresh():
                self._hold_lost(run_uid)

        async with asyncio.TaskGroup() as group:
            for beat, what in ((signal, "heartbeat"), (refresh, "hold refresh")):
                group.create_task(
                    loops.every(
                        self.settings.heartbeat,
                        beat,
                        what=f"{what} of run {run_uid}",
                        wait_first=True,
                    )
                )

    async def _handle(self, msg: Msg) -> None:
        try:
            request = protocol.decode_turn_request(msg.data)
        except protocol.UnsupportedSchema as err:  # a newer operator wrote it: not ours to run
            log.warning("leaving a TurnRequest for a newer worker: %s", err)
            await msg.nak(delay=NEWER_SCHEMA_DELAY)
            return
        except ValueError as err:  # pydantic.ValidationError included
            log.error("dropping a malformed TurnRequest: %s", err)
            await msg.term()
            return
        running = self._inflight.get(request.run_uid)
        if running is not None and running.msg_id == request.msg_id:
            # JetStream redelivered the turn this worker is running (its heartbeats came later
            # than ack_wait on a loaded machine): the delivery in progress heartbeats and acks
            # the message, and a second model call would only be charged as abandoned
            log.info(
                "TurnRequest %s is running here already; leaving it to that delivery",
                request.msg_id,
            )
            return
        published = msg.metadata.timestamp  # the stream's time of the (first) publication
        if published is not None:
            metrics.TURN_QUEUE_WAIT.observe(max(0.0, time.time() - published.timestamp()))
        beat = asyncio.create_task(self._heartbeat(msg, request.run_uid))
        metrics.IN_FLIGHT.inc()
        task = asyncio.current_task()
        assert task is not None
        mine = self._inflight[request.run_uid] = _Running(request.msg_id, task)
        try:
            await self._turn_within_memory(msg, request, mine)
        except asyncio.CancelledError:
            if not await self._cut_short(msg, request, mine):
                raise
        except Exception as err:
            self.cache.drop(request.run_uid)
            await self._failed(msg, request, err)
        finally:
            metrics.IN_FLIGHT.dec()
            beat.cancel()
            if self._inflight.get(request.run_uid) is mine:  # not the run's next turn's
                del self._inflight[request.run_uid]

    async def _turn_within_memory(self, msg: Msg, request: TurnRequest, mine: _Running) -> None:
        """Run the turn once its memory is reserved from its tenant's share of the worker's
        (``memory.TurnMemory``, by the run's stored bytes the request carries), waiting for
        room meanwhile (heartbeating, cancelled by ``stop``)."""
        tenant = msg.subject.removeprefix(TURN_SUBJECT_PREFIX)
        mine.waiting = True
        metrics.TURNS_WAITING_MEMORY.inc()
        try:
            async with self.memory.reserved(tenant, request.stored):
                mine.waiting = False
                metrics.TURNS_WAITING_MEMORY.dec()
                metrics.TURN_MEMORY.set(self.memory.held)
                await self._turn(msg, request)
        finally:
            if mine.waiting:  # cancelled while it waited
                mine.waiting = False
                metrics.TURNS_WAITING_MEMORY.dec()
            metrics.TURN_MEMORY.set(self.memory.held)  # given back

    async def _cut_short(self, msg: Msg, request: TurnRequest, running: _Running) -> bool:
        """The turn running here was cancelled: its run is being stopped (its message acked:
        the turn is void), or its hold is gone (left to the delivery that has the turn, or to
        redelivery) — True; or this worker is stopping (naked: another worker takes it) —
        False, and the cancellation goes on."""
        if running.cancelled:
            await msg.ack()
            return True
        if running.lost:
            return True
        log.info("turn %s cancelled while stopping; another worker takes it", request.msg_id)
        with contextlib.suppress(Exception):
            await msg.nak()
        return False

    async def _failed(self, msg: Msg, request: TurnRequest, err: Exception) -> None:
        """A turn raised. NATS, ledger or API-server trouble is retried by redelivery (a
        damaged tenant ledger entry holds the run's turns until it is repaired; no delivery
        limit drops the turn meanwhile); anything else (a payload over
        the server's limit even once shrunk, a bug) ends the run ``checkpoint_failed`` — at
        once for a payload, on its second failure otherwise: each retry calls the model again,
        and a deterministic error would fail the same way."""
        transient = is_transient(err)  # the run waits, not fails
        delivered = msg.metadata.num_delivered or 1
        too_large = isinstance(err, nats.errors.MaxPayloadError | EventTooLarge)
        if transient or (delivered < 2 and not too_large):
            log.warning("turn %s failed (%r); it will be redelivered", request.msg_id, err)
            slow = isinstance(err, LedgerUnavailable | LedgerCorrupt | SecretUnavailable)
            delay = NEWER_SCHEMA_DELAY if isinstance(err, protocol.UnsupportedSchema) else 1.0
            with contextlib.suppress(Exception):
                await msg.nak(delay=5.0 if slow else delay)
            return
        log.error("turn %s failed for good: %r", request.msg_id, err, exc_info=err)
        why = display.KNOWN.redact(f"{type(err).__name__}: {err}")  # an error may quote a secret
        message = f"turn {request.turn} could not be committed: {why}"[:1000]
        with contextlib.suppress(Exception):
            await self._commit_failure(request, message)
        with contextlib.suppress(Exception):
            await msg.ack()

    async def _commit_failure(self, request: TurnRequest, message: str) -> None:
        last = await self._last_event(request)
        if last is None or last.seq != request.expected_seq or last.phase.is_terminal:
            return
        state = kernel.stop(last.state(), kernel.Phase.CHECKPOINT_FAILED, message)
        event = last.stopped(state, time=time.time())
        with contextlib.suppress(CommitConflict):
            await self.bus.append_event(
                request.namespace, request.name, event, expected_seq=request.expected_seq
            )

    async def _last_event(self, request: TurnRequest) -> RunEvent | None:
        """The run's last event, read again ``BEHIND_DELAY`` seconds apart (up to
        ``BEHIND_DELIVERIES`` reads) while it ends before the request's base event: a stream
        leader just elected may answer before it applied what was acknowledged (NATS ADR-53),
        and a failure written on a read so behind would be dropped as stale."""
        for _ in range(BEHIND_DELIVERIES - 1):
            last = await self.bus.last_event(request.namespace, request.name)
            if last is not None and last.seq >= request.expected_seq:
                return last
            await asyncio.sleep(BEHIND_DELAY)
        return await self.bus.last_event(request.namespace, request.name)

    async def _turn(self, msg: Msg, request: TurnRequest) -> None:
        started = time.perf_counter()
        if (msg.metadata.num_delivered or 1) > 1:  # the turn may have committed elsewhere:
            self.cache.drop(request.run_uid)  # read the run's events, not what this worker saw
        try:
            run = await history.load(self.bus, self.cache, request, seals=self.seals)
        except history.CorruptHistory as err:
            log.warning(
                "skipping turn %s of %s/%s: %s", request.turn, request.namespace, request.name, err
            )
            await msg.ack()
            return
        except Untrusted as err:
            metrics.record_refusal(err.fault)
            log.warning("refused turn %s: %s", request.msg_id, err)
            await msg.ack()
            return
        run = await self._runnable(msg, request, run)
        if run is None:
            return
        if run.stored >= self.settings.run_event_max_bytes:
            await self._commit_failure(request, _storage_full(run, self.settings))
            await msg.ack()
            return
        metrics.know_run(run.config, catalog=self.deps.catalog)
        if self.ledger is None:
            committed = await self._run_turn(msg, request, run, None)
        else:
            async with self.ledger.turn_hold(
                _turn_ref(request, run.config),
                ttl=self.settings.hold_ttl,
                prior_owner=run.committer,
                moved_on=functools.partial(self._moved_on, request),
            ) as hold:
                self._holds[request.run_uid] = hold
                try:
                    committed = await self._run_turn(msg, request, run, hold)
                finally:
                    if self._holds.get(request.run_uid) is hold:  # not the next turn's
                        del self._holds[request.run_uid]
        if committed is not None:
            self._observe(committed, run, started=started)
        await msg.ack()

    async def _runnable(
        self, msg: Msg, request: TurnRequest, run: history.LoadedRun | None
    ) -> history.LoadedRun | None:
        """``run`` if its turn is to be run now; else ``None``, its message naked or acked here.

        A history read ending before the request's base event (``run`` None or its ``seq``
        below ``expected_seq``) is *behind*, not stale: the request was built on an event the
        stream acknowledged, so the read missed it (a server that had not applied it yet, a
        leader just elected). It is naked to be read again ``BEHIND_DELAY`` seconds later, up
        to ``BEHIND_DELIVERIES`` deliveries (then taken as stale: a deleted run's purged
        events). A request whose base is not the run's last event, or for a turn the run is
        not at, is stale and acked without running."""
        delivered = msg.metadata.num_delivered or 1
        if (run is None or run.seq < request.expected_seq) and delivered < BEHIND_DELIVERIES:
            seen = 0 if run is None else run.seq
            log.warning(
                "turn %s: the run's events read end at %d, before the request's base %d; "
                "reading them again",
                request.msg_id,
                seen,
                request.expected_seq,
            )
            self.cache.drop(request.run_uid)
            await msg.nak(delay=BEHIND_DELAY)
            return None
        if (
            run is None
            or run.seq != request.expected_seq
            or run.state.turn != request.turn
            or run.state.phase is not kernel.Phase.RUNNING
        ):
            log.info("stale TurnRequest %s (run moved on); acking", request.msg_id)
            await msg.ack()
            return None
        return run

    async def _moved_on(self, request: TurnRequest) -> bool:
        """Whether the run's events (read from the stream's leader) end past ``request``'s
        base, or are gone: its turn was committed by another delivery, or the run deleted."""
        last = await self.bus.last_event(request.namespace, request.name)
        return last is None or last.seq != request.expected_seq

    async def _run_turn(
        self, msg: Msg, request: TurnRequest, run: history.LoadedRun, hold: TurnHold | None
    ) -> Committed | None:
        """Execute and commit the turn, then settle its hold; ``None`` if the commit lost."""
        clock = PhaseClock()
        parent = telemetry.context_of((msg.headers or {}).get("traceparent"))
        token = otel_context.attach(parent) if parent is not None else None
        try:
            record = await execute_turn(self.deps, run.config, run.state, clock=clock, hold=hold)
        finally:
            if token is not None:
                otel_context.detach(token)
        owner = "" if hold is None else hold.commit_owner  # names the call the commit holds
        try:
            record, committed = await commit_turn(self.bus, request, run, record, owner=owner)
        except CommitConflict as err:  # the block's exit charges this delivery's call
            log.info("turn %s not committed: %s", request.msg_id, err)
            self.cache.drop(request.run_uid)
            return None
        after = committed.state
        self.cache.put(committed)
        self.turns_committed += 1
        if hold is not None:
            try:
                await hold.settle(after)
            except Exception as err:  # committed: the next settlement or the run's close
                # charges the run's cumulative usage, and the operator frees the hold
                log.warning("turn %s committed but not settled: %r", request.msg_id, err)
        return Committed(record, after, clock)

    def _observe(self, committed: Committed, run: history.LoadedRun, *, started: float) -> None:
        """The turn's metrics: counters, and its duration per phase."""
        record, after, clock = committed
        # MCP tools (the config's) are labelled by name up to a bound per tenant (metrics)
        metrics.record_turn(
            record, before=run.state, after=after, config=run.config, catalog=self.deps.catalog
        )
        spent = clock.seconds
        metrics.TURN_DURATION.labels(phase="model").observe(spent["model"])
        metrics.TURN_DURATION.labels(phase="tools").observe(spent["tools"])
        overhead = time.perf_counter() - started - spent["model"] - spent["tools"]
        metrics.TURN_DURATION.labels(phase="overhead").observe(max(0.0, overhead))
