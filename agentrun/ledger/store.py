"""Tenant ledgers in JetStream KV, changed only through named operations.

Bucket ``AGENTRUN_LEDGER``. A tenant's ledger has one of two layouts (``entries.LAYOUTS``),
told apart by its ``book.<tenant>`` value's format: ``single``, the whole ledger in that one
value (what earlier releases read and write; at most ``MAX_ACTIVE_RUNS`` active runs), or
``split``. A tenant keeps the layout it is found in; a new one gets the store's ``layout``; a
store whose ``layout`` is ``split`` (the operator's, once every worker reads split ledgers)
splits a one-value ledger at its next change, and any store splits one that its admissions
would take past ``MAX_ACTIVE_RUNS`` (``outgrows``: a tenant is never held at that cap). Split,
per tenant:

- ``book.<tenant>``: its totals (``used``, the sums of its holds, its active runs counted, its
  first waiting calls) and the entries of up to ``INLINE_RUNS`` of its runs inline;
- ``run.<tenant>.<run-uid>``: the entry of each other run that has one (its slot and charges,
  its holds, its waiting calls, the calls charged for it), deleted when nothing of it is left;
- ``queue.<tenant>.<run-uid>``: each run waiting in its admission queue (written by the
  operator only; the order is computed, see ``queue``);
- ``making.<tenant>``: while its ledger is made anew or split in several atomic batches, their
  guard (below; written by the operator only).

No value grows with the number of a tenant's runs, and a change of one run writes its entry and
the totals only — one value when the run is inline, one atomic batch of both otherwise (``cas``)
— so neither the size of a write nor its chance to race grows with the tenant. A small tenant's
runs are all inline: each of its changes is one compare-and-set of one small value.

This is the tenant-budget port: admitting runs (``admit_run``, ``admit_runs``), a turn's hold
(``turn_hold``, a ``TurnHold`` over this store's ``TurnLedger`` operations: ``reserve_turn``,
``reserve_call``, ``record_spend``, ``refresh_hold``, ``settle_turn``, ``release_hold``,
``abandon_hold``, ``stop_waiting``), ending a run (``close_run``), the operator sweep's fixes
(``repair_entry``, ``drop_unfinished``) and the admission queue (``enqueue``, ``dequeue``,
``queued``). Callers outside this package change the ledger only through these. Each is one
write, compare-and-set on the revisions read, group-committed per tenant (``cas``), of at most
``cas.MAX_BATCH`` values: the changes of one write name ``cas.BATCH_VALUES`` runs at most, and
an operation of more runs (an admission of many, the sweep's repairs) is several writes, each
a whole change of its own.

Two changes write every run of a tenant: a ledger made anew (its totals lost: seeded, adopting
the entries left) and a one-value ledger split. Each is written in as many atomic batches as it
takes (``cas.CasStore._put_guarded``), its run entries first and its totals last, the commit
point: until the totals land nobody reads those entries (a missing ledger is no budget, and a
one-value ledger is read whole from its one value, by this release and the previous one). So a
writer that stops half-way changed nothing anyone reads; the next change of the ledger lists
what it wrote and adopts it (made anew; every seeded run charged at least what the seed counts,
``Book.seed``) or rewrites or deletes it (split), and the operator's sweep deletes what a split
that nobody finishes left (``unfinished``, ``drop_unfinished``). Every batch of such a write
rewrites the guard ``making.<tenant>`` by compare-and-set, and the last deletes it: a second
writer making or splitting the same ledger at once finds the guard changed and starts over on
what the first wrote, so no run's entry is left that the totals do not count. The split keeps
the tenant's usage, holds, active runs and memories. Admission queues are one value per
run in both layouts (only operators read them, and this release's operator reads both): the
one-value queue of earlier releases (``queue.<tenant>``) is moved into them when the operator
first reads it, keeping its order.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any, TypeVar

import nats.js.errors
from nats.js import JetStreamContext, api

from agentrun import buckets, kernel, protocol
from agentrun.ledger import codec
from agentrun.ledger.book import Book
from agentrun.ledger.cas import (
    BATCH_VALUES,
    GUARD_IDLE,
    MAX_BATCH,
    CasStore,
    Conflict,
    LedgerUnavailable,
    Stored,
    Write,
    apply_all,
    guard_since,
)
from agentrun.ledger.entries import (
    BUDGET_EXHAUSTED,
    LAYOUTS,
    MAX_ACTIVE_RUNS,
    BudgetRefusal,
    Hold,
    LedgerCorrupt,
    Seed,
    TenantLimits,
    UsageFloor,
    window_start,
)
from agentrun.ledger.hold import DEFAULT_HOLD_TTL, MovedOn, TurnHold, TurnRef
from agentrun.ledger.queue import QueuedRun, TenantQueue
from agentrun.ledger.reserve import BudgetWait, CallNeed, Granted

__all__ = [
    "BUCKET",
    "INLINE_RUNS",
    "BookMissing",
    "Ending",
    "LedgerStore",
    "LedgerUnavailable",
    "QueueFull",
    "QueuedRun",
    "Repair",
]

log = logging.getLogger(__name__)

BUCKET = protocol.LEDGER_BUCKET
T = TypeVar("T")

INLINE_RUNS = 32
"""Runs whose entries a tenant's totals hold inline (the first to need an entry; the others get
a value of their own). An inline entry costs one write per change instead of an atomic batch of
two; at about 700 bytes an entry at most (its slot, a hold with a recorded spend, a waiting
call, every name at its longest), the totals stay under 25 KB."""


class BookMissing(LookupError):
    """The tenant has no ledger book: it has no budget. Only the operator's admission makes a
    book (with the AgentTenant's limits); any other change of a missing book is refused, never
    started as an empty, unlimited one."""


class QueueFull(Exception):
    """The tenant's admission queue holds as many runs as the platform allows
    (``AGENTRUN_MAX_QUEUED_RUNS``): this run cannot join it. The queue is one value per run in
    either layout, so storage sets it no cap of its own."""

    def __init__(self, tenant: str, *, limit: int) -> None:
        super().__init__(
            f"AgentTenant {tenant!r}'s admission queue holds {limit} runs, the most the "
            "platform allows (AGENTRUN_MAX_QUEUED_RUNS)"
        )
        self.tenant = tenant
        self.limit = limit


@dataclasses.dataclass(frozen=True, slots=True)
class Repair:
    """What the operator's sweep found about one run, read from its events, to fix its tenant's
    ledger with: an expired hold to charge and drop, or an active run that has ended or gone."""

    hold_key: str
    """The expired hold's key (``<run-uid>:<turn>``), or ``""`` for a stale active run."""
    run_uid: str
    last: kernel.RunSummary | None
    """The summary of the run's last event (``None``: the run left no events)."""
    last_time: float = 0.0
    """When that event was made, epoch seconds (0: unknown)."""
    committer: str = ""
    """The delivery (hold owner) that event names as the committer of the run's last turn
    ("" if it names none: then that turn's other calls are not told apart)."""
    since: float | None = dataclasses.field(kw_only=True)
    """Which of the run's entries the sweep judged: when its slot's charge starts in the
    window as read (``Book.since_of`` of its active entry), or ``None`` if it held no slot.
    The uid does not tell a run's lives apart: a rerun admitted between the sweep's read and
    this repair is a new entry of the same uid, and the first life's events must not close
    or charge it. The repair applies only while the run's entry is still the one judged
    (``Book.slot_since``); otherwise it does nothing, and the next sweep judges what it finds
    then."""


@dataclasses.dataclass(frozen=True, slots=True)
class Ending:
    """Whose end ``LedgerStore.close_run`` settles, as the run's last event tells it."""

    committer: str = ""
    """The delivery (hold owner) that event names as the committer of the run's last turn
    ("": it names none; then that turn's other calls are not told apart)."""
    life: int | None = None
    """The life of the run the event is of (the ``reruns`` its admission sealed; ``None``: not
    known, taken for the life whose slot is there). The uid does not tell a run's lives
    apart: a rerun admitted while this close was still on its way holds a slot of the same
    uid and a later life (``Active.life``), which the close leaves alone."""


Rebuild = Callable[[str, float, float], Awaitable[Seed]]
"""What a tenant's window (its start and end, epoch seconds) used at least and which of its
runs are active, from outside the ledger (the operator: its AgentRuns' recorded usage), for a
book made anew (``Seed``)."""


def book_key(tenant: str) -> str:
    """``book.<tenant>``: the tenant's totals (tenant names are DNS subdomains: valid KV key
    characters)."""
    return f"{protocol.LEDGER_TOTALS}.{tenant}"


def run_key(tenant: str, run_uid: str) -> str:
    """``run.<tenant>.<run-uid>``: a run's entry of its own (uids hold no dot, so the last
    token is the uid whatever dots the tenant's name has)."""
    return f"{protocol.LEDGER_RUNS}.{tenant}.{run_uid}"


def queue_key(tenant: str, run_uid: str) -> str:
    """``queue.<tenant>.<run-uid>``: a run waiting in the tenant's admission queue."""
    return f"{protocol.LEDGER_QUEUES}.{tenant}.{run_uid}"


def legacy_queue_key(tenant: str) -> str:
    """``queue.<tenant>``: the one-value admission queue of earlier releases."""
    return f"{protocol.LEDGER_QUEUES}.{tenant}"


def making_key(tenant: str) -> str:
    """``making.<tenant>``: the guard of the tenant's ledger while it is made or split in
    several atomic batches (``cas.CasStore._put_guarded``)."""
    return f"{protocol.LEDGER_MAKING}.{tenant}"


SPLIT_RUNS = 800
"""Runs a one-value ledger may hold, active or remembered as ended, before an admission of a
tenant allowed more than ``MAX_ACTIVE_RUNS`` splits it (a one-value ledger is rewritten whole
at every change: its runs stay few). A split of more is written in several atomic batches
too (``LedgerStore._attempt``), so a ledger that holds more (an earlier release's, or one
whose tenant's cap was raised) splits all the same."""


def outgrows(book: Book, admits: int) -> bool:
    """Whether admitting ``admits`` more runs would take the one-value ledger ``book`` past
    ``MAX_ACTIVE_RUNS``, or its runs (active or remembered as ended) past ``SPLIT_RUNS``,
    while its tenant's ``maxConcurrentRuns`` allows more than ``MAX_ACTIVE_RUNS``: then it is
    split (the ``split`` layout) instead of keeping runs queued at that cap. A worker of the
    previous release cannot read a split ledger (docs/operations.md, upgrades); a tenant that
    big was held at the cap by that release."""
    cap = book.limits.max_concurrent_runs
    room = cap is None or cap > MAX_ACTIVE_RUNS
    runs = max(book.active_runs, len(book.runs)) + admits
    return (
        room and admits > 0 and (book.active_runs + admits > MAX_ACTIVE_RUNS or runs > SPLIT_RUNS)
    )


@dataclasses.dataclass(frozen=True, slots=True)
class _Change:
    """One named operation's change of a tenant's ledger, and what it needs loaded."""

    fn: Callable[[Book], Any]
    runs: frozenset[str] | None
    """The runs whose entries it reads or changes (``None``: every run of the tenant)."""
    limits: TenantLimits | None
    """The limits a missing ledger starts with (``None``: a missing ledger is refused)."""
    seed: Seed | None = None
    """What a ledger made anew starts with (``Book.seed``)."""
    admits: int = 0
    """Runs it may admit (a one-value ledger they would take past ``MAX_ACTIVE_RUNS`` is
    split first: ``LedgerStore.outgrows``)."""
    tidy: bool = False
    """Whether it drops what a guarded write of a one-value ledger that never committed left
    (``LedgerStore.drop_unfinished``)."""

    @property
    def weight(self) -> int:
        """The run entries it names, as the group commit weighs it (``cas.BATCH_VALUES``;
        every run: as much as a write carries)."""
        return BATCH_VALUES if self.runs is None else max(1, len(self.runs))


@dataclasses.dataclass(frozen=True, slots=True)
class _Loaded:
    """What an attempt read (``LedgerStore._load``)."""

    view: codec.Totals
    """The totals decoded, the run entries read loaded into its book."""
    reads: dict[str, Stored]
    """The run entries read, as stored (the runs inline in the totals left out)."""
    guard: Stored | None
    """The guard ``making.<tenant>`` as read before the listing (``None``: not read, the
    attempt neither makes, splits nor tidies the ledger)."""
    listed: dict[str, Stored] | None
    """Every run's value of the tenant, purge markers included (``None``: not listed)."""
    tidy: bool = False
    """Whether a change asks to drop what an unfinished split left, and the ledger stays one
    value (``_Change.tidy``)."""


class LedgerStore(CasStore):
    """The tenant ledger: totals, run entries and admission queues. Create with
    ``LedgerStore.open``.

    Implements ``hold.TurnLedger`` (the operations of a turn's hold)."""

    def __init__(
        self,
        kv: Any,
        *,
        inline_runs: int = INLINE_RUNS,
        rebuild: Rebuild | None = None,
        layout: str = "single",
        **kwargs: Any,
    ) -> None:
        """``kv``: the bucket; ``inline_runs``: runs a tenant's totals hold inline
        (``INLINE_RUNS``; 0: none); ``rebuild`` (the operator's): what a tenant's window used
        at least, seeding a ledger the operator makes because it does not exist (the bucket or
        the totals were lost), never one that exists; ``layout`` (``entries.LAYOUTS``): the
        layout of a ledger this store makes, and with ``split`` a one-value ledger is split
        at its next change (a worker's store keeps ``single``: it makes no ledger); ``kwargs``:
        ``CasStore``'s. Raises ``ValueError`` for an unknown layout, or more ``inline_runs``
        than one write has room for beside ``cas.BATCH_VALUES`` runs."""
        super().__init__(kv, **kwargs)
        if layout not in LAYOUTS:
            raise ValueError(f"unknown ledger layout {layout!r}; one of {LAYOUTS}")
        if BATCH_VALUES + inline_runs + 1 > MAX_BATCH:  # a write: runs named, inline, totals
            raise ValueError(f"inline_runs {inline_runs} > {MAX_BATCH - BATCH_VALUES - 1}")
        self.layout = layout
        self.inline_runs = inline_runs
        self.rebuild = rebuild
        self._decoded: dict[str, tuple[int, codec.Totals]] = {}
        """The totals last written per tenant, decoded, at their revision (saves a decode)."""
        self._queues: dict[str, TenantQueue] = {}
        self._queue_locks: dict[str, asyncio.Lock] = {}
        self._putting: dict[str, dict[str, int]] = {}
        """Per tenant, the runs ``enqueue`` is storing and has not queued yet (uid → calls
        storing it): counted against the queue's limit from the check on."""

    @classmethod
    async def open(
        cls,
        js: JetStreamContext,
        *,
        bucket: str = BUCKET,
        create: bool = True,
        replicas: int = 1,
        **kwargs: Any,
    ) -> LedgerStore:
        """Bind the ledger bucket (``AGENTRUN_LEDGER``; another name keeps a second ledger
        apart on the same server, e.g. for tests), creating it when missing and allowing
        atomic batches on it if ``create`` (the operator), kept by ``replicas`` servers (an
        existing bucket's count is set to it), else waiting for both (a worker:
        ``buckets.open_bucket``, ``buckets.require_atomic``). Needs nats-server ≥ 2.12. Raises
        ``buckets.ReplicasRefused`` when the servers cannot hold ``replicas``."""
        config = api.KeyValueConfig(
            bucket=bucket, history=1, storage=api.StorageType.FILE, replicas=replicas
        )
        kv = await buckets.open_bucket(js, config, create=create)
        await buckets.require_atomic(js, bucket, create=create)
        return cls(kv, **kwargs)

    # --- reading ----------------------------------------------------------------------------------

    async def read(self, tenant: str) -> Book | None:
        """The tenant's whole ledger as stored now (its totals and every run's entry), or
        ``None``. Reads every run entry of the tenant: for the sweep and for tests."""
        totals = await self._get(book_key(tenant))
        if totals.data is None:
            return None
        view = codec.decode_totals(totals.data)
        if not view.one_value:
            for uid, stored in (await self._list_runs(tenant)).items():
                if uid not in view.inline and stored.data is not None:
                    view.book.load(uid, codec.decode_run(stored.data, uid=uid))
        return view.book

    async def read_totals(self, tenant: str) -> Book | None:
        """The tenant's totals as stored now, with only its inline runs loaded (``active_runs``
        and the sums are whole), or ``None``: one read whatever the tenant's size."""
        totals = await self._get(book_key(tenant))
        return None if totals.data is None else codec.decode_totals(totals.data).book

    async def tenants(self) -> list[str]:
        """Tenants with a ledger."""
        prefix = f"{protocol.LEDGER_TOTALS}."
        keys = await self._list(f"{prefix}>", values=False)
        return sorted(key.removeprefix(prefix) for key in keys)

    async def unfinished(self) -> list[str]:
        """Tenants whose ledger a guarded write (made anew or split in several batches) left
        unfinished: its guard ``making.<tenant>`` idle for ``GUARD_IDLE`` seconds (a write in
        progress rewrites it at every batch). One listing of the guards, whatever the number
        of tenants."""
        prefix = f"{protocol.LEDGER_MAKING}."
        guards = await self._list(f"{prefix}>", values=False)
        now = self.clock()
        return sorted(
            key.removeprefix(prefix)
            for key, stored in guards.items()
            if now - guard_since(stored.data) >= GUARD_IDLE
        )

    async def _list_runs(self, tenant: str, *, deleted: bool = False) -> dict[str, Stored]:
        """Every run entry stored on its own of the tenant, by run uid (``deleted``: purge
        markers too, ``cas.CasStore._list``)."""
        listed = await self._list(run_key(tenant, "*"), deleted=deleted)
        return {key.rsplit(".", 1)[1]: stored for key, stored in listed.items()}

    # --- changing a tenant's ledger ---------------------------------------------------------------

    async def _change(
        self,
        tenant: str,
        fn: Callable[[Book], T],
        *,
        runs: Iterable[str] | None = None,
        limits: TenantLimits | None = None,
        admits: int = 0,
    ) -> T:
        """Apply ``fn`` to the tenant's ledger and write what it changed by compare-and-set
        (what every named operation does; callers outside the ledger use those, never this).

        ``runs``: the runs whose entries ``fn`` reads or changes (``None``: every run, read
        whole); ``admits``: how many runs ``fn`` may admit. A missing ledger starts empty with
        ``limits`` when they are given (the operator's admission and sweep, with the
        AgentTenant's limits), its ``used`` and active runs seeded by ``rebuild`` if the store
        has one; without them it is refused: a missing ledger means no budget, never an
        unlimited one (``BookMissing``). ``fn`` may run more than once (on lost races) and
        must be deterministic given the ledger.
        """
        wanted = None if runs is None else frozenset(runs)
        result: T
        if limits is None or self.rebuild is None:
            result = await self._change_with(tenant, _Change(fn, wanted, limits, admits=admits))
            return result
        try:
            result = await self._change_with(tenant, _Change(fn, wanted, None, admits=admits))
        except BookMissing:  # made anew: what the window used is rebuilt first
            start = window_start(self.clock(), limits.window_seconds)
            seed = await self.rebuild(tenant, start, start + limits.window_seconds)
            # the seeded runs get entries: every run of the tenant is read to place them
            made = _Change(fn, None, limits, seed, admits=admits)
            result = await self._change_with(tenant, made)
        return result

    async def _change_with(self, tenant: str, change: _Change) -> Any:
        """``_change`` of one ``_Change`` (its seed, if any, already known)."""

        async def attempt(changes: list[_Change], number: int) -> list[tuple[bool, Any]] | None:
            return await self._attempt(tenant, changes, number=number)

        return await self._submit(f"tenant/{tenant}", change, attempt, weight=change.weight)

    async def _attempt(
        self, tenant: str, changes: list[_Change], *, number: int
    ) -> list[tuple[bool, Any]] | None:
        """Attempt ``number`` at a tenant's group of changes: read the totals and the run
        entries they touch, apply the changes in order, write what changed.

        The first attempt reads from this store's cache what it has; the second reads the
        totals fresh (the value every process writes: what a lost race was nearly always
        about) and the run entries from the cache (each is written by one run's operations);
        every later one reads everything fresh. An answer that writes nothing counts only on
        values all read fresh.

        A ledger made anew or split now may need more values than one atomic batch takes: it
        is written in several (``_write``), its run entries first and its totals last; nobody
        reads those entries before the totals land (a missing ledger is no budget; a
        one-value ledger is read whole from its one value, by this release and the previous
        one). An attempt that stops half-way leaves entries that the next attempt — of this
        process or another — lists and adopts (made anew) or rewrites and deletes (split)."""
        fresh = number > 1
        totals = await self._get(book_key(tenant), fresh=number > 0)
        if totals.data is None and number == 0:  # a missing ledger is believed only as read
            # now: a copy cached while NATS was away or before the operator made it again
            totals = await self._get(book_key(tenant), fresh=True)
        try:
            load = await self._load(tenant, totals, changes, fresh=fresh)
        except LedgerCorrupt as err:  # unreadable as cached: believed only as read now (a
            # value damaged and then repaired stays damaged in a cache for ever otherwise)
            if fresh:
                raise
            raise Conflict(f"{tenant}: a cached ledger value is unreadable; read again") from err
        book = load.view.book
        if totals.data is None:  # made anew: the entries a lost totals value left count
            _make(book, changes)
        results = apply_all([c.fn for c in changes], book)
        await self._read_moved(tenant, load, changes)
        writes, inline = self._writes(tenant, load.view, totals, load.reads)
        if not await self._write(tenant, load, writes) and not fresh:
            return None
        if all(ok for ok, _ in results):  # a change that raised may have left it half-done
            for uid in [u for u in book.runs if u not in inline and not book.one_value]:
                book.unload(uid)
            revision = self._cache.get(book_key(tenant), (0, None))[0]
            self._decoded[tenant] = (revision, codec.Totals(book, inline, book.one_value))
        return results

    async def _load(
        self, tenant: str, totals: Stored, changes: list[_Change], *, fresh: bool
    ) -> _Loaded:
        """The totals decoded (``_view``) with the run entries ``changes`` touch read and
        loaded into its book. A ledger made anew, split or tidied now (``_Change.tidy``) reads
        its guard first, then lists every run's value of the tenant: a made one loads them all
        (a lost ledger's, or an unfinished attempt's, adopted: split, if it was to be one
        value), a one-value one none (it holds every run itself; a value apart is what an
        unfinished split left, rewritten or deleted). Raises ``BookMissing`` as ``_view``
        does, ``LedgerCorrupt`` for a value that cannot be decoded."""
        view = self._view(tenant, totals, changes)
        made = totals.data is None
        one_value = view.one_value and not made  # as stored
        tidy = one_value and view.book.one_value and any(c.tidy for c in changes)
        guard = None
        if made or (one_value and not view.book.one_value) or tidy:
            guard = await self._get(making_key(tenant))  # before the listing it guards
        listed = None
        if guard is not None or any(c.runs is None for c in changes):
            listed = await self._list_runs(tenant, deleted=True)
        reads = await self._read_runs(tenant, view, changes, listed=listed, fresh=fresh)
        if not one_value:
            for uid, stored in reads.items():
                if stored.data is not None:
                    view.book.load(uid, codec.decode_run(stored.data, uid=uid))
        if made and view.book.one_value and any(s.data is not None for s in reads.values()):
            view.book.split_out()  # a split tenant's entries outlived its totals
        return _Loaded(view, reads, guard, listed, tidy)

    def _view(self, tenant: str, totals: Stored, changes: list[_Change]) -> codec.Totals:
        """The totals decoded (the copy kept from the last write when still current; it is
        handed out once, since it gets mutated), or a new ledger made with the limits of the
        first change that brings them (``_attempt`` seeds it). Raises ``BookMissing`` when
        there are no totals and no change brings limits."""
        kept = self._decoded.pop(tenant, None)
        if kept is not None and totals.data is not None and kept[0] == totals.revision:
            return self._grown(tenant, kept[1], changes)
        if totals.data is None:
            made = next((c for c in changes if c.limits is not None), None)
            if made is None or made.limits is None:
                raise BookMissing(f"AgentTenant {tenant!r} has no ledger book: no budget")
            single = self.layout == "single"
            book = Book.new(tenant, made.limits, now=self.clock(), one_value=single)
            return codec.Totals(book, frozenset(), one_value=single)
        view = codec.decode_totals(totals.data)
        if view.one_value and self.layout == "split":
            view.book.split_out()  # written split from now on (``_read_runs`` places its runs)
        return self._grown(tenant, view, changes)

    def _grown(self, tenant: str, view: codec.Totals, changes: list[_Change]) -> codec.Totals:
        """``view``, split from now on (``_read_runs`` places its runs) if it is one value and
        the admissions among ``changes`` would take it past what one value holds
        (``outgrows``)."""
        admits = sum(c.admits for c in changes)
        if view.book.one_value and outgrows(view.book, admits):
            log.info(
                "AgentTenant %s: %d active runs and %d to admit outgrow its one-value ledger; "
                "it is split from now on",
                tenant,
                view.book.active_runs,
                admits,
            )
            view.book.split_out()
        return view

    async def _read_runs(
        self,
        tenant: str,
        view: codec.Totals,
        changes: list[_Change],
        *,
        listed: dict[str, Stored] | None,
        fresh: bool,
    ) -> dict[str, Stored]:
        """The stored entries of the runs ``changes`` touch that are not inline, and of every
        run of a one-value ledger being split (to place them); with a listing (``listed``:
        every run's value of the tenant, purge markers included), of every run listed too, a
        run not listed holding nothing. None of a one-value ledger that stays one unless
        listed: its runs are all in its one value."""
        book = view.book
        if book.one_value and listed is None:
            return {}
        needed = set(listed or ())
        if view.one_value and not book.one_value:  # its runs are all loaded, none placed yet
            needed |= set(book.runs)
        for change in changes:
            needed |= change.runs or set()
        needed -= view.inline
        if listed is not None:
            return {uid: listed.get(uid, Stored(0, None)) for uid in needed}
        missing = sorted(needed)
        found = await asyncio.gather(
            *(self._get(run_key(tenant, uid), fresh=fresh) for uid in missing)
        )
        return dict(zip(missing, found, strict=True))

    async def _read_moved(self, tenant: str, load: _Loaded, changes: list[_Change]) -> None:
        """Add to ``load.reads`` the keys of the runs the changes placed without naming
        them: inline entries left with nothing but the memory that their run ended (they move
        into values of their own), and the runs a ledger made anew seeded."""
        view, reads = load.view, load.reads
        book = view.book
        new = [u for u in view.inline if u in book.runs and book.runs[u].only_ended]
        if not book.one_value and any(c.runs is None for c in changes):  # runs it created
            new += [u for u in book.runs if u not in reads and u not in view.inline]
        if load.listed is not None:  # a key the listing does not name held nothing
            reads.update({u: load.listed.get(u, Stored(0, None)) for u in new})
            return
        found = await asyncio.gather(*(self._get(run_key(tenant, u)) for u in new))
        reads.update(zip(new, found, strict=True))

    def _writes(
        self, tenant: str, view: codec.Totals, totals: Stored, reads: dict[str, Stored]
    ) -> tuple[list[Write], frozenset[str]]:
        """What to write after the changes (``codec.split``: where each run's entry goes; a
        value apart of a run the ledger does not hold — what an unfinished split left — goes),
        the totals last, and which runs are inline then. Creating or deleting a run's value
        rewrites the totals too: their revision is what orders every such choice between
        processes."""
        book = view.book
        if book.one_value:  # the whole ledger in one value
            data = codec.encode_one_value(book)
            same = data == totals.data
            return ([] if same else [Write(book_key(tenant), data, totals.revision)]), frozenset()
        stored = {uid: s.data for uid, s in reads.items()}
        laid = codec.split(book, inline=view.inline, stored=stored, room=self.inline_runs)
        changed = [(uid, v) for uid, v in laid.runs.items() if v != reads[uid].data]
        changed += [
            (uid, None)
            for uid, s in reads.items()
            if s.data is not None and uid not in laid.runs and uid not in book.runs
        ]
        writes = [Write(run_key(tenant, uid), v, reads[uid].revision) for uid, v in changed]
        moved = any(v is None or reads[uid].data is None for uid, v in changed)
        if laid.totals != totals.data or moved:
            writes.append(Write(book_key(tenant), laid.totals, totals.revision))
        return writes, laid.inline

    async def _write(self, tenant: str, load: _Loaded, writes: list[Write]) -> bool:
        """Write ``writes`` (the totals last); whether anything was written. A ledger made
        anew or split now is written guarded (``making.<tenant>``, ``_put_guarded``: in as
        many atomic batches as it takes, the totals in the last), so a guarded write of
        another process that started meanwhile makes it start over; so is a tidy of a
        one-value ledger whose guard stayed idle ``GUARD_IDLE`` (an unfinished split's
        values apart deleted); anything else is one write (``_put``)."""
        guard = load.guard
        if guard is not None and not load.view.book.one_value:
            await self._put_guarded(writes, guard=making_key(tenant), revision=guard.revision)
            return True
        idle = guard is not None and self.clock() - guard_since(guard.data) >= GUARD_IDLE
        if guard is not None and guard.data is not None and load.tidy and idle:
            left = [(u, s) for u, s in (load.listed or {}).items() if s.data is not None]
            dropped = [Write(run_key(tenant, u), None, s.revision) for u, s in left]
            await self._put_guarded(
                [*dropped, *writes], guard=making_key(tenant), revision=guard.revision
            )
            log.info("ledger of %s: %d values an unfinished split left dropped", tenant, len(left))
            return True
        if writes:
            await self._put(writes)
        return bool(writes)

    async def _change_existing(
        self, tenant: str, fn: Callable[[Book], T], *, run_uid: str, missing: T
    ) -> T:
        """``_change`` of run ``run_uid`` in a ledger that should exist; ``missing`` when it
        does not (nothing to change: a hold, a run or a spend in a ledger that is gone is
        nobody's)."""
        try:
            return await self._change(tenant, fn, runs=(run_uid,))
        except BookMissing:
            return missing

    # --- the budget lifecycle of a run ------------------------------------------------------------

    async def admit_run(
        self,
        tenant: str,
        run: QueuedRun,
        *,
        limits: TenantLimits,
        need: tuple[int, Decimal],
        now: float | None = None,
        life: int | None = None,
    ) -> BudgetRefusal | None:
        """Take a concurrency slot for ``run`` if its tenant (now with ``limits``) has one and
        the budget left covers ``need`` (tokens, USD: its first call's worst case, held until
        that call reserves) at ``now`` (epoch seconds; the store's clock if not given), for
        the run's life ``life`` (its ``status.reruns``; ``None``: not known). ``None`` when
        admitted; idempotent. See ``Book.admit``."""
        lives = {} if life is None else {run.uid: life}
        (answer,) = await self.admit_runs(
            tenant, [(run, need)], limits=limits, now=now, lives=lives
        )
        return answer

    async def admit_runs(
        self,
        tenant: str,
        runs: Sequence[tuple[QueuedRun, tuple[int, Decimal]]],
        *,
        limits: TenantLimits,
        now: float | None = None,
        lives: Mapping[str, int] | None = None,
    ) -> list[BudgetRefusal | None]:
        """Admit ``runs`` (each with its first call's worst case), head of the queue first, in
        one write (``cas.BATCH_VALUES`` runs a write: more go in several, in order): each as
        ``admit_run`` does, stopping at the first that does not fit — FIFO, as if they were
        admitted one by one; each slot names its run's life in ``lives`` (uid → its
        ``status.reruns``; a run not in it: not known, ``Book.name_life``). Returns an answer
        for each run tried: ``None`` for each admitted, then the refusal of the first that was
        not (the runs after it were not tried)."""
        at = self.clock() if now is None else now
        known = lives or {}

        def admitting(
            part: Sequence[tuple[QueuedRun, tuple[int, Decimal]]],
        ) -> Callable[[Book], list[BudgetRefusal | None]]:
            def apply(book: Book) -> list[BudgetRefusal | None]:
                if book.limits != limits:
                    book.set_limits(limits, now=at)
                answers: list[BudgetRefusal | None] = []
                for run, (tokens, cost) in part:
                    refusal = book.admit(
                        run.uid, run.namespace, run.name, now=at, need_tokens=tokens, need_cost=cost
                    )
                    answers.append(refusal)
                    if refusal is not None:
                        break
                    book.name_life(run.uid, known.get(run.uid))
                return answers

            return apply

        answers: list[BudgetRefusal | None] = []
        for part in _parts(runs):
            uids = [run.uid for run, _ in part]
            fn = admitting(part)
            answers += await self._change(tenant, fn, runs=uids, limits=limits, admits=len(uids))
            if answers and answers[-1] is not None:
                break
        return answers

    def turn_hold(
        self,
        ref: TurnRef,
        *,
        ttl: float = DEFAULT_HOLD_TTL,
        clock: Callable[[], float] | None = None,
        prior_owner: str = "",
        moved_on: MovedOn | None = None,
    ) -> TurnHold:
        """The hold of one delivery of turn ``ref`` (an ``async with`` block; see ``hold``);
        ``prior_owner``: the delivery that committed the run's previous turn, if known;
        ``moved_on``: whether the run's events show the turn committed (``TurnHold``)."""
        return TurnHold(
            self,
            ref,
            ttl=ttl,
            clock=clock or self.clock,
            prior_owner=prior_owner,
            moved_on=moved_on,
        )

    # --- a turn's hold (``hold.TurnLedger``) ------------------------------------------------------

    async def reserve_turn(
        self,
        ref: TurnRef,
        hold: Hold,
        *,
        before: kernel.RunState | None,
        prior_owner: str,
        now: float,
    ) -> BudgetRefusal | None:
        """Settle the run through the turn before ``ref`` (``before``: the run's state before
        this turn; that turn's holds resolved by ``prior_owner``), then hold ``hold`` under
        ``ref.key`` if it fits within every limit (``Book.reserve``), in one write; the refusal
        otherwise. Raises ``LedgerUnavailable`` or a NATS error if it cannot be written."""

        def apply(book: Book) -> BudgetRefusal | None:
            stale = book.earlier_life(ref.run_uid, ref.life)
            if stale is not None:
                return stale
            _settle_before(book, ref, before, prior_owner=prior_owner, now=now)
            return book.reserve(ref.key, hold, now=now)

        try:
            return await self._change(ref.tenant, apply, runs=(ref.run_uid,))
        except BookMissing as err:
            return _no_budget(err)

    async def reserve_call(
        self,
        ref: TurnRef,
        need: CallNeed,
        hold: Hold,
        *,
        before: kernel.RunState | None,
        prior_owner: str,
        now: float,
    ) -> Granted | BudgetWait | BudgetRefusal:
        """As ``reserve_turn``, for the model call ``need`` (``hold`` gives its run, turn, owner
        and expiry; its amounts are set by the book): held with the largest output allowance
        that fits, waiting for other runs' holds, or refused (``Book.reserve_call``)."""

        def apply(book: Book) -> Granted | BudgetWait | BudgetRefusal:
            stale = book.earlier_life(ref.run_uid, ref.life)
            if stale is not None:
                return stale
            _settle_before(book, ref, before, prior_owner=prior_owner, now=now)
            return book.reserve_call(ref.key, need, hold, now=now)

        try:
            return await self._change(ref.tenant, apply, runs=(ref.run_uid,))
        except BookMissing as err:
            return _no_budget(err)

    async def record_spend(
        self, ref: TurnRef, *, owner: str, usage: kernel.Usage, answered: bool = True
    ) -> bool:
        """Write what ``owner``'s model call used (not ``answered``: delivered so far) on its
        hold of turn ``ref`` (so it is charged even if the turn never commits); False if that
        hold is gone or another owner's."""
        tokens, cost = usage.total_tokens, usage.cost_usd

        def apply(book: Book) -> bool:
            return book.record_spend(
                ref.key, owner=owner, tokens=tokens, cost_usd=cost, answered=answered
            )

        return await self._change_existing(ref.tenant, apply, run_uid=ref.run_uid, missing=False)

    async def refresh_hold(self, ref: TurnRef, *, owner: str, expires: float) -> bool:
        """Push the expiry of ``owner``'s hold of turn ``ref`` out to ``expires`` (epoch
        seconds); False if it holds none."""
        return await self._change_existing(
            ref.tenant,
            lambda book: book.refresh(ref.key, owner=owner, expires=expires),
            run_uid=ref.run_uid,
            missing=False,
        )

    async def settle_turn(
        self, ref: TurnRef, *, owner: str, prior_owner: str, after: kernel.Usage, now: float
    ) -> tuple[int, Decimal]:
        """``owner`` committed turn ``ref``: drop every hold of the turn (another delivery's
        answered call charged as abandoned, ``Book.resolve_turn``), and of the turn before by
        ``prior_owner`` (this turn may have made no call, so reserved nothing), then charge the
        run's cumulative usage ``after`` the turn (``Book.settle``). Returns what it charged
        (tokens, USD)."""

        def apply(book: Book) -> tuple[int, Decimal]:
            if book.later_life(ref.run_uid, ref.life):  # a rerun's slot: not this turn's
                return 0, Decimal(0)
            book.resolve_turn(ref.run_uid, ref.turn, committer=owner)
            book.resolve_turn(ref.run_uid, ref.turn - 1, committer=prior_owner)
            return book.settle(
                ref.run_uid,
                turn=ref.turn,
                tokens=after.total_tokens,
                cost_usd=after.cost_usd,
                now=now,
            )

        return await self._change_existing(
            ref.tenant, apply, run_uid=ref.run_uid, missing=(0, Decimal(0))
        )

    async def release_hold(self, ref: TurnRef, *, owner: str) -> bool:
        """Drop ``owner``'s hold of turn ``ref`` uncharged (its model call got no answer:
        never connected, refused, or never made), also one set aside for it; if someone else
        dropped it meanwhile charging its prompt's bound, that is taken back
        (``Book.release``). False if it holds none."""
        return await self._change_existing(
            ref.tenant,
            lambda book: book.release(ref.key, owner=owner),
            run_uid=ref.run_uid,
            missing=False,
        )

    async def abandon_hold(
        self, ref: TurnRef, *, owner: str, usage: kernel.Usage, unrecorded: bool, now: float
    ) -> bool:
        """Drop ``owner``'s hold of turn ``ref``, charging ``usage`` as abandoned: its call
        answered but the turn will never commit (``Book.abandon``; ``unrecorded``: the usage
        never reached its hold). True if it charged."""
        tokens, cost = usage.total_tokens, usage.cost_usd

        def apply(book: Book) -> bool:
            return book.abandon(
                ref.key, owner=owner, tokens=tokens, cost_usd=cost, now=now, unrecorded=unrecorded
            )

        return await self._change_existing(ref.tenant, apply, run_uid=ref.run_uid, missing=False)

    async def stop_waiting(self, ref: TurnRef) -> bool:
        """The call of turn ``ref`` no longer waits for other runs' holds (given up); False if
        it did not wait."""

        def apply(book: Book) -> bool:
            return not book.later_life(ref.run_uid, ref.life) and book.stop_waiting(ref.key)

        return await self._change_existing(ref.tenant, apply, run_uid=ref.run_uid, missing=False)

    async def close_run(
        self,
        tenant: str,
        run_uid: str,
        committed: kernel.RunSummary | None,
        *,
        end: float,
        now: float | None = None,
        ending: Ending = Ending(),
    ) -> bool:
        """The run ended at ``end`` (epoch seconds): settle what it ``committed`` (its last
        event's summary; ``None``: nothing), charge its wall-clock time in this window, free
        its slot and drop any hold it left — a hold of its last turn is charged as abandoned
        if its owner is not ``ending.committer`` (the delivery the last event names, if any),
        a hold of a later turn always: what its call recorded, or with nothing recorded its
        prompt's bound (``Book.charge_dropped``; a hold of no call, the admission's,
        nothing). False if it was not active. Remembered as ended (``Book.close``): an
        admission of it done again takes no slot.

        A slot of a later life than ``ending.life`` (a rerun admitted while this close was on
        its way, ``Book.later_life``) is another life's: it is left alone — neither closed nor
        charged, its holds kept — as the sweep leaves an entry that is not the one it judged
        (``Repair.since``); False. The earlier life was charged what its release charged
        (``free_run``: nothing more)."""
        at = self.clock() if now is None else now
        totals = _committed(committed)

        def apply(book: Book) -> bool:
            if book.later_life(run_uid, ending.life):
                return False
            book.resolve_turn(run_uid, totals["turn"], committer=ending.committer)
            return book.close(run_uid, **totals, end=end, now=at)

        return await self._change_existing(tenant, apply, run_uid=run_uid, missing=False)

    async def free_run(
        self, tenant: str, run_uid: str, *, now: float | None = None, life: int | None = None
    ) -> bool:
        """Free the slot of a run admitted and not started, or about to run again from turn 0
        (a rerun), charging nothing more (what it was charged stays): closed, and not
        remembered as ended, so its next admission is a new one. False if it was not active.

        ``life``: the latest life of the run whose slot this frees (its ``status.reruns``; for
        a rerun, the life before the new one; ``None``: any). A slot of a later life (admitted
        while this release was on its way) is left alone: False."""
        at = self.clock() if now is None else now

        def apply(book: Book) -> bool:
            if book.later_life(run_uid, life):
                return False
            closed = book.close(run_uid, **_committed(None), end=at, now=at)
            book.forget_end(run_uid)
            return closed

        return await self._change_existing(tenant, apply, run_uid=run_uid, missing=False)

    async def repair_entry(
        self,
        tenant: str,
        repairs: Sequence[Repair],
        *,
        limits: TenantLimits | None,
        now: float | None = None,
        floor: UsageFloor | None = None,
        forget: Sequence[str] = (),
    ) -> None:
        """Bring the tenant's entry up to date at ``now``: its ``limits`` (if given), its use
        back to ``floor`` if it was rolled back below it (``Book.undercuts``), a new window if
        one is due, then each repair — an expired hold is charged what its run committed and
        dropped (and, if its turn never committed, what its call used, recorded on it, or with
        nothing recorded its prompt's bound: its worker died after its reservation); a run
        whose last event is terminal is closed at that event's time; a stale run that left no
        events is closed with nothing charged; a repair whose run's entry is no longer the one
        the sweep judged (``Repair.since``: a rerun admitted since, a slot freed, or a window
        rolled) is left to the next sweep. The runs in ``forget`` are loaded too, so the
        window's roll at ``now`` drops their expired memories (``Book.forgettable``) and an
        entry left empty goes. The runs are fixed ``cas.BATCH_VALUES`` at a time, each part a
        write of its own (no atomic batch grows with them), the limits, floor and window by
        the first."""
        at = self.clock() if now is None else now

        def fixing(part: frozenset[str]) -> Callable[[Book], None]:
            def apply(book: Book) -> None:
                if limits is not None and book.limits != limits:
                    book.set_limits(limits, now=at)
                if floor is not None and book.undercuts(floor, now=at):
                    book.restore(floor, now=at)
                book.roll(at)
                for repair in repairs:
                    if repair.run_uid in part:
                        _repair(book, repair, at)

            return apply

        runs = sorted({repair.run_uid for repair in repairs} | set(forget))
        for part in _parts(runs):
            await self._change(tenant, fixing(frozenset(part)), runs=part, limits=limits)

    async def drop_unfinished(self, tenant: str) -> None:
        """Finish or undo what a guarded write left unfinished (``unfinished``): a one-value
        ledger whose split never committed loses the values apart it left (nobody reads them:
        they would outlive every later change otherwise), or is split now by a store whose
        layout is ``split``; a ledger made anew since adopted them already. A missing ledger
        is left to whoever makes it (it adopts them), a guard still in use to its writer."""
        with contextlib.suppress(BookMissing):
            await self._change_with(tenant, _Change(_unchanged, frozenset(), None, tidy=True))

    # --- admission queues -------------------------------------------------------------------------

    async def queued(self, tenant: str) -> TenantQueue:
        """The tenant's admission queue, as this process knows it: read from the bucket the
        first time (migrating an earlier release's one-value queue), then kept up to date by
        this store's ``enqueue`` and ``dequeue`` (the operator is the queue's only writer).
        Iterate it head first; don't change it."""
        found = self._queues.get(tenant)
        if found is not None:
            return found
        async with self._queue_locks.setdefault(tenant, asyncio.Lock()):
            found = self._queues.get(tenant)
            if found is None:
                found = self._queues[tenant] = await self._load_queue(tenant)
        return found

    async def queue(self, tenant: str) -> list[QueuedRun]:
        """The tenant's admission queue, head first (a copy: O(n))."""
        return (await self.queued(tenant)).runs()

    def forget_queues(self) -> None:
        """Read every queue from the bucket again when next needed (another operator may
        have changed them: after this one regains the lead)."""
        self._queues.clear()

    async def _load_queue(self, tenant: str) -> TenantQueue:
        queue = TenantQueue()
        for key, stored in (await self._list(queue_key(tenant, "*"))).items():
            try:
                shape = codec.QUEUED.validate_json(stored.data or b"")
            except ValueError as err:  # pydantic.ValidationError included
                # another tenant's one-value queue (``queue.a.b`` matches ``queue.a.*``) or a
                # damaged value: it is not a run of this queue
                log.warning("ledger value %s is not a queued run: %r", key, err)
                continue
            run = QueuedRun(shape.uid, shape.ns, shape.name, shape.at)
            queue.add(run, arrival=stored.revision)
        await self._migrate_queue(tenant, queue)
        return queue

    async def _migrate_queue(self, tenant: str, queue: TenantQueue) -> None:
        """Move an earlier release's one-value queue (``queue.<tenant>``) into one value per
        run, keeping its order, then delete it; nothing to do when there is none."""
        while True:
            legacy = await self._get(legacy_queue_key(tenant))
            if legacy.data is None:
                return
            try:
                runs = codec.LEGACY_QUEUE.validate_json(legacy.data)
            except ValueError as err:
                raise ValueError(f"malformed admission queue: {err!r}") from err
            for shape in runs:
                run = QueuedRun(shape.uid, shape.ns, shape.name, shape.at)
                if run.uid not in queue:
                    queue.add(run, arrival=await self._put_queued(tenant, run))
            try:
                await self._put([Write(legacy_queue_key(tenant), None, legacy.revision)])
            except Conflict:
                continue  # an earlier release's operator changed it meanwhile: again
            log.info("admission queue of %s migrated: %d runs", tenant, len(runs))
            return

    async def _put_queued(self, tenant: str, run: QueuedRun) -> int:
        """Store ``run`` in the tenant's queue (if it is not stored yet); its value's revision."""
        value = codec.QUEUED.dump_json(
            codec.QueuedRunShape(uid=run.uid, ns=run.namespace, name=run.name, at=round(run.at, 3))
        )
        key = queue_key(tenant, run.uid)
        try:
            return await self.kv.create(key, value)
        except nats.js.errors.KeyWrongLastSequenceError:  # stored already: keep its place
            return (await self._get(key)).revision

    async def enqueue(self, tenant: str, run: QueuedRun, *, limit: int | None = None) -> int:
        """Queue ``run`` unless already queued: after every run created no later than it (FIFO
        by creation time, so runs created together queue in creation order even when their
        admissions reach here out of order). Returns its 1-based position.

        Raises ``QueueFull`` (for this run only) when the queue holds ``limit`` runs (``None``:
        no limit), the runs other calls of this process are storing counted in: the check and
        the count are one step (no await between), so concurrent enqueues of one tenant queue
        ``limit`` runs at most, not each one that passed the check before any was stored."""
        queue = await self.queued(tenant)
        position = queue.position(run.uid)
        if position is not None:
            return position
        putting = self._putting.setdefault(tenant, {})
        if limit is not None and run.uid not in putting and len(queue) + len(putting) >= limit:
            raise QueueFull(tenant, limit=limit)
        putting[run.uid] = putting.get(run.uid, 0) + 1
        try:
            arrival = await self._put_queued(tenant, run)
        except BaseException:  # not stored by this call: counted while another still stores it
            if putting.get(run.uid, 0) > 1:
                putting[run.uid] -= 1
            else:
                putting.pop(run.uid, None)
            raise
        putting.pop(run.uid, None)  # stored: counted by the queue from here on
        return queue.add(run, arrival=arrival)

    def splits(self, book: Book) -> bool:
        """Whether this store splits ``book`` (as read) at its next change: it is one value and
        the store's ``layout`` is ``split``."""
        return book.one_value and self.layout == "split"

    async def dequeue(self, tenant: str, uid: str) -> bool:
        """Remove the run ``uid`` from the queue; False if it was not there."""
        queue = await self.queued(tenant)
        if uid not in queue:
            return False
        await self._purge(queue_key(tenant, uid))
        return queue.remove(uid) is not None

    def position(self, tenant: str, uid: str) -> int | None:
        """The queued run's 1-based position as this process knows it (``None``: not queued,
        or the tenant's queue not read yet); O(log n)."""
        queue = self._queues.get(tenant)
        return None if queue is None else queue.position(uid)


def _make(book: Book, changes: list[_Change]) -> None:
    """A ledger made anew (its totals were missing): its totals counted over the entries
    loaded (a lost ledger's, or an unfinished attempt's at this one), then seeded by the first
    change that brings limits (``Book.seed``), then split if one value cannot hold the runs
    it starts with (``MAX_ACTIVE_RUNS``) or those the changes admit (``outgrows``)."""
    book.recount()
    seed = next((c.seed for c in changes if c.limits is not None), None)
    if seed is not None:
        book.seed(seed)
    admits = sum(c.admits for c in changes)
    if book.one_value and (book.active_runs > MAX_ACTIVE_RUNS or outgrows(book, admits)):
        book.split_out()


def _parts(items: Sequence[T], size: int = BATCH_VALUES) -> list[Sequence[T]]:
    """``items`` in consecutive parts of at most ``size`` (one empty part if there are none:
    a change that names no run still happens)."""
    return [items[start : start + size] for start in range(0, len(items), size)] or [items]


def _unchanged(book: Book) -> None:
    """A change that changes nothing (``LedgerStore.drop_unfinished``: only what it reads
    matters)."""


def _no_budget(err: BookMissing) -> BudgetRefusal:
    """A call of a tenant with no ledger book is refused: no book, no budget."""
    return BudgetRefusal(BUDGET_EXHAUSTED, None, f"{err}: the call is not made (fail closed)")


def _settle_before(
    book: Book, ref: TurnRef, before: kernel.RunState | None, *, prior_owner: str, now: float
) -> None:
    """In the write that reserves turn ``ref``: settle the run's totals through the turn
    before it (``before``: the run's state before this turn; ``None``: nothing to settle) and
    drop that turn's holds, charging those of deliveries other than ``prior_owner`` whose
    calls answered — so a call is never refused for a previous turn whose worker has not
    settled yet."""
    if before is None:
        return
    book.resolve_turn(ref.run_uid, before.turn - 1, committer=prior_owner)
    book.catch_up(
        ref.run_uid,
        turn=before.turn - 1,
        tokens=before.usage.total_tokens,
        cost_usd=before.usage.cost_usd,
        now=now,
    )


def _committed(last: kernel.RunSummary | None) -> dict[str, Any]:
    """What a run's last summary says it committed, as ``Book.settle``/``close`` take it: the
    last committed turn (-1: none) and the run's cumulative tokens and USD through it."""
    if last is None:
        return {"turn": -1, "tokens": 0, "cost_usd": Decimal(0)}
    usage = last.usage
    return {"turn": last.last_turn, "tokens": usage.total_tokens, "cost_usd": usage.cost_usd}


def _repair(book: Book, repair: Repair, now: float) -> None:
    """Apply ``repair`` if the run's entry is still the one the sweep judged (its ``since``:
    a rerun admitted meanwhile is another life's slot, left alone); see ``repair_entry``."""
    uid, last = repair.run_uid, repair.last
    if book.slot_since(uid) != repair.since:
        return
    if repair.hold_key:
        committed = _committed(last)
        if last is not None:
            book.settle(uid, **committed, now=now)
        hold = book.hold(repair.hold_key)
        if hold is not None and hold.expires <= now:  # charged if its call answered, uncommitted
            if hold.turn == committed["turn"] and repair.committer:  # or lost the commit
                book.resolve_turn(uid, hold.turn, committer=repair.committer)
            else:
                book.drop_hold(repair.hold_key, committed_turn=committed["turn"])
    if last is not None and last.phase.is_terminal:
        book.resolve_turn(uid, last.last_turn, committer=repair.committer)
        book.close(uid, **_committed(last), end=repair.last_time or now, now=now)
    elif not repair.hold_key and last is None:  # the run is gone and left no events
        book.close(uid, **_committed(None), end=now, now=now)
