"""The AgentEval controller: creates each case's run, grades it when it ends, writes the table.

What belongs here: the reconcile of one AgentEval (read it and its Agents, decide the round,
delete the runs of earlier rounds, grade the runs that ended, create runs up to the suite's
parallelism, write ``.status``, post Events and count metrics) and the one loop that runs
reconciles one at a time. What does not: the rules (``spec``: the spec; ``status``: rounds,
run names and manifests, the status body; ``grading``: grading; ``news``: the counts and
Events, told once the status recording them is written), the spec's check and its memory
(``checked``), the API calls (``store``), the kopf entry points (``handlers.evals``).

Reconciles are requested with ``kick`` (a suite changed, one of its runs ended or went away,
an Agent it runs changed) and run one at a time from a queue, so two runs ending together
never race on the same status; a failed reconcile is retried after ``retry`` seconds. Every
decision is made from what the API server holds (the suite, its runs by label, the graded rows
of its status): an operator restart mid-round picks up where it was, and run names are
deterministic, so a run is never created twice. A round is graded on the leader only: the
controller is one of the parts ``wiring`` starts after the leader Lease is taken.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Protocol

from agentrun import loops, metrics
from agentrun.protocol import RunEvent

from ..platform.events import EventRecorder, EventType
from ..platform.failures import Failures
from ..platform.fairwork import FairWork
from ..platform.kubeapi import KubeApi
from ..platform.spec import SpecError
from . import grading
from .checked import CheckedSpecs
from .news import EvalNews, involved
from .spec import EvalCase, EvalSpec
from .status import (
    RECONCILE_FAILED,
    CasePhase,
    CaseRow,
    EvalRef,
    Round,
    eval_status,
    given_up,
    graded_held,
    graded_row,
    invalid_status,
    previous_rows,
    round_id,
    run_manifest,
    run_name,
    run_result,
    started_runs,
    unchanged,
    vanished_row,
)
from .store import EvalStore

log = logging.getLogger(__name__)

EvalKey = tuple[str, str]
"""(namespace, name) of an AgentEval."""


class RunEvents(Protocol):
    """Reads a run's committed events (``Bus``)."""

    def iter_events(
        self, namespace: str, name: str, *, after_seq: int = 0
    ) -> AsyncIterator[RunEvent]:
        """Every event of the run with a sequence above ``after_seq``, oldest first, one at
        a time."""


RECONCILES_AT_ONCE = 4
"""AgentEvals reconciled at once (a suite's first check, of up to 200 answer schemas, can
take a minute of a thread: the others are served meanwhile)."""
PER_SHARE = 1
"""AgentEvals of one share reconciled at once: the share is the AgentTenant binding the
suite's namespace, every namespace it binds together (``Tenants.party``), or the namespace
itself when no tenant binds it. A share's slow suites hold one place (and so one of the
checks' threads, ``FairWork``, which cannot be taken back from a check running), however many
namespaces its tenant spans; the others serve the other shares' (its next suites wait their
turn, in the order asked)."""


class EvalController:
    """Reconciles AgentEvals, ``RECONCILES_AT_ONCE`` at a time, ``PER_SHARE`` of one tenant's
    namespaces together, and one suite never twice at once (``kick`` requests, ``run``
    serves)."""

    def __init__(
        self,
        api: KubeApi,
        *,
        runs: RunEvents,
        events: EventRecorder,
        checks: FairWork | None = None,
        retry: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``api``: where the suite, its Agents and its runs are read and written; ``runs``:
        where a run's trajectory is read; ``events``: Kubernetes Events; ``checks``: the
        threads a suite's spec is checked and its answers graded on (default: threads of its
        own), whose parties share out the places too (``PER_SHARE``; the operator's party is
        ``Tenants.party``); ``retry``: seconds before a failed reconcile is tried again;
        ``clock``: epoch seconds."""
        self.store = EvalStore(api)
        self.runs = runs
        self.events = events
        self.checks = checks or FairWork()
        self.news = EvalNews(events)
        """Tells the counts and Events of what a written status records, each once."""
        self.retry = retry
        self.clock = clock
        self._queue: asyncio.Queue[EvalKey] = asyncio.Queue()
        self._queued: set[EvalKey] = set()
        self._running: set[EvalKey] = set()
        """Suites being reconciled; one kicked meanwhile is served again after."""
        self._again: set[EvalKey] = set()
        self._held: collections.Counter[str] = collections.Counter()
        """Places held by each share's suites (``PER_SHARE`` at most)."""
        self._holding: dict[EvalKey, str] = {}
        """The share each suite being reconciled took its place of (given back to it)."""
        self._parked: dict[str, dict[EvalKey, None]] = {}
        """Suites asked for while their share held all its places, in the order asked."""
        self._uses: dict[EvalKey, frozenset[str]] = {}
        """The Agents each known suite runs, so an Agent's change kicks them."""
        self.specs = CheckedSpecs(self.checks)
        """Known suites' specs as checked."""
        self._stopped = False
        self.failures = Failures(log, what="reconcile")
        """Failed reconciles by suite (each logged once)."""

    def kick(self, namespace: str, name: str) -> None:
        """Ask for a reconcile of AgentEval ``namespace/name`` (once, however often asked
        before it runs)."""
        key = (namespace, name)
        if key in self._queued or self._stopped:
            return
        self._queued.add(key)
        self._queue.put_nowait(key)

    def agent_changed(self, namespace: str, agent: str) -> None:
        """Agent ``namespace/agent`` changed or was deleted: reconcile every suite running it
        (a new round starts when its generation moved)."""
        for (ns, name), used in list(self._uses.items()):
            if ns == namespace and agent in used:
                self.kick(ns, name)

    def forget(self, namespace: str, name: str) -> None:
        """AgentEval ``namespace/name`` was deleted (its runs go with it: they are owned)."""
        self._uses.pop((namespace, name), None)
        self.specs.forget(namespace, name)
        self.news.forget(namespace, name)
        metrics.forget_eval(namespace, name)

    def stop(self) -> None:
        """Stop taking requests; ``run`` ends when its task is cancelled."""
        self._stopped = True

    async def run(self) -> None:
        """Serve reconcile requests in the order asked, ``RECONCILES_AT_ONCE`` at a time,
        forever: a suite whose check takes long holds one place, not the others' turns. A
        suite asked for while it is being reconciled is reconciled again once that ends.
        Cancelled, it cancels the reconciles it started and returns once they have ended."""
        slots = asyncio.Semaphore(RECONCILES_AT_ONCE)
        serving: set[asyncio.Task[None]] = set()
        try:
            while True:
                key = await self._queue.get()
                self._queued.discard(key)
                if key in self._running:
                    self._again.add(key)
                    continue
                share = self.checks.party(key[0])
                if self._held[share] >= PER_SHARE:
                    self._parked.setdefault(share, {})[key] = None
                    continue
                await slots.acquire()
                self._held[share] += 1
                self._holding[key] = share
                self._running.add(key)
                name = f"eval {key[0]}/{key[1]}"
                task = asyncio.create_task(self._serve(key, slots), name=name)
                serving.add(task)
                task.add_done_callback(serving.discard)
                loops.log_failure(task, what=f"reconcile of AgentEval {key[0]}/{key[1]}")
        finally:
            for task in serving:
                task.cancel()
            await asyncio.gather(*serving, return_exceptions=True)

    async def _serve(self, key: EvalKey, slots: asyncio.Semaphore) -> None:
        """Reconcile ``key`` in one of ``run``'s places, then free it: the first suite of its
        share waiting for the place is asked for again, then ``key`` if it was kicked
        meanwhile (behind it: a suite kicked during each of its reconciles, by its own status
        writes or its cases' runs ending, would otherwise take its share's place back every
        time, and its tenant's other suites wait for all of them)."""
        try:
            await self._reconcile_safely(key)
        finally:
            self._running.discard(key)
            share = self._holding.pop(key)
            self._held[share] -= 1
            if self._held[share] <= 0:
                del self._held[share]
            slots.release()
            self._unpark(share)  # first: a suite asked again while it ran queues behind it
            if key in self._again:
                self._again.discard(key)
                self.kick(*key)

    def _unpark(self, share: str) -> None:
        """Ask again for the first suite of ``share`` that waited for one of its places."""
        parked = self._parked.get(share)
        if not parked:
            return
        key = next(iter(parked))
        del parked[key]
        if not parked:
            del self._parked[share]
        self.kick(*key)

    async def _reconcile_safely(self, key: EvalKey) -> None:
        """Reconcile ``key``; a transient failure is retried after ``retry`` seconds, a
        permanent one once more, then the suite is given up (``_give_up``). Each failure is
        logged once."""
        subject = f"AgentEval {key[0]}/{key[1]}"
        try:
            await self.reconcile(*key)
        except Exception as err:
            failure = self.failures.failed(key, err, subject=subject)
            if failure.final:
                try:
                    await self._give_up(key, err)
                    return
                except Exception as giving_up:  # the API server away: try again later
                    self.failures.failed(key, giving_up, subject=subject)
            asyncio.get_running_loop().call_later(self.retry, self.kick, *key)
            return
        self.failures.succeeded(key, subject=subject)

    async def _give_up(self, key: EvalKey, err: Exception) -> None:
        """Fail the suite for this generation (``RECONCILE_FAILED``, naming ``err``): its runs
        are deleted, a Warning Event posted; it is reconciled again when its spec changes.
        Raises ``ApiError``."""
        obj = await self.store.get_suite(*key)
        if obj is None:
            return
        meta = obj.get("metadata") or {}
        suite = EvalRef(*key, str(meta.get("uid", "")), int(meta.get("generation") or 1))
        message = f"reconciling failed twice, not for a passing reason: {type(err).__name__}: {err}"
        await self._invalid(suite, message[:1000], obj.get("status") or {}, reason=RECONCILE_FAILED)
        self.failures.forget(key)

    async def reconcile(self, namespace: str, name: str) -> None:
        """Bring AgentEval ``namespace/name``'s runs and status up to date (see the module);
        a suite being deleted (a foreground deletion, another controller's finalizer) is left
        as it is: no run is created for it.

        Raises ``ApiError`` (other than a vanished object) and what reading a run's
        events raises.
        """
        obj = await self.store.get_suite(namespace, name)
        if obj is None:
            self.forget(namespace, name)
            return
        meta = obj.get("metadata") or {}
        suite = EvalRef(namespace, name, str(meta.get("uid", "")), int(meta.get("generation") or 1))
        previous: Mapping[str, Any] = obj.get("status") or {}
        if given_up(previous, generation=suite.generation):
            return  # until its spec changes
        if meta.get("deletionTimestamp"):
            return  # being deleted: no run is created (nor graded) that would outlive it
        metrics.know_eval(namespace, name)
        spec = await self.specs.of(suite, obj.get("spec"))
        if isinstance(spec, SpecError):
            self._uses.pop((namespace, name), None)
            await self._invalid(suite, str(spec), previous)
            return
        self._uses[(namespace, name)] = spec.agents
        seen = await self.store.agents_seen(namespace, spec.agents)
        round_ = Round(
            round_id(suite.generation, seen.values()), suite.generation, seen[spec.agent]
        )
        current = await self.store.runs_of_round(suite, round_.id)
        rows, waiting = await self._rows(suite, spec, round_, current=current, previous=previous)
        refused = await self._create(suite, spec, round_, rows=rows, waiting=waiting)
        if refused is not None and not graded_held(suite.namespace, rows, current):
            raise refused  # nothing to store first
        body = eval_status(rows, round_=round_, previous=previous, now=self.clock())
        self.news.note(suite, rows, round_=round_.id, previous=previous)
        if not unchanged(body, previous):
            # raises when it fails: nothing is told twice
            await self.store.write_status(suite, body)
        self.news.tell(suite, rows, round_=round_)
        for run in graded_held(suite.namespace, rows, current):  # their grades are stored
            await self.store.release_run(run)
        if refused is not None:  # once the grades are stored and their runs released
            raise refused

    async def _rows(
        self,
        suite: EvalRef,
        spec: EvalSpec,
        round_: Round,
        *,
        current: Mapping[str, Mapping[str, Any]],
        previous: Mapping[str, Any],
    ) -> tuple[list[CaseRow], list[tuple[int, EvalCase]]]:
        """Each case's row: kept if graded already, graded now if its run ended, Failed if
        its run went away before it was graded (``vanished_row``), else its run's (Pending
        when it has none yet); and the waiting cases, by their rows' places (``_create``)."""
        kept = previous_rows(previous, round_=round_.id)
        started = started_runs(previous, round_=round_.id)
        rows: list[CaseRow] = []
        waiting: list[tuple[int, EvalCase]] = []
        for case in spec.cases:
            name = run_name(suite, case.name, round_=round_.id)
            row = kept.get(case.name)
            run = current.get(case.name)
            if row is not None and row.run == name:
                rows.append(row)
            elif run is None and started.get(case.name) == name:
                rows.append(vanished_row(case.name, name))  # never created twice in a round
            elif run is None:
                waiting.append((len(rows), case))
                rows.append(CaseRow(case.name, name, CasePhase.PENDING))
            elif (run.get("status") or {}).get("terminalReason"):
                rows.append(await self._grade(case, run, namespace=suite.namespace))
            else:
                rows.append(CaseRow(case.name, name, CasePhase.RUNNING))
        return rows, waiting

    async def _create(
        self,
        suite: EvalRef,
        spec: EvalSpec,
        round_: Round,
        *,
        rows: list[CaseRow],
        waiting: list[tuple[int, EvalCase]],
    ) -> Exception | None:
        """Create the runs of ``waiting`` cases while fewer than ``parallelism`` are
        unfinished, each one's row in ``rows`` Running then; what refused a create (the rest
        wait), returned, not raised: the pass stores its grades and releases their runs
        first, else a ResourceQuota full of runs held for grading stayed full for ever."""
        room = spec.parallelism - sum(1 for r in rows if r.phase is CasePhase.RUNNING)
        for index, case in waiting[: max(room, 0)]:
            manifest = run_manifest(
                suite, case, round_=round_.id, ttl=spec.ttl_seconds_after_finished
            )
            try:
                await self.store.create_run(manifest)
            except Exception as err:
                return err
            rows[index] = CaseRow(case.name, rows[index].run, CasePhase.RUNNING)
        return None

    async def _grade(self, case: EvalCase, run: Mapping[str, Any], *, namespace: str) -> CaseRow:
        """The graded row of ``case``, whose ``run`` ended (counted when a status write records
        it: ``EvalNews``)."""
        name = str(run["metadata"]["name"])
        # folded one event at a time: a run's trajectory (thousands of turns, each with tool
        # results of up to 16 KiB) read whole held up to ~160 MiB per graded run
        tools: set[str] = set()
        async for event in self.runs.iter_events(namespace, name):
            tools |= grading.called_in(event)
        result = run_result(run.get("status") or {}, tools=frozenset(tools))
        # in a thread: the answer is the model's and the checks the suite author's (bounded
        # work on the linear engine, up to about half a second of CPU): the event loop keeps
        # serving probes, the Lease and every other tenant's runs meanwhile
        failures = await self.checks.run(namespace, grading.grade, case.expect, result)
        return graded_row(case.name, name, result, failures)

    async def _invalid(
        self,
        suite: EvalRef,
        message: str,
        previous: Mapping[str, Any],
        *,
        reason: str = "InvalidSpec",
    ) -> None:
        """A suite the operator cannot run (``reason``: ``InvalidSpec``, or
        ``RECONCILE_FAILED``): no runs (earlier rounds' deleted), Failed."""
        await self.store.runs_of_round(suite, "")
        body = invalid_status(
            message, generation=suite.generation, previous=previous, now=self.clock(), reason=reason
        )
        if unchanged(body, previous):
            return
        self.events.record(
            involved(suite),
            type=EventType.WARNING,
            reason=reason,
            message=message,
            key=(suite.uid, reason, suite.generation),
        )
        await self.store.write_status(suite, body)
