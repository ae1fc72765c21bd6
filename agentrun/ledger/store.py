"""Tenant ledger entries in JetStream KV, changed only through named operations.

Two keys per tenant in bucket ``AGENTRUN_LEDGER``: ``book.<tenant>`` (a ``Book``: usage,
holds, active runs) and ``queue.<tenant>`` (the FIFO admission queue, written by the operator
only). This is the tenant-budget port: admitting a run (``admit_run``), a turn's hold
(``turn_hold``, a ``TurnHold`` over this store's ``TurnLedger`` operations: ``reserve_turn``,
``reserve_call``, ``record_spend``, ``refresh_hold``, ``settle_turn``, ``release_hold``,
``abandon_hold``, ``stop_waiting``), ending a run (``close_run``), the operator sweep's fixes
(``repair_entry``) and the admission queue (``enqueue``, ``dequeue``). Callers outside this
package change entries only through these. Each is one write, compare-and-set on the entry's
revision, group-committed per key (``cas``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from decimal import Decimal
from typing import Any, TypeVar

import nats.js.errors
from nats.js import JetStreamContext, api

from agentrun import buckets, kernel, protocol
from agentrun.ledger import codec
from agentrun.ledger.book import Book
from agentrun.ledger.cas import CasStore, LedgerUnavailable
from agentrun.ledger.codec import QueuedRunShape
from agentrun.ledger.entries import (
    BUDGET_EXHAUSTED,
    BudgetRefusal,
    Hold,
    Seed,
    TenantLimits,
    UsageFloor,
    window_start,
)
from agentrun.ledger.hold import DEFAULT_HOLD_TTL, TurnHold, TurnRef
from agentrun.ledger.reserve import BudgetWait, CallNeed, Granted

__all__ = [
    "BUCKET",
    "MAX_QUEUED_RUNS",
    "BookMissing",
    "LedgerStore",
    "LedgerUnavailable",
    "QueueFull",
    "QueuedRun",
    "Repair",
]

BUCKET = protocol.LEDGER_BUCKET
T = TypeVar("T")

MAX_QUEUED_RUNS = 1_000
"""Runs one tenant's admission queue holds: the queue is one KV value, and at about 400 bytes
a run at most (every name at its longest) 1 000 runs stay under 410 KB, far below the
server's max payload (1 MiB by default). ``enqueue`` refuses the next one (``QueueFull``)."""


class BookMissing(LookupError):
    """The tenant has no ledger book: it has no budget. Only the operator's admission makes a
    book (with the AgentTenant's limits); any other change of a missing book is refused, never
    started as an empty, unlimited one."""


class QueueFull(Exception):
    """The tenant's admission queue holds ``MAX_QUEUED_RUNS`` runs: this run cannot join it."""


@dataclasses.dataclass(frozen=True, slots=True)
class QueuedRun:
    """A run waiting in its tenant's admission queue."""

    uid: str
    namespace: str
    name: str
    at: float
    """The AgentRun's creation time, epoch seconds: the queue's order (ties: arrival order)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Repair:
    """What the operator's sweep found about one run, read from its events, to fix its tenant's
    entry with: an expired hold to charge and drop, or an active run that has ended or gone."""

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


Rebuild = Callable[[str, float, float], Awaitable[Seed]]
"""What a tenant's window (its start and end, epoch seconds) used at least and which of its
runs are active, from outside the ledger (the operator: its AgentRuns' recorded usage), for a
book made anew (``Seed``)."""


def book_key(tenant: str) -> str:
    """``book.<tenant>`` (tenant names are DNS subdomains: valid KV key characters)."""
    return f"book.{tenant}"


def queue_key(tenant: str) -> str:
    """``queue.<tenant>``."""
    return f"queue.{tenant}"


class LedgerStore(CasStore):
    """The tenant ledger: books and admission queues. Create with ``LedgerStore.open``.

    Implements ``hold.TurnLedger`` (the operations of a turn's hold)."""

    def __init__(self, kv: Any, *, rebuild: Rebuild | None = None, **kwargs: Any) -> None:
        """``kv``: the bucket; ``rebuild`` (the operator's): what a tenant's window used at
        least, seeding a book the operator makes because it does not exist (the bucket or the
        book was lost), never one that exists; ``kwargs``: ``CasStore``'s."""
        super().__init__(kv, **kwargs)
        self.rebuild = rebuild

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
        apart on the same server, e.g. for tests), creating it when missing if ``create``
        (the operator), kept by ``replicas`` servers (an existing bucket's count is set to
        it), else waiting for it (a worker: ``buckets.open_bucket``). Raises
        ``buckets.ReplicasRefused`` when the servers cannot hold ``replicas``."""
        config = api.KeyValueConfig(
            bucket=bucket, history=1, storage=api.StorageType.FILE, replicas=replicas
        )
        return cls(await buckets.open_bucket(js, config, create=create), **kwargs)

    # --- books ------------------------------------------------------------------------------------

    async def read(self, tenant: str) -> Book | None:
        """The tenant's entry as stored now, or ``None``."""
        found = await self._get(book_key(tenant))
        return None if found is None else codec.decode_book(found[1])

    async def _change(
        self, tenant: str, fn: Callable[[Book], T], *, limits: TenantLimits | None = None
    ) -> T:
        """Apply ``fn`` to the tenant's entry and write it back by compare-and-set (what every
        named operation does; callers outside the ledger use those, never this).

        A missing entry starts empty with ``limits`` when they are given (the operator's
        admission and sweep, with the AgentTenant's limits), its ``used`` seeded by
        ``rebuild`` if the store has one; without them it is refused: a missing book means no
        budget, never an unlimited one (``BookMissing``). ``fn`` may run more than once (on
        lost races) and must be deterministic given the entry.
        """
        if limits is None or self.rebuild is None:
            return await self._change_book(tenant, fn, limits=limits, seed=None)
        try:
            return await self._change_book(tenant, fn, limits=None, seed=None)
        except BookMissing:  # made anew: what the window used is rebuilt first
            start = window_start(self.clock(), limits.window_seconds)
            seed = await self.rebuild(tenant, start, start + limits.window_seconds)
            return await self._change_book(tenant, fn, limits=limits, seed=seed)

    async def _change_book(
        self,
        tenant: str,
        fn: Callable[[Book], T],
        *,
        limits: TenantLimits | None,
        seed: Seed | None,
    ) -> T:
        """``_change`` with the seed of a book made anew (``Book.seed``) already known."""

        def decode(data: bytes | None) -> Book:
            if data is None:
                if limits is None:
                    raise BookMissing(f"AgentTenant {tenant!r} has no ledger book: no budget")
                book = Book.new(tenant, limits, now=self.clock())
                if seed is not None:
                    book.seed(seed)
                return book
            return codec.decode_book(data)

        result: T = await self._submit(book_key(tenant), fn, decode, codec.encode_book)
        return result

    async def _change_existing(self, tenant: str, fn: Callable[[Book], T], *, missing: T) -> T:
        """``_change`` of a book that should exist; ``missing`` when it does not (nothing to
        change: a hold, a run or a spend in a book that is gone is nobody's)."""
        try:
            return await self._change(tenant, fn)
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
    ) -> BudgetRefusal | None:
        """Take a concurrency slot for ``run`` if its tenant (now with ``limits``) has one and
        the budget left covers ``need`` (tokens, USD: its first call's worst case, held until
        that call reserves) at ``now`` (epoch seconds; the store's clock if not given).
        ``None`` when admitted; idempotent. See ``Book.admit``."""
        if now is None:
            now = self.clock()

        def apply(book: Book) -> BudgetRefusal | None:
            if book.limits != limits:
                book.set_limits(limits, now=now)
            return book.admit(
                run.uid, run.namespace, run.name, now=now, need_tokens=need[0], need_cost=need[1]
            )

        return await self._change(tenant, apply, limits=limits)

    def turn_hold(
        self,
        ref: TurnRef,
        *,
        ttl: float = DEFAULT_HOLD_TTL,
        clock: Callable[[], float] | None = None,
        prior_owner: str = "",
    ) -> TurnHold:
        """The hold of one delivery of turn ``ref`` (an ``async with`` block; see ``hold``);
        ``prior_owner``: the delivery that committed the run's previous turn, if known."""
        return TurnHold(self, ref, ttl=ttl, clock=clock or self.clock, prior_owner=prior_owner)

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
        otherwise. Raises ``LedgerUnavailable`` or a NATS error if the book cannot be written."""

        def apply(book: Book) -> BudgetRefusal | None:
            _settle_before(book, ref, before, prior_owner=prior_owner, now=now)
            return book.reserve(ref.key, hold, now=now)

        try:
            return await self._change(ref.tenant, apply)
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
            _settle_before(book, ref, before, prior_owner=prior_owner, now=now)
            return book.reserve_call(ref.key, need, hold, now=now)

        try:
            return await self._change(ref.tenant, apply)
        except BookMissing as err:
            return _no_budget(err)

    async def record_spend(self, ref: TurnRef, *, owner: str, usage: kernel.Usage) -> bool:
        """Write what ``owner``'s model call used on its hold of turn ``ref`` (so it is charged
        even if the turn never commits); False if that hold is gone or another owner's."""
        tokens, cost = usage.total_tokens, usage.cost_usd

        def apply(book: Book) -> bool:
            return book.record_spend(ref.key, owner=owner, tokens=tokens, cost_usd=cost)

        return await self._change_existing(ref.tenant, apply, missing=False)

    async def refresh_hold(self, ref: TurnRef, *, owner: str, expires: float) -> bool:
        """Push the expiry of ``owner``'s hold of turn ``ref`` out to ``expires`` (epoch
        seconds); False if it holds none."""
        return await self._change_existing(
            ref.tenant,
            lambda book: book.refresh(ref.key, owner=owner, expires=expires),
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
            book.resolve_turn(ref.run_uid, ref.turn, committer=owner)
            book.resolve_turn(ref.run_uid, ref.turn - 1, committer=prior_owner)
            return book.settle(
                ref.run_uid,
                turn=ref.turn,
                tokens=after.total_tokens,
                cost_usd=after.cost_usd,
                now=now,
            )

        return await self._change_existing(ref.tenant, apply, missing=(0, Decimal(0)))

    async def release_hold(self, ref: TurnRef, *, owner: str) -> bool:
        """Drop ``owner``'s hold of turn ``ref`` uncharged (no model call answered); False if
        it holds none."""
        return await self._change_existing(
            ref.tenant, lambda book: book.release(ref.key, owner=owner), missing=False
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

        return await self._change_existing(ref.tenant, apply, missing=False)

    async def stop_waiting(self, ref: TurnRef) -> bool:
        """The call of turn ``ref`` no longer waits for other runs' holds (given up); False if
        it did not wait."""
        return await self._change_existing(
            ref.tenant, lambda book: book.stop_waiting(ref.key), missing=False
        )

    async def close_run(
        self,
        tenant: str,
        run_uid: str,
        committed: kernel.RunSummary | None,
        *,
        end: float,
        now: float | None = None,
        committer: str = "",
    ) -> bool:
        """The run ended at ``end`` (epoch seconds): settle what it ``committed`` (its last
        event's summary; ``None``: nothing), charge its wall-clock time in this window, free
        its slot and drop any hold it left — a hold of its last turn is charged as abandoned
        if its call answered and its owner is not ``committer`` (the delivery the last event
        names, if any). False if it was not active."""
        at = self.clock() if now is None else now
        totals = _committed(committed)

        def apply(book: Book) -> bool:
            book.resolve_turn(run_uid, totals["turn"], committer=committer)
            return book.close(run_uid, **totals, end=end, now=at)

        return await self._change_existing(tenant, apply, missing=False)

    async def repair_entry(
        self,
        tenant: str,
        repairs: Sequence[Repair],
        *,
        limits: TenantLimits | None,
        now: float | None = None,
        floor: UsageFloor | None = None,
    ) -> None:
        """Bring the tenant's entry up to date at ``now``: its ``limits`` (if given), its use
        back to ``floor`` if it was rolled back below it (``Book.undercuts``), a new window if
        one is due, then each repair — an expired hold is charged what its run committed and
        dropped (and what its call used, recorded on it, if its turn never committed); a run
        whose last event is terminal is closed at that event's time; a stale run that left no
        events is closed with nothing charged."""
        if now is None:
            now = self.clock()

        def apply(book: Book) -> None:
            if limits is not None and book.limits != limits:
                book.set_limits(limits, now=now)
            if floor is not None and book.undercuts(floor, now=now):
                book.restore(floor, now=now)
            book.roll(now)
            for repair in repairs:
                _repair(book, repair, now)

        await self._change(tenant, apply, limits=limits)

    # --- admission queues -------------------------------------------------------------------------

    async def queue(self, tenant: str) -> list[QueuedRun]:
        """The tenant's admission queue, head first."""
        found = await self._get(queue_key(tenant))
        return [] if found is None else _decode_queue(found[1])

    async def change_queue(self, tenant: str, fn: Callable[[list[QueuedRun]], T]) -> T:
        """Apply ``fn`` to the tenant's queue (a list it may edit in place) by compare-and-set."""

        def decode(data: bytes | None) -> list[QueuedRun]:
            return [] if data is None else _decode_queue(data)

        result: T = await self._submit(queue_key(tenant), fn, decode, _encode_queue)
        return result

    async def enqueue(self, tenant: str, run: QueuedRun) -> int:
        """Queue ``run`` unless already queued: after every run created no later than it (FIFO
        by creation time, so runs created together queue in creation order even when their
        admissions reach here out of order). Returns its 1-based position.

        Raises ``QueueFull`` (for this run only) when the queue holds ``MAX_QUEUED_RUNS``.
        """

        def add(runs: list[QueuedRun]) -> int:
            for index, queued in enumerate(runs):
                if queued.uid == run.uid:
                    return index + 1
            if len(runs) >= MAX_QUEUED_RUNS:
                raise QueueFull(
                    f"AgentTenant {tenant!r}'s admission queue is full ({len(runs)} runs wait)"
                )
            index = len(runs)
            while index > 0 and runs[index - 1].at > run.at:
                index -= 1
            runs.insert(index, run)
            return index + 1

        return await self.change_queue(tenant, add)

    async def dequeue(self, tenant: str, uid: str) -> bool:
        """Remove the run ``uid`` from the queue; False if it was not there."""

        def remove(runs: list[QueuedRun]) -> bool:
            for index, queued in enumerate(runs):
                if queued.uid == uid:
                    del runs[index]
                    return True
            return False

        return await self.change_queue(tenant, remove)

    async def tenants(self) -> list[str]:
        """Tenants with a book entry."""
        try:
            keys = await self.kv.keys()  # nats-py filters by substring, not subject wildcard
        except nats.js.errors.NoKeysError:
            return []
        return [key.removeprefix("book.") for key in keys if key.startswith("book.")]


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
    uid, last = repair.run_uid, repair.last
    if repair.hold_key:
        committed = _committed(last)
        if last is not None:
            book.settle(uid, **committed, now=now)
        hold = book.holds.get(repair.hold_key)
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


def _encode_queue(runs: list[QueuedRun]) -> bytes:
    shapes = [
        QueuedRunShape(uid=r.uid, ns=r.namespace, name=r.name, at=round(r.at, 3)) for r in runs
    ]
    return codec.QUEUE.dump_json(shapes)


def _decode_queue(data: bytes) -> list[QueuedRun]:
    try:
        return [QueuedRun(r.uid, r.ns, r.name, r.at) for r in codec.QUEUE.validate_json(data)]
    except ValueError as err:  # pydantic.ValidationError included
        raise ValueError(f"malformed admission queue: {err!r}") from err
