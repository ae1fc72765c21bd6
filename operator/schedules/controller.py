"""The CronAgentRun controller: creates AgentRuns on a schedule, in the leader only.

What belongs here: the loop that wakes at each CronAgentRun's next schedule time (or when it,
or one of its runs, changes), reads its runs, acts on ``plan.plan`` (create the run,
cancel the running ones for ``Replace``, skip for ``Forbid``), deletes finished runs beyond the
history limits, writes the CronAgentRun's status and records Events. What does not: the rules
(``plan``), the spec and the run manifest (``spec``), the status body (``status``), the API
calls (``store``), what it remembers of the schedules (``memory``), the kopf handlers that feed
it (``handlers.schedules``).

Exactly-once per schedule time without any state of its own: a run's name is derived from its
schedule time, so a second attempt (the same leader after an error, a new leader after a
failover or restart) meets AlreadyExists instead of creating a double (and, not having listed
the run as its own, says so: ``RunNameTaken``). The last schedule time is the
later of ``.status.lastScheduleTime`` and the newest run the CronAgentRun owns, so a run created
just before a crash, whose status write was lost, is not created again either.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from agentrun import loops
from agentrun.loops import sleep_until_set

from ..platform.conditions import rfc3339
from ..platform.events import EventRecorder, EventType, Involved
from ..platform.failures import Failures, transient
from ..platform.kubeapi import ApiError
from . import plan, spec, status
from .memory import BODIES_MEMORY, CronKey, CronMemory
from .status import OwnedRun, epoch
from .store import CronStore
from .turns import Turns, own_share

log = logging.getLogger(__name__)

RETRY_SECONDS = 5.0
"""Wait before reconciling a CronAgentRun again after a failed API call."""
RECONCILES_AT_ONCE = 8
"""CronAgentRuns reconciled at once (each a few API requests)."""
PER_SHARE = RECONCILES_AT_ONCE // 2
"""CronAgentRuns of one share (``Tenants.party``: the AgentTenant binding their namespace,
every namespace it binds together) reconciled at once: however slow one tenant's reconciles
are (thousands of ended runs of its own to release and delete each), the other shares always
find places free."""

RECONCILE_FAILED = "ReconcileFailed"
"""``Ready=False`` reason (and Warning Event) of a CronAgentRun whose reconcile failed twice
for a reason that does not pass (``platform.failures``): it creates nothing until its spec
changes."""


class ScheduleController:
    """Keeps every CronAgentRun's runs on schedule. ``observe``/``forget``/``run_changed`` are
    called by the kopf handlers; ``run`` is the loop (leader only)."""

    def __init__(
        self,
        store: CronStore,
        *,
        events: EventRecorder,
        clock: Callable[[], float] = time.time,
        memory: int = BODIES_MEMORY,
        share_of: Callable[[str], str] = own_share,
    ) -> None:
        """``clock``: epoch seconds (schedules are wall-clock times); ``memory``: bytes of
        objects kept as seen (``BODIES_MEMORY``); ``share_of``: whose turn a namespace's
        schedules take (``Tenants.party``: its tenant's; by default its own)."""
        self.store = store
        self.events = events
        self.clock = clock
        self.crons = CronMemory(memory)
        """Every CronAgentRun known, its wake-up, its object as last seen."""
        self.turns = Turns(share_of)
        self.share_of = share_of
        """The schedules due, waiting for a place."""
        self._kick = asyncio.Event()
        self._stopped = False
        self.failures = Failures(log, what="reconcile")
        """Failed reconciles by CronAgentRun (each logged once)."""

    def observe(self, body: Mapping[str, Any]) -> None:
        """A CronAgentRun as listed or changed; a new one, or a new spec, is reconciled now."""
        if self.crons.observe(body):
            self._kick.set()

    def forget(self, namespace: str, name: str) -> None:
        """The CronAgentRun was deleted (its runs go through ownerReference GC)."""
        self.crons.forget(namespace, name)

    def run_changed(self, namespace: str, cron: str) -> None:
        """One of ``cron``'s runs ended or was deleted: look again (a ``Forbid``-skipped time
        may start now; history limits may delete one)."""
        if self.crons.mark((namespace, cron)):
            self._kick.set()

    def stop(self) -> None:
        """End ``run`` at its next wake-up."""
        self._stopped = True
        self._kick.set()

    async def run(self) -> None:
        """Reconcile each CronAgentRun when it changes or its wake time comes, forever,
        ``RECONCILES_AT_ONCE`` at a time, ``PER_SHARE`` of one tenant's: each one due joins
        the queue (``Turns``: the tenants take turns, and the namespaces inside each; a tenant
        at its ``PER_SHARE`` is passed over) and a place freed takes the next,
        so a tenant's thousands of schedules due every second, in however many namespaces,
        delay another tenant's by one turn of each tenant waiting. (Passes over all those due
        together, each waiting for its slowest, made one due a moment after a pass began wait
        for the whole of it: 1,500 schedules of one namespace left another's every-second
        schedule two runs in 12 s.) Stopped, it lets
        the reconciles going end; cancelled, it cancels them."""
        running: dict[CronKey, asyncio.Task[None]] = {}
        busy: set[CronKey] = set()
        """Queued or running."""
        try:
            while not self._stopped:
                self._kick.clear()
                due = self.crons.take_due(self.clock(), busy=busy)
                self.turns.add(sorted(due))
                busy |= due
                while len(running) < RECONCILES_AT_ONCE and (
                    key := self.turns.take(full=self._full(running))
                ):
                    running[key] = self._start(key, running, busy)
                wake = self.crons.next_wake()
                timeout = max(wake - self.clock(), 0.0) if wake is not None else None
                await sleep_until_set(self._kick, timeout)
            await asyncio.gather(*running.values(), return_exceptions=True)
        finally:
            for task in running.values():
                task.cancel()
            await asyncio.gather(*running.values(), return_exceptions=True)

    def _full(self, running: Iterable[CronKey]) -> set[str]:
        """The shares with ``PER_SHARE`` reconciles ``running``."""
        counts = collections.Counter(self.share_of(key[0]) for key in running)
        return {share for share, count in counts.items() if count >= PER_SHARE}

    def _start(
        self, key: CronKey, running: dict[CronKey, asyncio.Task[None]], busy: set[CronKey]
    ) -> asyncio.Task[None]:
        """Reconcile ``key`` in a task of its own, which leaves ``running`` and ``busy`` when
        it ends (and wakes ``run`` to fill its place)."""
        task = asyncio.create_task(self._reconcile_safely(key), name=f"cron {key[0]}/{key[1]}")

        def ended(_: asyncio.Task[None]) -> None:
            running.pop(key, None)
            busy.discard(key)
            self._kick.set()

        task.add_done_callback(ended)
        loops.log_failure(task, what=f"reconcile of CronAgentRun {key[0]}/{key[1]}")
        return task

    async def _reconcile_safely(self, key: CronKey) -> None:
        """Reconcile ``key``; a transient failure is retried in ``RETRY_SECONDS``, a permanent
        one once more, then the CronAgentRun is given up (``RECONCILE_FAILED``) until its
        spec changes. Each failure is logged once."""
        entry = self.crons.entry(key)
        if entry is None:
            return
        subject = f"CronAgentRun {key[0]}/{key[1]}"
        body = self.crons.body(key)
        try:
            if body is None:  # forgotten (``BODIES_MEMORY``): read again
                body = await self.store.get_cron(*key)
                if body is None:  # deleted (the watch may not tell: see ``_write_status``)
                    self.forget(*key)
                    return
                self.crons.keep(key, body)
            self.crons.wake(key, await self.reconcile(body))
        except Exception as err:
            failure = self.failures.failed(key, err, subject=subject)
            self.crons.wake(key, None if failure.final else self.clock() + RETRY_SECONDS)
            if failure.final and body is not None:
                await self._give_up(body, entry.generation, err)
            return
        self.failures.succeeded(key, subject=subject)

    async def _give_up(self, cron: Mapping[str, Any], generation: int, err: Exception) -> None:
        """``Ready=False`` (``RECONCILE_FAILED``, naming ``err``) and a Warning Event about
        ``cron`` at ``generation``; it is looked at again when its spec changes or one of its
        runs ends."""
        meta = cron.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        message = f"no runs are created: reconciling failed twice: {type(err).__name__}: {err}"
        self._record(
            Involved(spec.KIND, name, namespace, str(meta.get("uid", ""))),
            reason=RECONCILE_FAILED,
            message=message[:1000],
            per=generation,
            warning=True,
        )
        ready = status.ready(
            False, RECONCILE_FAILED, message[:1000], now=self.clock(), generation=generation
        )
        try:
            await self._write_status(cron, {"observedGeneration": generation, **ready})
        except Exception as writing:  # refused too: the Event and the log say it
            self.failures.failed((namespace, name, "give-up"), writing, subject=f"{name}'s status")

    async def reconcile(self, cron: Mapping[str, Any]) -> float | None:
        """One pass over ``cron`` (a CronAgentRun object as a dict); returns when to look
        again (``None``: only when it or its runs change). One being deleted is left alone, as
        a CronJob is: a run created then would only start a loop and hold up the deletion.
        Raises ``ApiException``."""
        meta = cron.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            return None
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        involved = Involved(spec.KIND, name, namespace, str(meta.get("uid", "")))
        now = self.clock()
        try:
            checked = spec.check(cron.get("spec"))
        except spec.Invalid as err:
            await self._invalid(cron, err, involved=involved, now=now)
            return None
        owned = await self._counted(cron, await self._owned_runs(namespace, name, uid=involved.uid))
        last = self._last_scheduled(cron, owned, now=now)
        active = [
            plan.ActiveRun(run.name, run.uid, run.scheduled) for run in owned if not run.ended
        ]
        step = plan.plan(checked.schedule, policy=checked.policy, last=last, now=now, active=active)
        created = await self._act(cron, checked, step, involved=involved)
        if created is not None:
            self.crons.created(involved.uid, created.scheduled)
            owned = [*owned, created]
        wake = None if isinstance(step, plan.Suspended) else step.wake
        scheduled = self.crons.last_created(involved.uid)
        body = status.status_body(cron, owned, checked, wake=wake, now=now, scheduled=scheduled)
        await self._write_status(cron, body)  # before pruning: a limit of 0 hid every end
        await self._prune(namespace, owned, checked, involved=involved)
        return wake

    async def _invalid(
        self, cron: Mapping[str, Any], err: spec.Invalid, *, involved: Involved, now: float
    ) -> None:
        """``Ready=False`` naming why ``cron``'s spec is unusable, with a Warning Event;
        nothing is created, but the runs that ended meanwhile are counted
        (``lastSuccessfulTime``) and released, as a valid pass does: a schedule left invalid
        held them from every TTL for ever."""
        generation = int((cron.get("metadata") or {}).get("generation") or 1)
        message = f"no runs are created: {err}"
        self._record(involved, reason=err.reason, message=message, per=generation, warning=True)
        owned = await self._owned_runs(involved.namespace, involved.name, uid=involved.uid)
        await self._counted(cron, owned)
        ready = status.ready(False, err.reason, str(err), now=now, generation=generation)
        counted = status.last_successful(owned, cron.get("status") or {})
        await self._write_status(cron, {"observedGeneration": generation, **counted, **ready})

    async def _counted(self, cron: Mapping[str, Any], owned: Sequence[OwnedRun]) -> list[OwnedRun]:
        """``owned``, its ended runs still held (``runs.HOLD_ANNOTATION``) released once their
        ends are in ``cron``'s status (``lastSuccessfulTime``, written first when it moves),
        before the pass acts: a create the API server refuses (a ResourceQuota the held runs
        fill) raised before a later release, and kept them held, and the quota full, for ever.
        A status write refused for good (``failures.transient`` false: the status schema of
        another version's CRD, say) releases them uncounted, logged: held, no TTL would ever
        delete them. Raises a passing failure of the write (the next pass tries again)."""
        ended = [run for run in owned if run.ended and run.held]
        if not ended:
            return list(owned)
        try:
            await self._write_status(cron, status.last_successful(owned, cron.get("status") or {}))
        except ApiError as err:
            if transient(err):
                raise
            meta = cron.get("metadata") or {}
            log.warning(
                "CronAgentRun %s/%s: its status is refused (%r); its %d ended runs are "
                "released to their TTL without being counted in lastSuccessfulTime",
                meta.get("namespace"),
                meta.get("name"),
                err,
                len(ended),
            )
        namespace = str((cron.get("metadata") or {}).get("namespace", ""))
        for run in ended:
            await self.store.release_run(namespace, run.name, run.uid)
        return [dataclasses.replace(run, held=False) if run in ended else run for run in owned]

    def _last_scheduled(
        self, cron: Mapping[str, Any], owned: Sequence[OwnedRun], *, now: float
    ) -> float:
        """The last schedule time a run was created for (epoch seconds): the latest of
        ``.status.lastScheduleTime`` (else the creation time, else ``now``), this process's
        own record and ``owned``'s times."""
        meta = cron.get("metadata") or {}
        recorded = epoch((cron.get("status") or {}).get("lastScheduleTime"))
        since = recorded if recorded is not None else epoch(meta.get("creationTimestamp"))
        return max(
            [
                since if since is not None else now,
                self.crons.last_created(str(meta.get("uid", ""))),
                *(run.scheduled for run in owned),
            ]
        )

    async def _owned_runs(self, namespace: str, name: str, *, uid: str) -> list[OwnedRun]:
        """The runs labelled for ``name`` whose controller is the CronAgentRun ``uid`` (runs of
        an earlier object of the same name are not adopted)."""
        found: list[OwnedRun] = []
        for obj in await self.store.list_runs(namespace, name):
            owners = (obj.get("metadata") or {}).get("ownerReferences") or []
            if not any(o.get("uid") == uid and o.get("controller") for o in owners):
                continue
            run = OwnedRun.of(obj)
            if run is not None:
                found.append(run)
        return found

    async def _act(
        self,
        cron: Mapping[str, Any],
        checked: spec.Checked,
        step: plan.Plan,
        *,
        involved: Involved,
    ) -> OwnedRun | None:
        """Do what ``step`` says; the run created, if any."""
        if isinstance(step, plan.Suspended):
            return None
        if step.missed is not None:
            self._record_missed(involved, step.missed)
        if isinstance(step, plan.Wait):
            return None
        when = rfc3339(step.scheduled)
        if isinstance(step, plan.Skip):
            self._record_skip(involved, step, when=when)
            return None
        for run in step.cancel:
            await self.store.cancel_run(involved.namespace, run.name)
            self._record(
                involved,
                reason="ReplacedRun",
                message=f"cancelled {run.name} (concurrencyPolicy Replace) for the run of {when}",
                per=run.uid,
            )
        manifest = spec.run_manifest(cron, checked, scheduled=step.scheduled)
        name = manifest["metadata"]["name"]
        if not await self.store.create_run(manifest):
            # not listed as ours (``plan`` would not start a time of a run it lists): another
            # object holds the name, and this time gets no run; say so rather than nothing
            self._record(
                involved,
                reason="RunNameTaken",
                message=f"no run for {when}: an AgentRun named {name} exists that is not this "
                "CronAgentRun's (created by hand or by another object); delete it, or rename "
                "the schedule",
                per=step.scheduled,
                warning=True,
            )
            return None
        self._record(
            involved,
            reason="SuccessfulCreate",
            message=f"created run {name} for {when}",
            per=step.scheduled,
        )
        return OwnedRun(name, "", step.scheduled, False, False, None)

    def _record_skip(self, involved: Involved, step: plan.Skip, *, when: str) -> None:
        """The Event of a skipped time: ``RunAlreadyActive`` (``Forbid``), or the Warning
        ``TooManyActiveRuns`` (``Allow`` at ``plan.MAX_ACTIVE_RUNS``)."""
        if step.full:
            self._record(
                involved,
                reason="TooManyActiveRuns",
                message=f"skipped the run for {when}: {len(step.running)} runs of this schedule "
                f"have not ended (at most {plan.MAX_ACTIVE_RUNS}; are they queued behind the "
                "tenant's limits?)",
                per=step.scheduled,
                warning=True,
            )
            return
        running = ", ".join(run.name for run in step.running)
        self._record(
            involved,
            reason="RunAlreadyActive",
            message=f"skipped the run for {when}: concurrencyPolicy Forbid and {running} "
            "still runs",
            per=step.scheduled,
        )

    def _record_missed(self, involved: Involved, missed: plan.Missed) -> None:
        when = rfc3339(missed.latest)
        if missed.past_deadline:
            self._record(
                involved,
                reason="MissSchedule",
                message=f"missed the run for {when}: more than startingDeadlineSeconds ago",
                per=missed.latest,
                warning=True,
            )
        if missed.too_many:
            self._record(
                involved,
                reason="TooManyMissedTimes",
                message=f"more than {plan.TOO_MANY_MISSED} schedule times passed without a "
                "run (operator down, or suspended); only the most recent can start. Set "
                "startingDeadlineSeconds to bound this",
                per=missed.latest,
                warning=True,
            )

    async def _prune(
        self,
        namespace: str,
        owned: Sequence[OwnedRun],
        checked: spec.Checked,
        *,
        involved: Involved,
    ) -> list[OwnedRun]:
        """Delete finished runs beyond the history limits; the runs left."""
        doomed = plan.prune(
            [plan.FinishedRun(r.name, r.scheduled, r.succeeded) for r in owned if r.ended],
            successful_limit=checked.spec.successful_runs_history_limit,
            failed_limit=checked.spec.failed_runs_history_limit,
        )
        for name in doomed:
            await self.store.delete_run(namespace, name)
            self._record(
                involved,
                reason="SuccessfulDelete",
                message=f"deleted finished run {name} (history limit)",
                per=name,
            )
        return [run for run in owned if run.name not in doomed]

    def _record(
        self,
        involved: Involved,
        *,
        reason: str,
        message: str,
        per: object,
        warning: bool = False,
    ) -> None:
        """A Kubernetes Event about the CronAgentRun ``involved`` (Normal, or Warning), once
        per ``reason`` and occasion ``per`` (a schedule time, a generation, a run)."""
        self.events.record(
            involved,
            type=EventType.WARNING if warning else EventType.NORMAL,
            reason=reason,
            message=message,
            key=(involved.uid, reason, per),
        )

    async def _write_status(self, cron: Mapping[str, Any], body: Mapping[str, Any]) -> None:
        """Patch the status when ``body`` changes it. A CronAgentRun found gone is forgotten
        (its deletion was missed: a watch restarted across it lists what exists, and tells no
        deletion), so a deleted schedule does not fire on from the object last seen."""
        if status.unchanged(cron.get("status") or {}, body):
            return
        if not await self.store.patch_status(cron, body):
            meta = cron.get("metadata") or {}
            key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
            known = self.crons.entry(key)
            if known is not None and known.uid == str(meta.get("uid", "")):
                self.forget(*key)
