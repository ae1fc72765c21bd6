"""Lost turns: a running run whose TurnRequest left the work queue with no newer event, or
stays there never to be delivered.

A TurnRequest can leave the work queue without its turn being committed (acked by a worker
that then gave the turn up, or deleted). ``OrphanWatch`` finds such runs and publishes their
turn again under a fresh ``Nats-Msg-Id`` (a duplicate is harmless: the commit is
compare-and-set); after ``MAX_REDISPATCHES`` such losses of one turn it ends the run
``checkpoint_failed`` naming the cause. A run whose newer event is in the stream but not yet
delivered to the operator is the event consumer's to catch up on; once it has waited
``BEHIND_AFTERS`` periods it is logged (``report_behind``), so a stuck consumer is seen.

A TurnRequest can also stay in the work queue and never be delivered: the workers' consumer's
state no longer matches the stream (restored behind it after a restart, its ack floor past
messages still stored), so it counts the message acknowledged, or delivers it to nobody while
workers ask. Each look that has a turn due reads the consumer's figures once
(``Bus.work_queue``); a TurnRequest in the stream for ``after`` seconds or more is judged by
``undelivered.judge``, and one judged stuck at ``STUCK_LOOKS`` checks in a row is deleted from
the stream and dispatched again as a lost one (same count, same end), with one warning naming
the run and the figures, counted in ``agentrun_turns_undelivered_total``. One in a worker's
hands, waiting out a nak's delay, or queued behind busy workers is left alone.

The same watch is the level-triggered second line behind kopf's edge-triggered handlers: a
run of this process's shards whose object shows it admitted and not ended, but which this
process does not follow (no live view: none was made, or one was dropped, on a path nobody
knows of), would otherwise wait for ever, in silence, since every other check here looks at
followed runs only. Once such a run has stayed unfollowed for ``after`` seconds it is followed
again from its events (``Dispatcher.recover``, what an operator's start does for each run),
with a warning naming it; one that neither its admission nor a resume handed to this process
yet (kopf's start-up resume goes one namespace's few runs at a time) gets
``STARTUP_AFTERS × after`` seconds first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from agentrun import kernel, loops, metrics, protocol
from agentrun.bus import Bus, WorkQueue, WorkQueueMissing
from agentrun.protocol import RunEvent

from ..platform.failures import Failures
from . import undelivered
from .dispatch import Dispatcher
from .ports import PendingTurn

log = logging.getLogger(__name__)

MAX_REDISPATCHES = 3
"""Times a lost turn is published again before the run ends ``checkpoint_failed``."""
STARTUP_AFTERS = 12
"""A run found unfollowed that nothing in this process handed to the dispatcher yet (neither
its admission nor a resume: kopf's start-up resume may not have reached it, each namespace's
runs waiting their turn in the admission gate) is followed again only after this many
``after`` periods, not one: a restart with thousands of runs is not done twice, nor told as a
fault."""
STUCK_LOOKS = 3
"""Checks in a row (each ``after`` seconds or more apart) that must judge a TurnRequest still
in the work queue stuck (``undelivered.judge``) before it is taken out and dispatched again:
figures read a moment apart (an ack between the consumer's info and the message's read, a
replica behind its leader) are never enough."""
LOST = "is in no worker's hands and not queued"
"""Why a turn whose TurnRequest left the work queue uncommitted is dispatched again."""
BEHIND_AFTERS = 3
"""A committed event the event consumer has not delivered for this many ``after`` periods is
logged (once per event): nothing here acts on it, and without the log a consumer that stopped
delivering would hold every such run silently."""


def _given_up(turn: PendingTurn, why: str) -> str:
    """The ``checkpoint_failed`` message of a run whose turn ``turn`` was dispatched again
    ``MAX_REDISPATCHES`` times, the last loss ``why``: a lost TurnRequest, or one the workers'
    consumer held undelivered (no worker ever had it: the consumer, not the run, is at fault)."""
    times = turn.redispatches + 1
    left = f"turn {turn.turn} left the work queue {times} times without being committed"
    if why == LOST:
        return f"{left} (its TurnRequest was lost or its worker gave it up)"
    return (
        f"{left}: the last time its TurnRequest {why}; the workers' consumer "
        f"({protocol.WORKERS_CONSUMER}) does not deliver what the work queue holds "
        "(agentrun_turns_undelivered_total counts these)"
    )


class OrphanWatch:
    """Finds running runs with no turn in flight and dispatches their turn again."""

    def __init__(
        self, bus: Bus, runs: Dispatcher, *, after: float, clock: Callable[[], float] = time.time
    ) -> None:
        """``runs`` gives snapshots of the pending turns, dispatches them again and ends runs
        (it alone changes its views); a run is looked at once its
        TurnRequest was published or last seen queued ``after`` seconds ago (so a lost turn is
        found within about ``1.25 × after`` seconds); ``clock`` is epoch seconds."""
        self.bus = bus
        self.runs = runs
        self.after = after
        self.clock = clock
        self._stopping = asyncio.Event()
        self.failures = Failures(log, what="orphan check")
        """Runs whose check failed (each logged once)."""
        self._behind: dict[str, int] = {}
        """uid → the stream sequence of the undelivered event last logged for the run."""
        self._late: list[tuple[PendingTurn, RunEvent, float]] = []
        """Runs found behind since the last ``report_behind``: (turn, its newer event, seconds
        since that event was committed)."""
        self._unfollowed: dict[str, float] = {}
        """uid → when the run was first found admitted, unfinished and not followed here."""
        self._suspects: dict[str, tuple[int, int]] = {}
        """uid → (stream sequence of its TurnRequest, checks in a row that judged it stuck)."""
        self._hopeless: set[str] = set()
        """Runs found unfollowed whose events ``recover`` could not follow (none of theirs):
        logged once and left to the operator's next start (``runs.recovery``)."""
        self._audited = clock()
        """When ``follow_unfollowed`` last looked (epoch seconds): first ``after`` seconds
        after the start, when kopf's own start-up has recovered most runs."""

    def stop(self) -> None:
        """Let ``run`` return after its current pass."""
        self._stopping.set()

    async def run(self) -> None:
        """Until ``stop``: look at every live run each ``after / 4`` seconds (at least 0.2).

        Each look reads the workers' consumer once when a turn is due (``_look``), then one
        stream read per run due, a second one only for a run whose request is gone (or taken
        out: ``_why_again``); NATS trouble is logged and the next pass looks again.
        """
        interval = max(0.2, self.after / 4)
        await loops.every(
            interval, self._pass, what="orphan check", stopping=self._stopping, wait_first=True
        )

    async def _pass(self) -> None:
        """Check every pending turn; a run whose check failed is logged once (``failures``).
        Then hand the gate again any running run's turn that is neither published nor waiting
        (``Dispatcher.offer_stranded``)."""
        pending = self.runs.pending_turns()
        uids = {turn.key.uid for turn in pending}
        for uid in self._behind.keys() - uids:
            del self._behind[uid]
        for uid in self._suspects.keys() - uids:
            del self._suspects[uid]
        queue = await self._look(pending)
        for turn in pending:
            subject = f"AgentRun {turn.key.namespace}/{turn.key.name}"
            try:
                await self.check(turn, queue)
            except Exception as err:  # NATS trouble: the next pass looks again
                self.failures.failed(turn.key.uid, err, subject=subject)
            else:
                self.failures.succeeded(turn.key.uid, subject=subject)
        self.report_behind()
        if self.clock() - self._audited >= self.after:
            await self._audit()
        try:
            await self.runs.offer_stranded(after=self.after)
        except Exception as err:  # NATS trouble: the next pass looks again
            self.failures.failed("stranded", err, subject="turns neither published nor waiting")
        else:
            self.failures.succeeded("stranded", subject="turns neither published nor waiting")

    async def _look(self, pending: list[PendingTurn]) -> WorkQueue | None:
        """One look at the workers' consumer (``Bus.work_queue``) when a turn of ``pending`` is
        due for a check and its TurnRequest was published ``after`` seconds ago or more, else
        None; read before any message is (a TurnRequest acked after the look is then gone, not
        judged). A failure is logged once (``failures``) and the turns are checked without it."""
        now = self.clock()
        if not any(
            now - turn.checked_at >= self.after and now - turn.queued_at >= self.after
            for turn in pending
        ):
            return None
        subject = "the workers' consumer"
        try:
            queue = await self.bus.work_queue()
        except WorkQueueMissing as err:
            await self._remake(err)
            return None
        except Exception as err:  # NATS trouble: the next look reads again
            self.failures.failed("work queue", err, subject=subject)
            return None
        self.failures.succeeded("work queue", subject=subject)
        return queue

    async def _remake(self, missing: WorkQueueMissing) -> None:
        """Make the work queue and the workers' consumer again (``Bus.ensure_streams``,
        idempotent) when a look found either missing while turns wait: deleted by hand (to
        replace a consumer whose state no longer matches the stream) or lost with NATS's store.
        The TurnRequests the stream still holds are delivered by the new consumer (those in a
        worker's hands too: a second run of such a turn commits nothing twice); one lost with
        the stream is found lost at the next look and published again. A failure is logged
        once (``failures``) and the next look tries again."""
        subject = "the work queue"
        try:
            await self.bus.ensure_streams()
        except Exception as err:  # NATS trouble: the next look tries again
            self.failures.failed("work queue remade", err, subject=subject)
            return
        self.failures.succeeded("work queue remade", subject=subject)
        log.warning("%s; made it again (with the workers' consumer)", missing)

    async def _audit(self) -> None:
        """``follow_unfollowed``, its failure logged once (the next audit looks again)."""
        self._audited = self.clock()
        try:
            await self.follow_unfollowed()
        except Exception as err:  # NATS trouble: the next audit looks again
            self.failures.failed("unfollowed", err, subject="admitted runs not followed")
        else:
            self.failures.succeeded("unfollowed", subject="admitted runs not followed")

    async def follow_unfollowed(self) -> int:
        """Follow again, from its events, each run found admitted, unfinished and not followed
        here (``Dispatcher.unfollowed``) at an earlier look at least ``after`` seconds ago
        (``STARTUP_AFTERS × after`` for one not yet handed to the dispatcher in this process:
        ``_patience``), logged in one warning a look; returns how many. Raises what NATS
        raises."""
        now = self.clock()
        found = {key.uid: (key, written) for key, written in self.runs.unfollowed()}
        self._unfollowed = {uid: self._unfollowed.get(uid, now) for uid in found}
        self._hopeless = {uid for uid in self._hopeless if uid in found}
        due = [
            found[uid]
            for uid, since in self._unfollowed.items()
            if uid not in self._hopeless and now - since >= self._patience(uid)
        ]
        if not due:
            return 0
        log.warning(
            "%d admitted, unfinished run(s) had no view followed here for %.0fs or more "
            "(first: %s/%s); following them again from their events",
            len(due),
            self.after,
            due[0][0].namespace,
            due[0][0].name,
        )
        followed = 0
        for key, written in due:
            del self._unfollowed[key.uid]
            if not self.runs.still_unfollowed(key):
                continue  # deleted, followed or ended while the runs before it were
            if await self.runs.recover(
                key.namespace,
                key.name,
                key.uid,
                generation=written.generation,
                reruns=written.reruns,
            ):
                followed += 1
                continue
            if not self.runs.still_unfollowed(key):
                continue  # deleted while it was read: its events purged
            self._hopeless.add(key.uid)
            log.warning(
                "AgentRun %s/%s: its events hold no admission of its life to follow (left to "
                "its rerun, or to the operator's next start, which ends a run whose checkpoint "
                "was lost)",
                key.namespace,
                key.name,
            )
        return followed

    def _patience(self, uid: str) -> float:
        """Seconds run ``uid`` stays unfollowed before it is followed again: ``after`` once
        this process handed it to the dispatcher, else ``STARTUP_AFTERS × after``."""
        return self.after if self.runs.handed(uid) else STARTUP_AFTERS * self.after

    async def check(self, turn: PendingTurn, queue: WorkQueue | None = None) -> bool:
        """Re-dispatch ``turn`` if its TurnRequest is gone, or stuck in the work queue by
        ``queue``'s figures (``_why_again``), and no newer event came; or end the run
        ``checkpoint_failed`` once that happened ``MAX_REDISPATCHES`` times; True when it acted.
        Raises what NATS raises."""
        now = self.clock()
        if now - turn.checked_at < self.after:
            return False
        why = await self._why_again(turn, queue, now)
        if why is None:
            return False
        key = turn.key
        last = await self.bus.last_event(key.namespace, key.name)
        if last is None or last.run_uid != key.uid:
            return False  # deleted
        if last.seq != turn.seq:  # the event consumer has not caught up yet
            self._note_behind(turn, last, now)
            return False
        if turn.redispatches >= MAX_REDISPATCHES:
            message = _given_up(turn, why)
            log.error("%s/%s: %s; this time it %s", key.namespace, key.name, message, why)
            await self.runs.end(
                key.namespace, key.name, key.uid, kernel.Phase.CHECKPOINT_FAILED, message
            )
            return True
        log.warning(
            "%s/%s: turn %s %s; dispatching it again (%d)",
            key.namespace,
            key.name,
            turn.turn,
            why,
            turn.redispatches + 1,
        )
        await self.runs.redispatch(turn)
        return True

    async def _why_again(
        self, turn: PendingTurn, queue: WorkQueue | None, now: float
    ) -> str | None:
        """Why ``turn`` is to be dispatched again: its TurnRequest left the work queue
        (``LOST``), or it is still there and was judged stuck ``STUCK_LOOKS`` checks in a row
        (``_stuck``), then taken out of the stream (counted in
        ``agentrun_turns_undelivered_total``); None while it waits normally."""
        if not await self.bus.turn_queued(turn.queued_seq):
            self._suspects.pop(turn.key.uid, None)
            return LOST
        self.runs.still_queued(turn, at=now)
        if self._stuck(turn, queue, now) is None:
            return None
        confirmed = await self._confirm(turn)
        if confirmed is None:
            return None
        verdict, queue = confirmed
        if not await self.bus.drop_turn(turn.queued_seq):
            return LOST  # acked meanwhile: committed, or lost as any other
        metrics.record_undelivered(verdict.value)
        return (
            f"stayed in the work queue, never to be delivered ({verdict.value}; "
            f"TurnRequest {turn.queued_seq}, {queue.describe()}); taken out of the stream"
        )

    async def _confirm(self, turn: PendingTurn) -> tuple[undelivered.Verdict, WorkQueue] | None:
        """The stuck verdict on ``turn``'s TurnRequest again, from the workers' consumer read
        now, and those figures; None when it no longer holds (the consumer delivered it since
        the pass's look, or recovered) or the consumer cannot be read (the next pass looks
        again): a turn a worker has just taken is not deleted and published again."""
        try:
            queue = await self.bus.work_queue()
        except Exception as err:  # NATS trouble, or no consumer: the next pass looks again
            self.failures.failed("work queue", err, subject="the workers' consumer")
            return None
        verdict = undelivered.judge(turn.queued_seq, queue)
        return (verdict, queue) if verdict.stuck else None

    def _stuck(
        self, turn: PendingTurn, queue: WorkQueue | None, now: float
    ) -> undelivered.Verdict | None:
        """The stuck verdict on ``turn``'s TurnRequest (still in the work queue) once
        ``STUCK_LOOKS`` checks in a row gave one, else None; none without a look, nor while it
        was published less than ``after`` seconds ago."""
        uid = turn.key.uid
        if queue is None or now - turn.queued_at < self.after:
            return None
        verdict = undelivered.judge(turn.queued_seq, queue)
        if not verdict.stuck:
            self._suspects.pop(uid, None)
            return None
        seq, looks = self._suspects.get(uid, (turn.queued_seq, 0))
        looks = looks + 1 if seq == turn.queued_seq else 1
        if looks < STUCK_LOOKS:
            self._suspects[uid] = (turn.queued_seq, looks)
            return None
        self._suspects.pop(uid, None)
        return verdict

    def _note_behind(self, turn: PendingTurn, last: RunEvent, now: float) -> None:
        """Note, once per event, a committed event ``last`` that the event consumer has not
        delivered ``BEHIND_AFTERS × after`` seconds after it was committed."""
        waited = now - last.time if last.time else 0.0
        if waited < BEHIND_AFTERS * self.after or self._behind.get(turn.key.uid) == last.seq:
            return
        self._behind[turn.key.uid] = last.seq
        self._late.append((turn, last, waited))

    def report_behind(self) -> None:
        """Log the runs found behind since the last report in one warning (none: nothing)."""
        late, self._late = self._late, []
        if not late:
            return
        turn, last, waited = max(late, key=lambda found: found[2])
        log.warning(
            "%d run(s) have a committed event the event consumer has not delivered after %.0fs "
            "or more (longest: %s/%s, event %d committed %.0fs ago, the operator last applied "
            "event %d): the consumer is behind or stuck (agentrun_jetstream_consumer_pending)",
            len(late),
            BEHIND_AFTERS * self.after,
            turn.key.namespace,
            turn.key.name,
            last.seq,
            waited,
            turn.seq,
        )
