"""Coalesced, monotonic ``.status`` writes: at most one patch per run per interval; terminal
ones at once; never a projection older than what the object already shows.

A run with 50 fast turns must not cause 50 API writes: each submission replaces the run's
pending body (the newest projection wins, ordered by event sequence), and a run is patched at
most once per ``interval`` seconds — a patch starts no sooner than ``interval`` after the run's
previous one ended, so two land at least that far apart however slow the API server answers —
except its first and its terminal status, which are written at once. At most ``concurrency``
patches are in flight, so a burst reuses a few connections; the writes due are taken in passes
of ``PASS_WRITES`` a connection, in turn from each tenant and, inside it, from each of its
namespaces (``platform.rounds``), so a tenant with thousands of runs due, in however many
namespaces, delays another's first or terminal status by one pass, not by all of its own
writes. A pass's writes start as connections free up, each on its own: a write that waits long
for its answer (a connection gone dead without a reset waits out ``kube.REQUEST_TIMEOUT``)
holds its own connection only, while the other writes and the next passes go on.

Status never goes backwards, whoever else writes it (an operator that lost its Lease, a
redelivered event): before patching, the writer compares its body with the object's status as
last read, written or seen in a watch event (``observe``: so a run's patches need no read) —
a terminal status (``terminalReason`` set) is final, and a body whose event sequence is below
``status.lastEventSequence`` is dropped — and every patch carries that ``resourceVersion`` as
a precondition, so a write that raced another is re-read and re-decided (409), never applied
blindly. The callback given with a terminal body runs only when this
write is the one that ended the object, which is how an end is counted once even across a
failover.

The version a patch carries is that of the object with the run's uid (a read object of another
uid is a run gone), so a write meant for a deleted run can neither land on a new object of the
same name (its version differs: 409) nor re-create one (404); the API server does not check the
``metadata.uid`` the patch also carries. A run found gone (404, or another uid) is dropped and
handed out by ``next_gone``, so the dispatcher stops whatever of that run is still going. A
body refused for its size (413, or a 422 naming a length or a count) of a run that has not
ended hands the run out by ``next_refused``: the dispatcher ends it (``checkpoint_failed``, its
message naming the refusal), whose terminal status is written, or its minimal form. Any other
body refused as it is (HTTP 400 or 422 — a value outside the schema — or any failure that is not
transient, ``platform.failures``) is replaced once by a minimal status; a minimal one refused so
is dropped. A transient failure is retried every ``interval``. Each run's failure is logged
once, not at every retry.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from agentrun.loops import sleep_until_set

from ..platform import rounds
from ..platform.failures import Failures
from ..platform.kubeapi import ApiError, KubeApi
from .keys import RunKey

log = logging.getLogger(__name__)

MINIMAL_KEYS = (
    "phase",
    "terminalReason",
    "outcome",
    "completionTime",
    "observedGeneration",
    "lastEventSequence",
)
PASS_WRITES = 4
"""Writes a pass of the writer takes, per connection (``concurrency``): a body submitted while
a pass goes waits for that pass's writes to start, not for every write due before it."""
STOP_WAIT = 5.0
"""Seconds ``flush_and_stop`` lets the writes under way end before it cancels them."""
CONFLICT_ATTEMPTS = 5
"""Re-reads of a run whose object changed between our read and our patch, per write."""
SIZE_WORDS = ("Too long", "Too many", "too large", "must have at most", "may not be more than")
"""How the API server's 422 says a value is over a bound (``field.TooLong``, ``TooMany``,
``maxLength``/``maxItems``/``maxProperties`` messages) or the object over etcd's limit."""


def refused_for_size(err: ApiError) -> bool:
    """Whether ``err`` refused a write for its size: HTTP 413 (``RequestEntityTooLarge``:
    over the API server's request or etcd's value limit), or a 422 naming a bound."""
    text = f"{err.reason} {err.body or ''}"
    return err.status == 413 or (err.status == 422 and any(w in text for w in SIZE_WORDS))


@dataclasses.dataclass(frozen=True, slots=True)
class Written:
    """What an AgentRun's ``.status`` holds, as last read, written or seen in a watch event."""

    version: str
    """``metadata.resourceVersion``: the precondition of the next patch."""
    seq: int
    """``status.lastEventSequence`` (0 when absent: queued or ended before admission)."""
    terminal: bool
    """Whether ``status.terminalReason`` is set (the status is final)."""
    reruns: int = 0
    """``status.reruns``: the life of the run the object is in (0: its first)."""
    generation: int = 1
    """``metadata.generation``: what a status projected from the run's events observed."""

    @property
    def unfinished(self) -> bool:
        """Whether it shows the run admitted and not ended: an event sequence (a view
        projected its admission) and no terminal reason."""
        return bool(self.seq) and not self.terminal

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> Written:
        """From an AgentRun object as JSON."""
        found: Mapping[str, Any] = obj.get("status") or {}
        return cls(
            version=str(obj.get("metadata", {}).get("resourceVersion", "")),
            seq=int(found.get("lastEventSequence") or 0),
            terminal=bool(found.get("terminalReason")),
            reruns=int(found.get("reruns") or 0),
            generation=int(obj.get("metadata", {}).get("generation") or 1),
        )


def _newer(version: str, *, than: str) -> bool:
    """Whether ``resourceVersion`` ``version`` is later than ``than``: the API server's are
    etcd revisions (integers); anything else is never taken as newer."""
    return version.isdigit() and than.isdigit() and int(version) > int(than)


@dataclasses.dataclass(slots=True)
class _Pending:
    body: Mapping[str, Any]
    seq: int
    urgent: bool
    on_end: Callable[[], None] | None = None


class StatusWriter:
    """Background writer; ``submit`` never blocks on the API server."""

    def __init__(
        self,
        api: KubeApi,
        *,
        interval: float = 5.0,
        concurrency: int = 8,
        party: Callable[[str], str] = rounds.own_party,
    ) -> None:
        """``api``: where the status is read and patched; ``interval``: least seconds between
        two patches of one run; ``concurrency``: patches in flight at most; ``party``: whose
        turn a namespace's writes take in a pass (``Tenants.party``; by default its own)."""
        self.api = api
        self.party = party
        self.interval = interval
        self.writes = 0
        self.stale = 0
        """Bodies dropped because the object already showed a newer or final status."""
        self._slots = asyncio.Semaphore(concurrency)
        self.concurrency = concurrency
        self.batch = concurrency * PASS_WRITES
        """Writes one pass takes (``in_turn``); the next pass, which sees what was submitted
        meanwhile, is taken when they have all started."""
        self._flying: dict[RunKey, asyncio.Task[None]] = {}
        """The writes started by the writer's task and not ended, by run."""
        self._pending: dict[RunKey, _Pending] = {}
        self._known: dict[RunKey, Written] = {}
        self._last_write: dict[RunKey, float] = {}
        self._wake = asyncio.Event()
        self._gone: asyncio.Queue[RunKey] = asyncio.Queue()
        self._refused: asyncio.Queue[tuple[RunKey, str]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.failures = Failures(log, what="status patch")
        """Runs whose status write failed (each logged once)."""

    def start(self) -> asyncio.Task[None]:
        """Start the flushing task; returns it."""
        self._task = asyncio.create_task(self._run(), name="status-writer")
        return self._task

    async def flush_and_stop(self, *, wait: float = STOP_WAIT) -> None:
        """Stop starting writes, let those under way end (``wait`` seconds at most: a
        terminal status submitted just before lands), write what is pending (best effort),
        then stop."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        flying = list(self._flying.values())
        if flying:
            await asyncio.wait(flying, timeout=wait)
        await self.flush()
        for task in flying:
            task.cancel()
        for task in flying:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def submit(
        self,
        run: RunKey,
        body: Mapping[str, Any],
        *,
        seq: int,
        terminal: bool,
        on_end: Callable[[], None] | None = None,
    ) -> None:
        """Queue ``body`` as the run's status unless a newer one (higher ``seq``) is known.

        ``terminal``: write at once. ``on_end``: for a terminal body, called once if and when
        this write is the one that made the object's status terminal (not when the object
        ended already, by this process or another)."""
        current = self._pending.get(run)
        if current is not None and current.seq > seq:
            return
        known = self._known.get(run)
        if known is not None and (known.terminal or known.seq > seq):
            self.stale += 1
            return
        urgent = terminal or (current is not None and current.seq == seq and current.urgent)
        if on_end is None and current is not None and current.seq == seq:
            on_end = current.on_end
        self._pending[run] = _Pending(body, seq, urgent, on_end)
        self._wake.set()

    def observe(self, run: RunKey, obj: Mapping[str, Any]) -> None:
        """The AgentRun ``obj`` as a watch event showed it: what the writer knows of the run's
        status moves on to it if it is newer (a greater ``resourceVersion``), so the next
        patch's precondition matches without reading the object again. A run this writer does
        not know is learned only while it has not ended. An observation never makes a write:
        a stale one costs at most the re-read of a refused (409) patch."""
        seen = Written.of(obj)
        known = self._known.get(run)
        if known is None:
            if not seen.terminal:
                self._known[run] = seen
        elif _newer(seen.version, than=known.version):
            self._known[run] = seen

    def unfinished(self) -> list[tuple[RunKey, Written]]:
        """The runs whose object, as last known, shows them admitted and not ended
        (``Written.unfinished``)."""
        return [(run, w) for run, w in self._known.items() if w.unfinished]

    def shows_unfinished(self, run: RunKey) -> bool:
        """Whether run ``run`` is one ``unfinished`` lists (known, admitted, not ended)."""
        known = self._known.get(run)
        return known is not None and known.unfinished

    def reruns(self, run: RunKey) -> int:
        """``status.reruns`` of run ``run``'s object as last known (``exists`` reads an
        unknown one); 0 when not known."""
        known = self._known.get(run)
        return known.reruns if known is not None else 0

    async def exists(self, run: RunKey, *, reread: bool = False) -> bool:
        """Whether run ``run``'s object is there with its uid: known from a watch event or a
        write, else read once (kept, as ``observe`` keeps one, for the next patch's
        precondition); ``reread``: read even when known (a run that writes nothing for long,
        whose deletion's watch event may have been missed). A run found gone is dropped and
        handed out by ``next_gone``, as a write that found it gone would hand it; an API
        error reads as there (the run's next write, or the next read, finds out)."""
        if run in self._known and not reread:
            return True
        try:
            found = await self._read(run)
        except Exception as err:  # the API server away: its next write finds out
            log.info("could not read %s/%s: %r", run.namespace, run.name, err)
            return True
        if found is None:
            self._went(run)
            return False
        if not found.terminal:
            self._known[run] = found
        return True

    async def next_gone(self) -> RunKey:
        """Wait for the next run whose object turned out to be gone (404/other uid)."""
        return await self._gone.get()

    async def next_refused(self) -> tuple[RunKey, str]:
        """Wait for the next run whose status the API server refused for its size while it
        had not ended, with why (to end it)."""
        return await self._refused.get()

    def forget(self, run: RunKey) -> None:
        """Drop everything about a deleted run."""
        self._pending.pop(run, None)
        self._known.pop(run, None)
        self._last_write.pop(run, None)
        self.failures.forget(run)

    async def flush(self) -> None:
        """Write every pending body now."""
        for run in list(self._pending):
            await self._write(run)

    async def _write(self, run: RunKey) -> None:
        pending = self._pending.pop(run, None)
        if pending is None:
            return
        self._last_write[run] = time.monotonic()  # holds the run's next write while this goes
        try:
            async with self._slots:  # few connections, reused: no TLS handshake per write
                await self._write_checked(run, pending)
        except Exception as err:
            self._failed(run, pending, err)
        else:
            self.failures.succeeded(run, subject=f"AgentRun {run.namespace}/{run.name}")
        finally:
            if run in self._last_write:  # not ended nor forgotten meanwhile: count from the end
                self._last_write[run] = time.monotonic()

    async def _write_checked(self, run: RunKey, pending: _Pending) -> None:
        """Compare with the object's status, patch at its resourceVersion; re-read on 409.
        A run forgotten while this write was on its way (deleted, or rerun: its object now
        holds another life) is not patched again."""
        for _ in range(CONFLICT_ATTEMPTS):
            if run not in self._last_write:
                return  # forgotten meanwhile (``_write`` marks every run it writes)
            known = self._known.get(run) or await self._read(run)
            if run not in self._last_write:
                return
            if known is None:
                self._went(run)
                return
            if known.terminal or known.seq > pending.seq:
                self.stale += 1
                self._known[run] = known
                log.info(
                    "%s/%s: status at sequence %s%s; older projection (sequence %s) dropped",
                    run.namespace,
                    run.name,
                    known.seq,
                    " (final)" if known.terminal else "",
                    pending.seq,
                )
                return
            try:
                patched = await self.api.patch_status(
                    run.ref, pending.body, uid=run.uid, version=known.version
                )
            except ApiError as err:
                if err.status != 409:
                    raise
                if self._known.get(run) is known:  # changed, or replaced, and not seen yet
                    self._known.pop(run, None)  # so read it again
                continue  # else the watch showed a newer version meanwhile: patch on that
            written = Written.of(patched)
            self.writes += 1
            self._known[run] = written
            if written.terminal:
                self._last_write.pop(run, None)
                if pending.on_end is not None:
                    pending.on_end()
            return
        raise ApiError(409, f"the status of {run.namespace}/{run.name} keeps changing")

    async def _read(self, run: RunKey) -> Written | None:
        """The run's status as stored; ``None`` when the object is gone (404, or another
        uid). Raises ``ApiError`` otherwise."""
        obj = await self.api.get(run.ref)
        if obj is None or obj.get("metadata", {}).get("uid") != run.uid:
            return None
        return Written.of(obj)

    def _went(self, run: RunKey) -> None:
        log.info("%s/%s (uid %s) is gone; status dropped", run.namespace, run.name, run.uid)
        self.forget(run)
        self._gone.put_nowait(run)

    def _failed(self, run: RunKey, pending: _Pending, err: Exception) -> None:
        """A write failed: gone (404) is dropped; a transient failure retried; a body refused
        as it is replaced by a minimal one; a minimal one refused so dropped."""
        if isinstance(err, ApiError) and err.status == 404:
            self._went(run)
            return
        if (
            isinstance(err, ApiError)
            and refused_for_size(err)
            and not pending.body.get("terminalReason")
        ):
            log.error(
                "the API server refused the status of %s/%s for its size (HTTP %s): %s; "
                "ending the run",
                run.namespace,
                run.name,
                err.status,
                err.reason,
            )
            self._refused.put_nowait((run, _size_message(pending.body, err)))
            return
        failure = self.failures.failed(run, err, subject=f"AgentRun {run.namespace}/{run.name}")
        if failure.transient:
            self._retry(run, pending)
            return
        if set(pending.body) - set(MINIMAL_KEYS) - {"message"}:
            minimal = {k: pending.body[k] for k in MINIMAL_KEYS if k in pending.body}
            why = f"by the API server ({err})" if isinstance(err, ApiError) else f"({err!r})"
            minimal["message"] = f"full status refused {why}"[:1000]
            self._retry(run, _Pending(minimal, pending.seq, pending.urgent, pending.on_end))
            return
        log.error(
            "even the minimal status of %s/%s was refused (%s); dropped",
            run.namespace,
            run.name,
            err,
        )

    def _retry(self, run: RunKey, pending: _Pending) -> None:
        """Re-queue a failed write after ``interval`` (even a terminal one: no hot loop),
        unless the run was forgotten while it was on its way (``forget``)."""
        if run not in self._pending and run in self._last_write:
            pending.urgent = False
            self._pending[run] = pending
            self._wake.set()

    def _in_turn(self, due: list[RunKey]) -> Iterator[RunKey]:
        """``due`` in a pass's order: the parties in turn, their namespaces in turn inside
        each (``rounds.in_turn``)."""
        return rounds.in_turn(due, namespace=lambda run: run.namespace, party=self.party)

    def _due(self, now: float) -> tuple[list[RunKey], float]:
        """The runs whose pending body may be written at ``now`` (urgent, or ``interval``
        after their last write ended) and not being written, and the seconds until the next
        other one may be (3600 when none waits)."""
        due: list[RunKey] = []
        wait = 3600.0
        for run, pending in self._pending.items():
            if run in self._flying:
                continue
            ready_at = self._last_write.get(run, 0.0) + self.interval
            if pending.urgent or ready_at <= now:
                due.append(run)
            else:
                wait = min(wait, ready_at - now)
        return due, wait

    def _launch(self, run: RunKey) -> None:
        """Start run ``run``'s write on its own; its end wakes the writer's task."""
        task = asyncio.create_task(self._write(run), name=f"status-write-{run.name}")
        self._flying[run] = task

        def ended(_: asyncio.Task[None]) -> None:
            if self._flying.get(run) is task:
                del self._flying[run]
            self._wake.set()

        task.add_done_callback(ended)

    async def _run(self) -> None:
        """Take the writes due in passes (``batch`` at most, ``in_turn``) and start each as a
        connection frees up; the next pass is taken when the last one's writes have all
        started."""
        taking: collections.deque[RunKey] = collections.deque()
        while True:
            self._wake.clear()  # before looking: a submit or an end after it wakes the wait
            if not taking:
                due, wait = self._due(time.monotonic())
                taking.extend(itertools.islice(self._in_turn(due), self.batch))
                if not taking:
                    await sleep_until_set(self._wake, wait)
                    continue
            while taking and len(self._flying) < self.concurrency:
                run = taking.popleft()
                if run in self._pending and run not in self._flying:
                    self._launch(run)
            if taking:  # every connection busy: a write's end wakes this
                await self._wake.wait()


def _size_message(body: Mapping[str, Any], err: ApiError) -> str:
    """Why a run ends whose status was refused for its size: the size and the largest field."""
    sizes = {key: len(json.dumps(value, default=str).encode()) for key, value in body.items()}
    largest = max(sizes, key=lambda k: sizes[k]) if sizes else "status"
    return (
        f"the run's status ({sum(sizes.values())} bytes; the largest field status.{largest}, "
        f"{sizes.get(largest, 0)} bytes) was refused by the API server for its size "
        f"(HTTP {err.status}: {err.reason[:300]}); it cannot be shown, so the run ends"
    )
