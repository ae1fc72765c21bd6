"""The end of a finished run's life: deletion after ``spec.ttlSecondsAfterFinished``, and the
purge of event streams (and the effect records of the runs they name) whose AgentRun is gone.

No run holds a finalizer, so a run can be deleted — alone or with its namespace — with no
operator running (a run that had not ended is stopped and its ledger entry settled when the
operator sees the deletion, or by the ledger sweep of the next leader). Its event stream is then
purged by whichever comes first: the operator seeing the deletion (``purge_deleted``), or the
orphan sweep at the start of every leader (``purge_orphans``: a subject whose AgentRun no
longer exists).

``spec.ttlSecondsAfterFinished`` follows the Job field of that name (its AgentTenant's field of
that name is the default): unset keeps the run until someone deletes it; ``N`` deletes it ``N``
seconds after ``status.completionTime`` (0: at once). The ``Reaper`` holds the due times of the
finished runs it was told about (kopf shows it every run at start-up, then every change) and
deletes each one when due, with its uid as a precondition (a newer object of the same name is
never deleted).

What does not belong here: ending running runs on deletion (``dispatch.Dispatcher.forget``).
"""

from __future__ import annotations

import asyncio
import datetime
import heapq
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from agentrun.loops import sleep_until_set
from agentrun.protocol import RunEvent

from ..platform.failures import Failures
from ..platform.kubeapi import ApiError, KubeApi
from .dispatch import subject_key
from .keys import HOLD_ANNOTATION, HOLD_GRADING, HOLD_SCHEDULE, RUNS, RunKey

log = logging.getLogger(__name__)

TTL_FIELD = "ttlSecondsAfterFinished"


def finished_at(status: Mapping[str, Any]) -> float | None:
    """Epoch seconds of ``status.completionTime``; None for a run that has not finished."""
    text = status.get("completionTime")
    if not status.get("terminalReason") or not isinstance(text, str):
        return None
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def due_time(
    spec: Mapping[str, Any],
    status: Mapping[str, Any],
    *,
    default_ttl: int | None = None,
    held: bool = False,
) -> float | None:
    """When a finished run is to be deleted (epoch seconds); None: keep it. ``default_ttl``
    (its AgentTenant's ``spec.ttlSecondsAfterFinished``) applies when the run sets none;
    ``held``: its AgentEval has not graded it yet (``HOLD_ANNOTATION``), so it is kept
    whatever its TTL, and due at its end plus its TTL once released (at once if that passed)."""
    ttl = spec.get(TTL_FIELD, default_ttl)
    end = finished_at(status)
    if ttl is None or end is None or held:
        return None
    return end + max(0, int(ttl))


HOLDERS = {
    HOLD_GRADING: ("AgentEval", "agentrun.dev/eval"),
    HOLD_SCHEDULE: ("CronAgentRun", "agentrun.dev/cronagentrun"),
}
"""Each ``HOLD_ANNOTATION`` value: the kind of the object that sets and removes it, and the
label naming that object on its runs (by which it lists them: ``evals.status.EVAL_LABEL``,
``schedules.spec.CRON_LABEL``)."""


def held(meta: Mapping[str, Any]) -> bool:
    """Whether a run (its object's ``metadata``) is held from its TTL: its ``HOLD_ANNOTATION``
    names the kind of its controller (``HOLDERS``), which lists it by its label and removes
    the annotation once the run's end is in its status. A hold on another run (set by hand,
    a made-up value, a run its controller does not list) is none: nothing would ever remove
    it, and the run would outlive every TTL."""
    holder = HOLDERS.get(str((meta.get("annotations") or {}).get(HOLD_ANNOTATION)))
    if holder is None:
        return False
    kind, label = holder
    listed_as = (meta.get("labels") or {}).get(label)
    return any(
        owner.get("controller") is True
        and owner.get("kind") == kind
        and str(owner.get("apiVersion", "")).startswith("agentrun.dev/")
        and owner.get("name") == listed_as
        for owner in meta.get("ownerReferences") or []
    )


async def release_hold(api: KubeApi, run: RunKey) -> None:
    """Remove ``run``'s ``HOLD_ANNOTATION``: its creator (an AgentEval, a CronAgentRun) has its
    end in its status, so its TTL may delete it now. The uid rides in the patch, so a newer run
    of the name is left alone (the API server answers 422); a run gone is done. Raises
    ``ApiError`` otherwise."""
    body = {"metadata": {"uid": run.uid, "annotations": {HOLD_ANNOTATION: None}}}
    try:
        await api.patch(run.ref, body)
    except ApiError as err:
        if err.status != 422:
            raise


class Reaper:
    """Deletes finished runs when their ``ttlSecondsAfterFinished`` has passed."""

    def __init__(
        self, api: KubeApi, *, clock: Callable[[], float] = time.time, retry: float = 5.0
    ) -> None:
        """``api``: where runs are deleted (with their uid as a precondition); ``clock``: epoch
        seconds; ``retry``: seconds before a failed deletion is retried."""
        self.api = api
        self.clock = clock
        self.retry = retry
        self.failures = Failures(log, what="deletion after the TTL")
        """Runs whose deletion failed (each logged once)."""
        self.due: dict[RunKey, float] = {}
        self._heap: list[tuple[float, str, RunKey]] = []
        self._wake = asyncio.Event()
        self._stopping = False

    def observe(
        self,
        run: RunKey,
        *,
        spec: Mapping[str, Any],
        status: Mapping[str, Any],
        default_ttl: int | None = None,
        held: bool = False,
    ) -> None:
        """Note (or update) a run's due time from its object (``default_ttl``: its tenant's;
        ``held``: kept for its AgentEval's grading, ``due_time``); a run without one is
        dropped."""
        due = due_time(spec, status, default_ttl=default_ttl, held=held)
        if due is None:
            self.due.pop(run, None)
            return
        if self.due.get(run) == due:
            return
        self.due[run] = due
        heapq.heappush(self._heap, (due, run.uid, run))
        self._wake.set()

    def forget(self, run: RunKey) -> None:
        """The run was deleted."""
        self.due.pop(run, None)

    def stop(self) -> None:
        """End ``run``."""
        self._stopping = True
        self._wake.set()

    async def reap_due(self) -> float:
        """Delete every run that is due; returns seconds until the next one (at most 3600).
        A run whose due time changed while its deletion was sent (rerun, so no longer due; a
        later time; forgotten) and whose deletion failed keeps what it was told meanwhile: a
        failed deletion is retried, or given up, only while the run is still due at the time
        it was sent."""
        while self._heap:
            due, _, run = self._heap[0]
            if self.due.get(run) != due:  # forgotten or rescheduled
                heapq.heappop(self._heap)
                continue
            wait = due - self.clock()
            if wait > 0:
                return min(wait, 3600.0)
            heapq.heappop(self._heap)
            subject = f"AgentRun {run.namespace}/{run.name}"
            try:
                await self.api.delete(run.ref, uid=run.uid)
            except Exception as err:  # API server away: try again later; refused: give up
                told = self.due.get(run) != due  # told otherwise meanwhile: that holds
                if not self.failures.failed(run, err, subject=subject).final:
                    if not told:
                        self.due[run] = self.clock() + self.retry
                        heapq.heappush(self._heap, (self.due[run], run.uid, run))
                    continue
                if not told:
                    del self.due[run]
            else:
                log.info("%s/%s deleted: %s passed", run.namespace, run.name, TTL_FIELD)
                self.due.pop(run, None)  # gone, whatever was told of it meanwhile
            self.failures.forget(run)
        return 3600.0

    async def run(self) -> None:
        """Reap until ``stop``."""
        while not self._stopping:
            wait = await self.reap_due()
            self._wake.clear()
            await sleep_until_set(self._wake, wait)


class EventPurger(Protocol):
    """What the orphan sweep needs of the bus."""

    async def event_subjects(self) -> list[str]:
        """Every run subject that holds events."""

    async def first_event(self, namespace: str, name: str) -> RunEvent | None:
        """The run's oldest event (its admission), or ``None``."""

    async def purge_run(self, namespace: str, name: str) -> None:
        """Delete every event of a run."""

    async def purge_effects(self, run_uid: str) -> None:
        """Delete the effect ledger's records of run ``run_uid``."""


Sealed = Callable[[RunEvent, RunKey], bool]
"""Whether an event is the operator's sealed admission of run ``RunKey`` (its subject's
namespace and name, the uid it names): ``Seals.fault`` finds nothing wrong with it."""


async def list_run_names(api: KubeApi) -> set[tuple[str, str]]:
    """(namespace, name) of every AgentRun; raises ``ApiError``. Only the names are kept, page
    by page (``KubeApi.list_kept``): the decoded objects of a large cluster are never held at
    once."""
    return set(await api.list_kept(RUNS, _name_of))


async def _sealed_uid(bus: EventPurger, key: tuple[str, str], sealed: Sealed) -> str | None:
    """The uid the subject ``key``'s first event names, if that event is the operator's sealed
    admission of that subject; else ``None`` (no event, or one that does not decode)."""
    try:
        first = await bus.first_event(*key)
    except (ValueError, KeyError) as err:
        log.warning("the first event of deleted run %s/%s does not decode: %s", *key, err)
        return None
    if first is None or first.kind != "admitted":
        return None
    return first.run_uid if sealed(first, RunKey(*key, first.run_uid)) else None


def _name_of(item: dict[str, Any]) -> tuple[str, str]:
    meta = item["metadata"]
    return (str(meta["namespace"]), str(meta["name"]))


async def purge_orphans(
    bus: EventPurger,
    *,
    list_runs: Callable[[], Awaitable[set[tuple[str, str]]]],
    sealed: Sealed,
) -> list[tuple[str, str]]:
    """Purge the events of every run subject whose AgentRun does not exist (deleted while no
    operator ran), and the effect records of the run its sealed admission names (they would
    otherwise stay until the effect bucket's age limit, counted against no tenant); returns
    those (namespace, name). Subjects are listed before the runs, so a run created meanwhile is
    never purged. A subject whose first event is not a sealed admission for that subject (a
    worker credential can append anything) has its events purged but names no run whose
    effects to purge: its uid could be a live run's. Raises what its collaborators raise."""
    subjects = await bus.event_subjects()
    if not subjects:
        return []
    existing = await list_runs()
    purged: list[tuple[str, str]] = []
    for subject in subjects:
        key = subject_key(subject)
        if key not in existing:
            uid = await _sealed_uid(bus, key, sealed)
            if uid is not None:  # before the events: they are what names the run
                await bus.purge_effects(uid)
            await bus.purge_run(*key)
            purged.append(key)
    if purged:
        log.info("purged the events of %d deleted run(s)", len(purged))
    return purged
