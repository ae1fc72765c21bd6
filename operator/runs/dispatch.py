"""Dispatch: consume committed run events; publish the next TurnRequest or end the run.

The operator's view of a run (``RunView``) is rebuilt from the run's events, never trusted
across restarts: on resume it reads the last event and re-dispatches (the ``Nats-Msg-Id``
``<run-uid>:<turn>@<expected-seq>`` makes a repeated dispatch a no-op inside the duplicate
window, and the worker's compare-and-set commit makes a late duplicate harmless). Ends decided
outside a turn — the wall-clock deadline, cancellation — are appended as ``stop`` events with
the same compare-and-set, so they cannot interleave with a worker's commit.

A running run's next turn is handed to the ``fairness.TurnGate``, which publishes it at once
while the work queue is short and nothing waits, else in fair order across tenants (the
tenant with the fewest turns in flight first, within its AgentTenant's ``maxConcurrentTurns``).

The dispatcher is the one owner of the live-run views: nothing else holds or changes a
``RunView``. A running run whose TurnRequest left the work queue without a newer event is found
by ``orphans.OrphanWatch`` from snapshots (``pending_turns``) and dispatched again through
``redispatch`` (or ended through ``end``). Other kinds reach the live runs through the
``LiveRuns`` port (``ports``).

The dispatcher follows a run only through a config the operator sealed for that run's subject,
and applies an ``admitted`` or ``approval`` event only when it is the operator's (``seals``): a
run whose stream holds anything else is refused and ends ``checkpoint_failed``; a run admitted
before seals existed is re-sealed once the API server vouches for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Protocol

import cachetools
from nats.aio.msg import Msg

from agentrun import display, kernel, loops, metrics, protocol, telemetry
from agentrun.bus import Bus, CommitConflict
from agentrun.protocol import RunConfig, RunEvent, TurnRequest
from agentrun.trust import SealFault, Untrusted

from ..platform.events import EventRecorder
from ..platform.failures import Failures
from ..platform.shards import ALL_OF_ONE, CLUSTER_SHARD, Ownership
from . import news, status, views
from .fairness import BACKLOG, ReadyTurn, TurnCaps, TurnGate
from .keys import RunKey
from .ports import PendingTurn
from .seals import RunSeals, untrusted
from .views import RunView
from .writer import StatusWriter, Written

log = logging.getLogger(__name__)

STOP_ATTEMPTS = 8
ENDED_MEMORY = 100_000
"""Runs remembered as counted ended (the oldest forgotten first)."""


DIGEST_SHOWN = 80
"""Characters of a decision's digest a refusal quotes (a digest has 71: ``sha256:`` and 64
hex digits; the annotation holding it may have some 256 KiB)."""


def shown_digest(digest: str) -> str:
    """``digest`` as a message quotes it: made printable, cut to ``DIGEST_SHOWN``."""
    text = display.printable(digest, newlines=False)
    return text if len(text) <= DIGEST_SHOWN else text[: DIGEST_SHOWN - 1] + "…"


def undecidable(last: RunEvent | None, *, digest: str) -> str | None:
    """Why a decision naming ``digest`` cannot apply to the run whose last event is ``last``
    (none yet; the run is not waiting for a person; another call is the one waiting), or
    ``None`` when it may (the replay of the run's events decides). Pure."""
    if last is None:
        return "the run has no events"
    summary = last.summary
    if summary.phase is not kernel.Phase.AWAITING_APPROVAL:
        return f"the run is {summary.phase.value}, not waiting for an approval"
    waiting = summary.pending_approval
    if waiting is not None and waiting.digest != digest:
        return (
            f"digest {shown_digest(digest)!r} does not match the pending call {waiting.id} "
            f"({waiting.digest})"
        )
    return None


class RunEndListener(Protocol):
    """Told when a run ended or was deleted (``RunSettlement``)."""

    async def settle_ended_run(
        self, event: RunEvent, *, tenant: str, uid: str, life: int | None = None
    ) -> None:
        """Settle the run's tenant-ledger entry from its last event, that of its life
        ``life`` (the ``reruns`` its admission sealed); may raise (the ledger sweep closes runs
        it finds ended)."""


class QueuedCounts(Protocol):
    """Queued runs per tenant (``QueueBoard``), for ``agentrun_runs_in_phase``."""

    def queued_counts(self) -> Mapping[str, int]:
        """Runs waiting per tenant as of the last pump."""


@dataclasses.dataclass(frozen=True, slots=True)
class DispatchDeps:
    """The dispatcher's collaborators besides the bus and the status writer."""

    ends: RunEndListener
    """Settles each ended run's ledger entry."""
    queues: QueuedCounts
    """How many runs wait per tenant (the phase gauge)."""
    events: EventRecorder
    """Records approval requests and ends as Kubernetes Events."""
    seals: RunSeals
    """Seals what the dispatcher appends; judges what it reads."""
    caps: TurnCaps
    """Each tenant's ``maxConcurrentTurns`` (``fairness``)."""
    backlog: int = BACKLOG
    """``fairness.Backlog.limit`` (``AGENTRUN_TURN_BACKLOG``)."""
    ownership: Ownership = ALL_OF_ONE
    """The shards whose runs this process follows (one consumer each)."""


def subject_key(subject: str) -> tuple[str, str]:
    """``agentrun.event.<ns>.<run>`` → (namespace, name), undoing the ``.``→``_`` mapping."""
    _, _, namespace, name = subject.split(".", 3)
    return namespace, name.replace("_", ".")


class Dispatcher:
    """Owns the event consumer, the deadline timers and the run views."""

    def __init__(
        self,
        bus: Bus,
        writer: StatusWriter,
        deps: DispatchDeps,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``deps``: see ``DispatchDeps``; ``clock`` is epoch seconds. Runs whose object
        ``writer`` finds gone are stopped by ``wiring.stop_deleted``."""
        self.bus = bus
        self.events = deps.events
        self.writer = writer
        self.ends = deps.ends
        self.queues = deps.queues
        self.seals = deps.seals
        self.clock = clock
        self.gate = TurnGate(self, bus, caps=deps.caps, limit=deps.backlog)
        """Publishes the running runs' next turns, fairly across tenants."""
        self.failures = Failures(log, what="processing")
        """Events whose processing failed, by (run uid, sequence); each logged once."""
        self._views: dict[str, RunView] = {}
        """The live runs by uid (admitted, not ended, not forgotten); private to this owner."""
        self._stopping = asyncio.Event()
        self._ended: cachetools.FIFOCache[str, None] = cachetools.FIFOCache(ENDED_MEMORY)
        self._closed: cachetools.FIFOCache[str, None] = cachetools.FIFOCache(ENDED_MEMORY)
        """Runs whose end this process applied (their view dropped): not ``unfollowed`` while
        their status write is on its way."""
        self._handed: cachetools.FIFOCache[str, None] = cachetools.FIFOCache(ENDED_MEMORY)
        """Runs handed here by an admission (``start_run``) or a resume (``recover``): one of
        them left unfollowed lost its view; one never handed may still wait for kopf's
        start-up resume (``handed``)."""
        self.ownership = deps.ownership
        self._shards: cachetools.LRUCache[str, int] = cachetools.LRUCache(ENDED_MEMORY)
        """The shard of runs seen on a consumer (by uid), so that a run is read once."""
        """Runs already counted as ended (a redelivered terminal event is not counted twice)."""

    # --- admission and recovery -----------------------------------------------------------------

    async def start_run(self, config: RunConfig, *, start_time: float, generation: int) -> None:
        """Append the run's sealed ``admitted`` event (once: compare-and-set on an empty
        subject).

        If the subject holds events of an older object with the same name, or an admission
        of this run the operator did not seal, or one of an earlier life of the run than
        ``config.reruns`` (each refused: counted and told), they are purged first. Turn 0 is
        dispatched by the event consumer when it sees the admission.
        """
        key = RunKey(config.namespace, config.name, config.uid)
        self._handed[config.uid] = None
        state = kernel.initial_state(goal=config.goal, instructions=config.instructions)
        event = self.seals.seal(
            RunEvent("admitted", config.uid, state.summary(), config=config, time=start_time)
        )
        seq = 0
        for _ in range(2):
            try:
                seq = await self.bus.append_event(
                    config.namespace, config.name, event, expected_seq=0
                )
                break
            except CommitConflict:
                first = await self.bus.first_event(config.namespace, config.name)
                if first is not None and first.run_uid == config.uid:
                    fault = self.seals.fault(first, key=key) or _life_fault(first, config.reruns)
                    if fault is None:
                        return  # admitted before a restart; recovery takes it from here
                    self.seals.report(key, untrusted(first, fault))
                log.warning(
                    "purging events of %s/%s that are not this run's", key.namespace, key.name
                )
                await self.bus.purge_run(config.namespace, config.name)
        view = RunView.of(config, start_time=start_time, generation=generation, admitted_seq=seq)
        self._track(view)

    async def recover(
        self, namespace: str, name: str, uid: str, *, generation: int, reruns: int = 0
    ) -> bool:
        """Resume a run after an operator restart; False when the run has no events of ``uid``
        of its life ``reruns`` (its object's ``status.reruns``) or a later one.

        Re-dispatches the pending turn of a running run, re-arms its deadline, and re-projects
        the status of a finished one; a run whose stream the operator did not seal is refused
        (or re-sealed, when admitted before seals and vouched for: ``seals``), and an
        admission of an earlier life (a copy appended while the rerun waits in its queue) is
        refused and not followed: the rerun is admitted as it would have been.
        """
        self._handed[uid] = None
        key = RunKey(namespace, name, uid)
        first = await self.bus.first_event(namespace, name)
        if first is None or first.run_uid != uid or first.config is None:
            return False
        if self._earlier_life(key, first, reruns):
            return False
        view = self._views.get(uid) or await self._trusted_view(key, first, generation=generation)
        if view is None:
            return True  # refused (ended), or re-sealed (followed once its re-seal is read)
        last = await self.bus.last_event(namespace, name)
        if last is None or last.run_uid != uid:
            return False  # purged meanwhile (deleted while the orphan watch read it)
        view = self._track(view)
        if await self._judge(view, last):
            await self._apply(view, last)
        return True

    async def project_restored(
        self, namespace: str, name: str, uid: str, *, original: str, generation: int
    ) -> bool:
        """A copy ``uid`` of run ``original`` restored from a backup (``recovery.RESTORED``):
        if the subject still holds the original's events, admitted under the operator's seal,
        and they end it, project that end into the copy's status (no end counted, no Event:
        the run ended long ago) and return True; else False (the copy is then ended
        ``checkpoint_failed``). Raises what NATS raises."""
        first = await self.bus.first_event(namespace, name)
        if first is None or first.config is None:
            return False
        if self.seals.fault(first, key=RunKey(namespace, name, original)) is not None:
            return False
        last = await self.bus.last_event(namespace, name)
        if last is None or last.run_uid != original or not last.phase.is_terminal:
            return False
        body = status.project(
            last.summary,
            seq=last.seq,
            start_time=first.time,
            event_time=last.time or first.time,
            generation=generation,
            tenant=first.config.tenant,
        )
        body["usage"]["eventBytes"] = last.stored
        body["budget"] = status.admitted_budget(first.config, start_time=first.time)
        self.writer.submit(RunKey(namespace, name, uid), body, seq=last.seq, terminal=True)
        return True

    async def _trusted_view(
        self, key: RunKey, first: RunEvent, *, generation: int = 1
    ) -> RunView | None:
        """A view of run ``key`` if the operator sealed its config (``seals.trusted``)."""
        trusted = await self.seals.trusted(key, first)
        if trusted is None:
            return None
        return RunView.of(
            trusted.config,
            start_time=trusted.start_time,
            generation=generation,
            admitted_seq=trusted.admitted_seq,
        )

    def _earlier_life(self, key: RunKey, first: RunEvent, reruns: int) -> bool:
        """Whether ``first``, run ``key``'s admission, is of an earlier life than ``reruns``
        (its object's ``status.reruns``); such a one is refused (counted and told), never
        followed."""
        fault = _life_fault(first, reruns)
        if fault is not None:
            self.seals.report(key, untrusted(first, fault))
        return fault is not None

    def is_tracked(self, uid: str) -> bool:
        """Whether the run has a live view here (admitted, not ended, not forgotten)."""
        return uid in self._views

    def _track(self, view: RunView) -> RunView:
        """Follow ``view``'s run, unless a view of it is followed already; returns the one
        followed, which every caller goes on with. (A caller that awaited after finding no
        view may find one tracked meanwhile: the event consumer builds a view of a run whose
        ``admitted`` event it sees while ``start_run`` is between its append and its track.
        Going on with a second view would hand the turn gate a turn its tracked view does
        not wait on, and the gate drops it.) The view's deadline timer starts once: a view
        followed already (``recover`` of a run the event consumer saw first, as after every
        share change) keeps the timer it has, so ``cancel_timers`` finds every timer; one whose
        timer ended (its stop failed) is armed again."""
        followed = self._views.setdefault(view.uid, view)
        if followed is view and not view.terminal and (view.timer is None or view.timer.done()):
            view.timer = asyncio.create_task(self._deadline(view), name=f"deadline-{view.uid}")
        return followed

    # --- the event consumer ---------------------------------------------------------------------

    def stop(self) -> None:
        """Stop the consumer loop and the turn gate."""
        self._stopping.set()
        self.gate.stop()

    async def run(self) -> None:
        """Consume ``AGENTRUN_EVENTS`` until ``stop``: with the durable ``agentrun-operator``
        consumer (one shard), else with one durable consumer per owned shard
        (``protocol.operator_consumer``; made anew, after the events ``agentrun-operator``
        acked), each acting on its shard's runs only and acking the others' events; each one
        event at a time in stream order."""
        shards = self.ownership.shards
        await asyncio.gather(
            *(
                self.bus.consume(
                    functools.partial(
                        self.bus.event_subscription,
                        protocol.operator_consumer(shard, shards),
                        seated_after=protocol.OPERATOR_CONSUMER if shards > 1 else "",
                    ),
                    functools.partial(self._consume, shard=shard),
                    stopping=self._stopping,
                )
                for shard in sorted(self.ownership.owned)
            )
        )

    async def _consume(self, msg: Msg, *, shard: int = CLUSTER_SHARD) -> None:
        try:
            event = RunEvent.decode(msg.data, seq=msg.metadata.sequence.stream)
        except protocol.UnsupportedSchema as err:  # a newer worker wrote it, mid-upgrade
            log.error("leaving an event on %s for a newer operator: %s", msg.subject, err)
            return await msg.nak(delay=30.0)
        except (ValueError, KeyError, TypeError) as err:
            log.error("dropping an undecodable event on %s: %s", msg.subject, err)
            await msg.term()
            return
        try:
            ours = await self._in_shard(msg.subject, event.run_uid, shard)
        except Exception as err:  # NATS away: the event comes again
            log.warning("could not read the tenant of the run of %s: %r", msg.subject, err)
            return await msg.nak(delay=5.0)
        if not ours:
            return await msg.ack()  # another shard's run: its own consumer follows it
        key, subject = (event.run_uid, event.seq), f"event {event.seq} on {msg.subject}"
        try:
            await self.on_event(msg.subject, event)
        except Exception as err:
            await self._event_failed(msg, event, err)
            return
        self.failures.succeeded(key, subject=subject)
        await msg.ack()

    async def _in_shard(self, subject: str, uid: str, shard: int) -> bool:
        """Whether run ``uid`` (events on ``subject``) belongs to shard ``shard``: the shard of
        the tenant its sealed ``admitted`` event names (a run whose events hold no admission
        of it is shard 0's, which ignores it). Raises what NATS raises."""
        if self.ownership.shards == 1:
            return True
        view = self._views.get(uid)
        if view is not None:
            return self.ownership.shard(view.tenant) == shard
        known = self._shards.get(uid)
        if known is None:
            first = await self.bus.first_event(*subject_key(subject))
            tenant = first.config.tenant if first and first.run_uid == uid and first.config else ""
            known = self._shards[uid] = self.ownership.shard(tenant)
        return known == shard

    async def _event_failed(self, msg: Msg, event: RunEvent, err: Exception) -> None:
        """Processing ``event`` raised: a transient failure is redelivered (logged once);
        a permanent one is retried once, then ends the run ``checkpoint_failed`` naming it
        (its own ``stop`` event follows) and the event is dropped, so nothing retries it for
        ever."""
        key, subject = (event.run_uid, event.seq), f"event {event.seq} on {msg.subject}"
        failure = self.failures.failed(key, err, subject=subject)
        if not failure.final:
            await msg.nak(delay=5.0 if failure.transient else 1.0)
            return
        self.failures.forget(key)
        message = f"processing its event {event.seq} failed twice: {type(err).__name__}: {err}"
        namespace, name = subject_key(msg.subject)
        try:
            await self.end(
                namespace, name, event.run_uid, kernel.Phase.CHECKPOINT_FAILED, message[:1000]
            )
        except Exception as ending:  # NATS away: the event comes again, and so do we
            self.failures.failed(key, ending, subject=subject)
            await msg.nak(delay=5.0)
            return
        await msg.term()

    async def on_event(self, subject: str, event: RunEvent) -> None:
        """Project one committed event and act on it (next turn, or nothing once terminal);
        an event the operator should have sealed and did not ends the run (``_judge``). A run
        not followed here yet (after a restart, a failover, a share change) is followed from
        its stream only while its object is there with its uid (``StatusWriter.exists``: known
        from the watch, else read once): one deleted while no operator ran, whose name a new
        AgentRun may hold already, gets no further turn, and is stopped as a deleted run."""
        namespace, name = subject_key(subject)
        view = self._views.get(event.run_uid)
        if view is None:
            if self.seals.is_refused(event.run_uid):
                return  # refused already: its stop, or more of what was refused
            first = await self.bus.first_event(namespace, name)
            if first is None or first.run_uid != event.run_uid or first.config is None:
                return  # events of a deleted run
            key = RunKey(namespace, name, event.run_uid)
            view = await self._trusted_view(key, first)  # a forged one is refused and ended
            if view is None:
                return
            if not await self.writer.exists(key):
                return  # deleted while no operator followed it: stopped as such (next_gone)
            if self._earlier_life(key, first, self.writer.reruns(key)):
                return  # its rerun waits to be admitted: ``start_run`` purges the copy
            view = self._track(view)
        if not await self._judge(view, event):
            return
        seq, summary = view.seq, view.summary
        try:
            await self._apply(view, event)
        except BaseException:
            view.seq, view.summary = seq, summary  # redelivered, it is applied again
            raise

    async def _judge(self, view: RunView, event: RunEvent) -> bool:
        """Whether ``event`` of the followed run ``view`` may be applied (``seals.judge``)."""
        return await self.seals.judge(
            view.key, event, admitted_seq=view.admitted_seq, seen=view.seq, base=view.summary
        )

    async def _apply(self, view: RunView, event: RunEvent) -> None:
        if event.seq <= view.seq:
            return
        view.advance(event.seq, event.summary, at=event.time or self.clock(), stored=event.stored)
        if event.kind == "turn":  # a worker committed: its turn is done, its slot free
            self.gate.committed(view.uid)
        else:
            self.gate.moved_on(view.uid)
        phase = event.phase
        on_end: Callable[[], None] | None = None
        if phase is kernel.Phase.RUNNING:
            request = TurnRequest(
                view.uid,
                view.namespace,
                view.name,
                event.summary.turn,
                event.seq,
                traceparent=view.traceparent,
                stored=event.stored,
            )
            view.queued_seq, view.redispatches = 0, 0  # in the work queue once published
            view.checked_at = self.clock()  # handed to the gate (``offer_stranded``)
            await self.gate.offer(ReadyTurn(request, view.tenant, since=event.time))
        elif phase.is_terminal:
            on_end = self._ending(view, event)
            view.terminal = True
            if view.timer is not None and view.timer is not asyncio.current_task():
                view.timer.cancel()
            self._views.pop(view.uid, None)  # a redelivered event rebuilds it from the stream
            self._closed[view.uid] = None
            await self._settle_ended(view.tenant, view.uid, event, life=view.life)
        body = status.project(
            event.summary,
            seq=event.seq,
            start_time=view.start_time,
            event_time=event.time or self.clock(),
            generation=view.generation,
            tenant=view.tenant,
        )
        body["usage"]["eventBytes"] = event.stored  # what the tenant's storage bound counts
        body["budget"] = dict(view.budget)  # the caps it was admitted with: in every write
        urgent = phase is not kernel.Phase.RUNNING  # an end, or a person to ask: write now
        if event.summary.pending_approval is not None and not phase.is_terminal:
            news.record_approval_requested(self.events, view.key, event.summary.pending_approval)
        self.writer.submit(view.key, body, seq=event.seq, terminal=urgent, on_end=on_end)

    def _ending(self, view: RunView, event: RunEvent) -> Callable[[], None]:
        """What to do once this end is the one written (counted once, even across failover)."""
        return lambda: self._tell_end(view.key, event, tenant=view.tenant, view=view)

    def _tell_end(self, key: RunKey, event: RunEvent, *, tenant: str, view: RunView | None) -> None:
        """Run ``key`` ended with ``event``: counted once (``agentrun_runs_total``), its span
        emitted (when followed here: ``view``) and its end told in an Event."""
        if self.count_end(key.uid, event.state(), tenant=tenant):
            if view is not None:
                self._emit_run_span(view, event)
            model = view.agent_model if view is not None else None
            news.record_end(self.events, key, event.summary, model=model)

    async def _settle_ended(self, tenant: str, uid: str, event: RunEvent, *, life: int) -> None:
        try:
            await self.ends.settle_ended_run(event, tenant=tenant, uid=uid, life=life)
        except Exception as err:  # the ledger sweep closes runs it finds ended
            log.warning("ledger close of run %s failed: %r; the sweep will retry", uid, err)

    def count_end(self, uid: str, state: kernel.RunState, *, tenant: str) -> bool:
        """``agentrun_runs_total`` once per run, however often its end is seen; False if seen."""
        if uid in self._ended:
            return False
        self._ended[uid] = None
        metrics.record_end(state, tenant=tenant)
        return True

    def _emit_run_span(self, view: RunView, event: RunEvent) -> None:
        telemetry.emit_run_span(views.run_span(view, event.summary, end=event.time or self.clock()))

    def pending_turns(self) -> list[PendingTurn]:
        """Snapshots of the running runs' dispatched turns, for the orphan watch."""
        return [
            PendingTurn(
                key=view.key,
                tenant=view.tenant,
                turn=view.summary.turn,
                seq=view.seq,
                queued_seq=view.queued_seq,
                checked_at=view.checked_at,
                queued_at=view.queued_at,
                redispatches=view.redispatches,
            )
            for view in self._views.values()
            if not view.terminal
            and view.summary is not None
            and view.summary.phase is kernel.Phase.RUNNING
            and view.queued_seq
        ]

    def unfollowed(self) -> list[tuple[RunKey, Written]]:
        """The runs of this process's shards whose object shows them admitted and not ended
        (``StatusWriter.unfinished``) that it does not follow: no live view, not refused, no
        end applied here. For ``OrphanWatch``, which follows them again (``recover``) once they
        stay so."""
        return [(key, w) for key, w in self.writer.unfinished() if self._left_alone(key.uid)]

    def handed(self, uid: str) -> bool:
        """Whether run ``uid`` was handed here by its admission or a resume (``recover``,
        kopf's start-up among them) in this process's life."""
        return uid in self._handed

    def still_unfollowed(self, key: RunKey) -> bool:
        """Whether run ``key``, listed by ``unfollowed``, still is: not deleted, followed,
        refused or ended here since (``OrphanWatch`` asks before following each one)."""
        return self.writer.shows_unfinished(key) and self._left_alone(key.uid)

    def _left_alone(self, uid: str) -> bool:
        """Whether nothing here follows run ``uid``: no live view, not refused, no end
        applied or counted here."""
        return (
            uid not in self._views
            and uid not in self._ended
            and uid not in self._closed
            and not self.seals.is_refused(uid)
        )

    def waiting_runs(self, *, since: float) -> list[RunKey]:
        """The runs waiting for a person's decision since ``since`` (epoch seconds) or
        earlier, longest-waiting first."""
        waiting = [
            view
            for view in self._views.values()
            if not view.terminal and view.awaiting_since and view.awaiting_since <= since
        ]
        return [view.key for view in sorted(waiting, key=lambda view: view.awaiting_since)]

    async def offer_stranded(self, *, after: float) -> int:
        """Hand the turn gate again the turn of every running run that has neither a
        TurnRequest published nor a turn waiting in the gate, ``after`` seconds (epoch
        clock) after its turn was handed to the gate: a turn dropped between the two (no path
        is known to do so; this is the second line of defence, as ``OrphanWatch`` is for a
        TurnRequest lost from the queue). Same ``Nats-Msg-Id``: if the first copy was
        published after all, JetStream drops this one. Returns how many were offered."""
        now = self.clock()
        stranded = [
            view
            for view in self._views.values()
            if not view.terminal
            and view.summary is not None
            and view.summary.phase is kernel.Phase.RUNNING
            and not view.queued_seq
            and not self.gate.queue.holds(view.uid)
            and now - view.checked_at >= after
        ]
        for view in stranded:
            assert view.summary is not None
            turn = view.summary.turn
            log.warning(
                "%s/%s: turn %s was neither published nor waiting to be; handing it to the "
                "turn gate again",
                view.namespace,
                view.name,
                turn,
            )
            view.checked_at = now
            request = TurnRequest(
                view.uid,
                view.namespace,
                view.name,
                turn,
                view.seq,
                traceparent=view.traceparent,
                stored=view.stored,
            )
            await self.gate.offer(ReadyTurn(request, view.tenant, since=0.0))
        return len(stranded)

    def _current(self, turn: PendingTurn) -> RunView | None:
        """The live view ``turn`` was taken from, while it still waits on that turn."""
        view = self._views.get(turn.key.uid)
        if view is None or view.terminal or view.seq != turn.seq:
            return None
        return view

    def still_queued(self, turn: PendingTurn, *, at: float) -> None:
        """``turn``'s TurnRequest was seen in the work queue at ``at`` (epoch seconds)."""
        view = self._current(turn)
        if view is not None:
            view.checked_at = at

    async def redispatch(self, turn: PendingTurn) -> None:
        """Publish ``turn`` again (its TurnRequest was lost), under a fresh ``Nats-Msg-Id``
        (the attempt), through the turn gate; nothing when the run moved on meanwhile."""
        view = self._current(turn)
        if view is None:
            return
        view.redispatches += 1
        request = TurnRequest(
            view.uid,
            view.namespace,
            view.name,
            turn.turn,
            view.seq,
            traceparent=view.traceparent,
            stored=view.stored,
        )
        self.gate.moved_on(view.uid)  # the lost request counts no longer
        view.queued_seq = 0
        await self.gate.offer(ReadyTurn(request, view.tenant, since=0.0, attempt=view.redispatches))

    async def publish_ready(self, turn: ReadyTurn) -> bool:
        """Publish ``turn`` (``fairness.Publisher``) if its run still waits on it: its view
        records the TurnRequest's stream sequence for the orphan watch. False when the run
        moved on or ended meanwhile; raises what publishing raises."""
        view = self._views.get(turn.uid)
        if view is None or view.terminal or view.seq != turn.request.expected_seq:
            return False
        seq = await self.bus.publish_turn(turn.request, tenant=view.tenant, attempt=turn.attempt)
        if view.seq == turn.request.expected_seq:  # not moved on while publishing
            view.queued_seq, view.checked_at = seq, self.clock()
            view.queued_at = view.checked_at
        if turn.since:
            metrics.DISPATCH_LATENCY.observe(max(0.0, self.clock() - turn.since))
        return True

    def observe_phases(self) -> None:
        """Set ``agentrun_runs_in_phase`` from the live views (called before each scrape)."""
        counts = views.phase_counts(self._views.values(), self.queues.queued_counts())
        metrics.record_live_runs(counts, views.oldest_approvals(self._views.values()))

    async def watch_queue(self, *, interval: float = 5.0) -> None:
        """Keep the bus gauges (``metrics.record_bus``) and the phase gauge fresh, every
        ``interval`` seconds until ``stop``."""
        await loops.every(interval, self._gauge, what="bus gauges", stopping=self._stopping)

    async def _gauge(self) -> None:
        self.observe_phases()
        shards = self.ownership.shards
        consumers = [protocol.operator_consumer(s, shards) for s in sorted(self.ownership.owned)]
        metrics.record_bus(await self.bus.stats(event_consumers=consumers))

    # --- ends decided outside a turn ------------------------------------------------------------

    async def _deadline(self, view: RunView) -> None:
        await asyncio.sleep(max(0.0, view.deadline - self.clock()))
        try:
            await self.end(
                view.namespace,
                view.name,
                view.uid,
                kernel.Phase.DEADLINE_EXCEEDED,
                "spec.budget.timeout passed",
            )
        except Exception:
            log.exception("could not end %s/%s at its deadline", view.namespace, view.name)

    async def end(
        self, namespace: str, name: str, uid: str, phase: kernel.Phase, message: str
    ) -> bool:
        """Append a ``stop`` event ending the run with ``phase`` and tell workers to drop it.

        Returns False when the run has already ended (or has no events). Compare-and-set on
        the last event, retried a bounded number of times if a worker commits meanwhile.
        """
        for _ in range(STOP_ATTEMPTS):
            last = await self.bus.last_event(namespace, name)
            if last is None or last.run_uid != uid or last.phase.is_terminal:
                return False
            event = last.stopped(kernel.stop(last.state(), phase, message), time=self.clock())
            try:
                await self.bus.append_event(namespace, name, event, expected_seq=last.seq)
            except CommitConflict:
                continue
            await self.bus.broadcast_cancel(uid)
            return True
        raise RuntimeError(
            f"could not append a stop event to {namespace}/{name}: the run keeps moving"
        )

    async def decide(
        self, namespace: str, name: str, uid: str, *, digest: str, approved: bool, reviewer: str
    ) -> str | None:
        """Apply ``reviewer``'s decision on the run's pending held call: replay its events to
        the kernel state, let the kernel check the digest, append an ``approval`` event naming
        the reviewer (compare-and-set on the last event). Returns ``None`` on success, else why
        the decision was not applied (not waiting, digest mismatch, moved on). The run's last
        event is read first: a decision it shows cannot apply (`undecidable`) is refused
        without reading and replaying the whole run, which a namespace's reviewer could
        otherwise have the operator do at every annotation they set."""
        refused = undecidable(await self.bus.last_event(namespace, name), digest=digest)
        if refused is not None:
            return refused
        try:
            loaded = await self.seals.replay(RunKey(namespace, name, uid))
        except Untrusted as err:
            return f"the run's events are not the operator's: {err}"
        if loaded is None:
            return "the run has no events"
        try:
            state = kernel.resolve_approval(
                loaded.state, digest=digest, approved=approved, reviewer=reviewer
            )
        except ValueError as err:
            return str(err)
        event = self.seals.seal(
            RunEvent(
                "approval",
                uid,
                state.summary(),
                approval=protocol.Approval(digest, approved, reviewer, after=loaded.seq),
                time=self.clock(),
                owner=loaded.committer,
                stored_before=loaded.stored,
            )
        )
        try:
            await self.bus.append_event(namespace, name, event, expected_seq=loaded.seq)
        except CommitConflict as err:
            return str(err)
        return None

    async def forget(self, namespace: str, name: str, uid: str) -> None:
        """The AgentRun was deleted (its object is gone): stop it, settle its ledger entry,
        purge its events and its effect records, drop its view. The end it stops the run with
        is counted (``agentrun_runs_total``), traced and told in an Event here: its object is
        gone, so no status write can make it terminal. Only run ``uid``'s own events are
        touched: a new AgentRun of the same name, created at once, keeps its subject.

        Best effort with a bound (10 s): a dead NATS or a missing stream holds nothing up; the
        ledger sweep ends and settles a run whose object is gone and that nothing follows.
        """
        key = RunKey(namespace, name, uid)
        view = self._views.pop(uid, None)
        if view is not None and view.timer is not None:
            view.timer.cancel()
        self.gate.moved_on(uid)
        try:
            async with asyncio.timeout(10):
                stopped = await self.end(
                    namespace, name, uid, kernel.Phase.CANCELLED, "the AgentRun was deleted"
                )
                await self.bus.purge_effects(uid)
                own = await self._own_events(key)
                if own is None:
                    return  # nothing of its own left (a newer run's subject, or purged)
                first, last = own
                if first.config is not None and self.seals.fault(first, key=key) is None:
                    tenant = first.config.tenant
                    await self._settle_ended(tenant, uid, last, life=first.config.reruns)
                    if stopped:
                        self._tell_end(key, last, tenant=tenant, view=view)
                await self.bus.purge_run(namespace, name, through=last.seq)
        except Exception as err:
            log.warning("cleanup of deleted %s/%s incomplete: %s", namespace, name, err)
        finally:
            self.writer.forget(key)

    async def prepare_rerun(self, namespace: str, name: str, uid: str) -> None:
        """Before run ``uid`` is admitted again from turn 0 (``agentrun.dev/rerun``): stop
        following it, purge its subject (the previous run's events, or an older object's) and
        its effect records (the rerun runs its write tools again), and forget its end and its
        status (its next end is counted and written again). Raises what
        NATS raises."""
        view = self._views.pop(uid, None)
        if view is not None and view.timer is not None:
            view.timer.cancel()
        self.gate.moved_on(uid)
        await self.bus.purge_run(namespace, name)
        await self.bus.purge_effects(uid)  # the rerun's calls may be keyed as the first life's
        self._ended.pop(uid, None)
        self._closed.pop(uid, None)
        self.writer.forget(RunKey(namespace, name, uid))

    async def purge_deleted(self, namespace: str, name: str, uid: str) -> None:
        """A finished AgentRun was deleted: purge its effect records (keyed by its uid), and
        its events if they are still this run's (a new run of the same name keeps its own).
        Effect records hold its write calls' results for a week otherwise, counted against no
        tenant's storage once the run is gone."""
        key = RunKey(namespace, name, uid)
        self.writer.forget(key)
        await self.bus.purge_effects(uid)
        own = await self._own_events(key)
        if own is not None:
            await self.bus.purge_run(namespace, name, through=own[1].seq)

    async def _own_events(self, key: RunKey) -> tuple[RunEvent, RunEvent] | None:
        """The first and last events of run ``key``'s subject if both are that run's, else
        ``None`` (no events, or a new AgentRun of the same name started the subject anew).
        Purging through the last one keeps whatever a new run appends after it."""
        first = await self.bus.first_event(key.namespace, key.name)
        if first is None or first.run_uid != key.uid:
            return None
        last = await self.bus.last_event(key.namespace, key.name)
        if last is None or last.run_uid != key.uid:
            return None
        return first, last

    async def end_refused_runs(self) -> None:
        """Forever: end each running run whose status the API server refused for its size
        (``checkpoint_failed``, the message naming the refusal): retrying the write would fail
        the same way for ever, the run unseen while it holds its tenant's slot and budget."""
        while True:
            run, message = await self.writer.next_refused()
            try:
                await self.end(
                    run.namespace, run.name, run.uid, kernel.Phase.CHECKPOINT_FAILED, message
                )
            except Exception:  # one failed end must not stop the next ones
                log.exception("could not end run %s/%s", run.namespace, run.name)

    async def cancel_timers(self) -> None:
        """Cancel every deadline timer."""
        for view in self._views.values():
            if view.timer is not None:
                view.timer.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(
                *(v.timer for v in self._views.values() if v.timer), return_exceptions=True
            )


def _life_fault(first: RunEvent, reruns: int) -> SealFault | None:
    """Why ``first``, the first event of a run's subject and sealed for it, is not the
    admission of the run's life ``reruns`` (the object's ``status.reruns``), or ``None``:
    ``UNSIGNED`` when it is no admission (a subject starts with one), ``REPLAYED`` when it
    admits an earlier life. A later life than the object shows is the run's own: its status
    lags its events (or was lost), never leads."""
    if first.kind != "admitted" or first.config is None:
        return SealFault.UNSIGNED
    return SealFault.REPLAYED if first.config.reruns < reruns else None
