"""The ledger's JSON, as stored in KV, in its two layouts (``entries.LAYOUTS``): a tenant's
totals and its runs' entries (``split``), the whole ledger as one value (``single``), and an
admission queue entry.

A ``split`` tenant's totals (``book.<tenant>``, format 3) carry what every decision needs and
nothing that grows with its runs — ``used``, the sums of all holds, the number of active runs
and their wall-clock offsets, the first waiting calls — plus the entries of up to
``EMBEDDED_RUNS`` runs kept inline (``runs``), so a small tenant's every change is one write of
one small value. Every other run's entry is a value of its own (``run.<tenant>.<uid>``). Where
an entry lives is the store's choice (``store``); the shapes are the same.

A ``single`` tenant's ledger is one value (``book.<tenant>``, format 2): the layout every
earlier release reads and writes, so a worker of the previous release works on it during a
rollout. What this release added to it (the runs remembered as ended, what a call charged as
abandoned was charged, the credited usage, the life each slot was admitted for) are optional
fields an earlier reader ignores; a run entry's life (``RunShape.life``) too.

Rows are arrays, not objects (a hold ``[turn, tokens, cost, expires, owner]``, an active run
``[ns, name, since, turn, tokens, cost]``), and decimals are strings (exact; tiny amounts in
exponent notation, ``1.5E-7``): values are rewritten on every change of a budget, so their size
and encode/decode time are the ledger's cost. Times are written as they are (the shortest exact
float): a reader sees exactly the writer's values.

Raises, when decoding: ``LedgerCorrupt`` (a ``ValueError``) on a malformed value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from decimal import Decimal
from typing import Literal

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from agentrun.ledger.book import Book
from agentrun.ledger.entries import (
    Active,
    Hold,
    LedgerCorrupt,
    RunEntry,
    TenantLimits,
    Waiter,
)

FORMAT = 3
"""Version of the totals' and the run entries' shape (``"v"``) of a ``split`` tenant."""
ONE_VALUE_FORMAT = 2
"""Version of a ``single`` tenant's one-value ledger (``encode_one_value``)."""

HoldRow = tuple[int, int, Decimal, float, str] | tuple[int, int, Decimal, float, str, int, Decimal]
"""A hold of the run: turn, tokens, USD, expiry (epoch seconds), owner; then, once a usage of
its call is recorded, the tokens and USD the call used. Those two fields are the marker
(``Hold.recorded``), whatever they hold: ``[…, 0, "0"]`` is a recorded usage of 0, charged 0
when the hold is dropped, and a row without them has nothing recorded (its prompt's bound is
charged). Every earlier release wrote them only for a usage above 0, so its rows read as they
did, and reads this row type as it is (a marker column of its own would fail its fixed-length
read); one that rewrites a row of a recorded 0 writes it without them (its own reading)."""
PromptRow = tuple[int, Decimal]
"""A model call's prompt bound held with its hold: tokens, USD (``Hold.prompt_tokens``). Apart
from the hold's row, which an earlier release reads with a fixed length."""
WaiterRow = tuple[float, int, Decimal, float]
"""A waiting call: waiting since (epoch seconds), tokens, USD it needs at least, expiry."""
ActiveRow = tuple[str, str, float, int, int, Decimal]
"""An active run: namespace, name, charged since (epoch seconds), turn, tokens, USD charged."""


class _Shape(BaseModel):
    model_config = ConfigDict(frozen=True)


class LimitsShape(_Shape):
    """An AgentTenant's limits (``None``: unlimited)."""

    tokens: int | None
    costUSD: Decimal | None
    wallClockSeconds: float | None
    windowSeconds: float
    maxConcurrentRuns: int | None


class UsedShape(_Shape):
    """What the window has used so far."""

    tokens: int
    costUSD: Decimal
    wallClockSeconds: float
    abandonedTokens: int
    abandonedCostUSD: Decimal
    creditedTokens: int = 0
    """Taken back out of ``tokens`` in this window (``Book.credited_tokens``; 0 in values
    written before it was kept)."""
    creditedCostUSD: Decimal = Decimal(0)


class ReservedShape(_Shape):
    """The sums of every hold of the tenant."""

    tokens: int
    costUSD: Decimal


class ActiveShape(_Shape):
    """The tenant's active runs, counted: how many, and the sum of their wall-clock offsets
    into the window (seconds)."""

    runs: int
    sinceOffsets: float


class RunShape(_Shape):
    """One run's entry: inline in its tenant's totals, or the value ``run.<tenant>.<uid>``."""

    active: ActiveRow | None = None
    holds: dict[str, HoldRow] = {}
    waiting: dict[str, WaiterRow] = {}
    charged: dict[str, float] = {}
    """Calls charged as abandoned by another party: ``<run-uid>:<turn>/<owner>`` → until
    (epoch seconds)."""
    spent: dict[str, tuple[int, Decimal]] = {}
    """What each of its own calls in ``charged`` was charged: key → [tokens, USD]."""
    ended: float = 0.0
    """Until when the run is remembered as ended (epoch seconds; 0: it has not ended)."""
    life: int | None = None
    """The life of the run its slot (``active``) was admitted for (``Active.life``; ``None``:
    no slot, or not known — absent in values of earlier releases, which ignore it)."""
    prompts: dict[str, PromptRow] = {}
    """The prompt bound of each of its holds of a model call, by hold key (``Hold.prompt_tokens``;
    absent in values of earlier releases, which ignore it)."""


class TotalsShape(_Shape):
    """One tenant's totals (key ``book.<tenant>``), with the entries of its inline runs."""

    v: Literal[3]
    tenant: str
    limits: LimitsShape
    window: float
    used: UsedShape
    reserved: ReservedShape
    active: ActiveShape
    firstWaiters: dict[str, WaiterRow] = {}
    runs: dict[str, RunShape] = {}
    end: float | None = None
    """When the current window ends (epoch seconds): it differs from ``window`` plus
    ``limits.windowSeconds`` after the length was edited. Absent in values written before it
    existed: then it is that sum (readers that predate it ignore it)."""


class RunValueShape(_Shape):
    """A run's entry stored on its own (key ``run.<tenant>.<uid>``)."""

    v: Literal[3]
    tenant: str
    uid: str
    entry: RunShape


@dataclasses.dataclass(frozen=True, slots=True)
class Totals:
    """A decoded ``book.<tenant>`` value: the ledger with its inline runs loaded, which runs
    those are, and whether it is a one-value ledger (``single``: every run loaded, none of them
    placed; the store keeps it one value, or splits it)."""

    book: Book
    inline: frozenset[str]
    one_value: bool = False


# --- encoding ------------------------------------------------------------------------------------


def _limits_shape(limits: TenantLimits) -> LimitsShape:
    return LimitsShape.model_construct(
        tokens=limits.tokens,
        costUSD=limits.cost_usd,
        wallClockSeconds=limits.wall_seconds,
        windowSeconds=limits.window_seconds,
        maxConcurrentRuns=limits.max_concurrent_runs,
    )


def _used_shape(book: Book) -> UsedShape:
    return UsedShape.model_construct(
        tokens=book.used_tokens,
        costUSD=book.used_cost,
        wallClockSeconds=round(book.used_wall, 3),
        abandonedTokens=book.abandoned_tokens,
        abandonedCostUSD=book.abandoned_cost,
        creditedTokens=book.credited_tokens,
        creditedCostUSD=book.credited_cost,
    )


def _hold_row(h: Hold) -> HoldRow:
    row = (h.turn, h.tokens, h.cost_usd, h.expires, h.owner)
    return (*row, h.spent_tokens, h.spent_cost) if h.recorded else row


def _prompt_rows(holds: Mapping[str, Hold]) -> dict[str, PromptRow]:
    return {k: (h.prompt_tokens, h.prompt_cost) for k, h in holds.items() if h.prompt_tokens}


def _read_hold(hold: Hold, *, recorded: bool, prompt: PromptRow | None) -> Hold:
    """``hold`` as its row and its prompt row read: ``recorded`` when its row carries the spend
    fields (``HoldRow``), with its call's prompt bound if one is stored (``prompts``)."""
    hold.recorded = recorded
    if prompt is not None:
        hold.prompt_tokens, hold.prompt_cost = prompt
    return hold


def _waiter_row(w: Waiter) -> WaiterRow:
    return (w.since, w.tokens, w.cost_usd, w.expires)


def _run_shape(entry: RunEntry) -> RunShape:
    a = entry.active
    return RunShape.model_construct(
        active=None if a is None else (a.namespace, a.name, a.since, a.turn, a.tokens, a.cost_usd),
        holds={k: _hold_row(h) for k, h in entry.holds.items()},
        prompts=_prompt_rows(entry.holds),
        waiting={k: _waiter_row(w) for k, w in entry.waiting.items()},
        charged=dict(entry.charged),
        spent=dict(entry.spent),
        ended=entry.ended,
        life=None if a is None else a.life,
    )


def encode_totals(book: Book, *, inline: Collection[str]) -> bytes:
    """The tenant's totals as KV value bytes (compact JSON), with the entries of the runs in
    ``inline`` (those loaded and not empty). Built without validation: the values are the
    ledger's own, typed already."""
    used = _used_shape(book)
    runs = {
        uid: _run_shape(entry)
        for uid, entry in book.runs.items()
        if uid in inline and not entry.empty
    }
    shape = TotalsShape.model_construct(
        v=FORMAT,
        tenant=book.tenant,
        limits=_limits_shape(book.limits),
        window=book.window,
        used=used,
        reserved=ReservedShape.model_construct(
            tokens=book.reserved_tokens, costUSD=book.reserved_cost
        ),
        active=ActiveShape.model_construct(runs=book.active_runs, sinceOffsets=book.since_offsets),
        firstWaiters={k: _waiter_row(w) for k, w in book.first_waiters.items()},
        runs=runs,
        end=book.end,
    )
    return shape.model_dump_json().encode()


def encode_run(book: Book, uid: str) -> bytes | None:
    """The entry of run ``uid`` (loaded) as a value of its own; ``None`` when it is empty
    (nothing of the run is left: its value can go)."""
    entry = book.runs.get(uid)
    if entry is None or entry.empty:
        return None
    shape = RunValueShape.model_construct(
        v=FORMAT, tenant=book.tenant, uid=uid, entry=_run_shape(entry)
    )
    return shape.model_dump_json().encode()


def encode_book(book: Book) -> bytes:
    """The whole ledger in one value: the totals with every loaded run inline (what a small
    tenant's totals are; also a fully loaded ledger's snapshot for tests and tools)."""
    return encode_totals(book, inline=book.runs.keys())


@dataclasses.dataclass(frozen=True, slots=True)
class Split:
    """A ledger laid out for storage: its totals (with the inline runs' entries), which runs
    are inline, and the value of each other run it loaded (``None``: the run has none)."""

    totals: bytes
    inline: frozenset[str]
    runs: dict[str, bytes | None]


def split(
    book: Book, *, inline: Collection[str], stored: Mapping[str, bytes | None], room: int
) -> Split:
    """Lay ``book`` out for storage after a change.

    ``inline``: the runs inline in the totals as read; ``stored``: the value of every other run
    loaded, as read (``None``: it had none); ``room``: how many runs the totals may hold inline.
    A run keeps where it is: inline, or a value of its own. A run that had no entry and has one
    now goes inline while there is room, else into a value of its own; an entry left empty
    goes; an inline entry left with nothing but the memory that its run ended moves into a
    value of its own (its inline place is free again; the store reads that key first). Raises
    ``ValueError`` for a run loaded (and not empty) that is in neither: a change touched a run
    it did not name, whose stored value was never read."""
    placed = set(inline)
    runs: dict[str, bytes | None] = {}
    for uid in sorted(book.runs):
        entry = book.runs[uid]
        if uid in inline:
            if entry.empty:
                placed.discard(uid)
            elif entry.only_ended:  # the memory that it ended goes apart: the place is free
                placed.discard(uid)
                runs[uid] = encode_run(book, uid)
            continue
        if uid not in stored:
            if entry.empty:
                continue
            raise ValueError(f"a ledger change touched run {uid} without naming it")
        if stored[uid] is None and not entry.empty and len(placed) < room:
            placed.add(uid)
            continue
        runs[uid] = encode_run(book, uid)
    return Split(encode_totals(book, inline=placed), frozenset(placed), runs)


# --- decoding ------------------------------------------------------------------------------------


def _entry(uid: str, shape: RunShape) -> RunEntry:
    active = None if shape.active is None else Active(*shape.active, life=shape.life)
    place = (active.namespace, active.name) if active else ("", "")
    holds = {
        k: _read_hold(
            Hold(uid, *row[:5], *place, *row[5:]),
            recorded=len(row) == 7,
            prompt=shape.prompts.get(k),
        )
        for k, row in shape.holds.items()
    }
    return RunEntry(
        active=active,
        holds=holds,
        waiting={k: Waiter(*row) for k, row in shape.waiting.items()},
        charged=dict(shape.charged),
        spent=dict(shape.spent),
        ended=shape.ended,
    )


def _limits(shape: LimitsShape) -> TenantLimits:
    return TenantLimits(
        shape.tokens,
        shape.costUSD,
        shape.wallClockSeconds,
        shape.windowSeconds,
        shape.maxConcurrentRuns,
    )


def is_one_value(data: bytes) -> bool:
    """Whether a ``book.<tenant>`` value is a one-value ledger (format 2), without decoding it."""
    return data.startswith(b'{"v":2,')


def decode_totals(data: bytes) -> Totals:
    """A tenant's totals with their inline runs loaded; a one-value ledger
    value (format 2) is read whole (``Totals.one_value``). Raises ``LedgerCorrupt`` on a
    malformed value or another format."""
    if is_one_value(data):
        return Totals(decode_one_value(data), frozenset(), one_value=True)
    try:
        shape = TotalsShape.model_validate_json(data)
    except ValidationError as err:
        raise LedgerCorrupt(f"malformed ledger totals: {err}") from err
    used = shape.used
    book = Book(
        tenant=shape.tenant,
        limits=_limits(shape.limits),
        window=shape.window,
        used_tokens=used.tokens,
        used_cost=used.costUSD,
        used_wall=used.wallClockSeconds,
        abandoned_tokens=used.abandonedTokens,
        abandoned_cost=used.abandonedCostUSD,
        credited_tokens=used.creditedTokens,
        credited_cost=used.creditedCostUSD,
        reserved_tokens=shape.reserved.tokens,
        reserved_cost=shape.reserved.costUSD,
        active_runs=shape.active.runs,
        since_offsets=shape.active.sinceOffsets,
        first_waiters={k: Waiter(*row) for k, row in shape.firstWaiters.items()},
        runs={uid: _entry(uid, run) for uid, run in shape.runs.items()},
        end=shape.end if shape.end is not None else 0.0,  # 0: window + length
    )
    return Totals(book, frozenset(shape.runs))


def decode_book(data: bytes) -> Book:
    """The ledger in a totals value with the runs it holds inline loaded (every run, for a
    value written by ``encode_book``). Raises ``LedgerCorrupt``."""
    return decode_totals(data).book


def decode_run(data: bytes, *, uid: str) -> RunEntry:
    """A run's entry stored on its own; raises ``LedgerCorrupt`` on a malformed value or one
    of another run."""
    try:
        shape = RunValueShape.model_validate_json(data)
    except ValidationError as err:
        raise LedgerCorrupt(f"malformed ledger entry of run {uid}: {err}") from err
    if shape.uid != uid:
        raise LedgerCorrupt(f"the ledger entry stored for run {uid} is run {shape.uid}'s")
    return _entry(uid, shape.entry)


# --- the one-value ledger (``single``) -----------------------------------------------------------

OneValueHoldRow = (
    tuple[str, int, int, Decimal, float, str]
    | tuple[str, int, int, Decimal, float, str, int, Decimal]
)
"""A hold: run uid, turn, tokens, USD, expiry (epoch seconds), owner; then, once a usage of its
call is recorded, the tokens and USD the call used: the marker of ``HoldRow``, 0 included."""


class OneValueShape(_Shape):
    """A tenant's whole ledger as one value (format 2; key ``book.<tenant>``): the ``single``
    layout, as every earlier release reads and writes it."""

    v: Literal[2]
    tenant: str
    limits: LimitsShape
    window: float
    used: UsedShape
    holds: dict[str, OneValueHoldRow]
    active: dict[str, ActiveRow]
    waiting: dict[str, WaiterRow] = {}
    charged: dict[str, float] = {}
    end: float | None = None
    """When the window ends (written by the releases that edit windows; absent before)."""
    spent: dict[str, tuple[int, Decimal]] = {}
    """What each call in ``charged`` that was its own delivery's was charged (tokens, USD), by
    the same key (``RunEntry.spent``; absent in values of earlier releases, which ignore it)."""
    ended: dict[str, float] = {}
    """Runs remembered as ended: run uid → until (epoch seconds; ``RunEntry.ended``; absent in
    values of earlier releases, which ignore it)."""
    lives: dict[str, int] = {}
    """The life each active run's slot was admitted for, where known: run uid → life
    (``Active.life``; absent in values of earlier releases, which ignore it)."""
    prompts: dict[str, PromptRow] = {}
    """The prompt bound of each hold of a model call, by hold key (``Hold.prompt_tokens``;
    absent in values of earlier releases, which ignore it)."""


def encode_one_value(book: Book) -> bytes:
    """The whole ledger (every run loaded) as one value, format 2: what a ``single`` tenant
    stores and an earlier release reads (its optional fields ignored)."""
    shape = OneValueShape.model_construct(
        v=ONE_VALUE_FORMAT,
        tenant=book.tenant,
        limits=_limits_shape(book.limits),
        window=book.window,
        used=_used_shape(book),
        holds={k: (h.run_uid, *_hold_row(h)) for k, h in book.holds.items()},
        active={
            k: (a.namespace, a.name, a.since, a.turn, a.tokens, a.cost_usd)
            for k, a in book.active.items()
        },
        waiting={k: _waiter_row(w) for k, w in book.waiting.items()},
        charged=book.charged,
        end=book.end,
        spent={k: v for entry in book.runs.values() for k, v in entry.spent.items()},
        ended={uid: e.ended for uid, e in book.runs.items() if e.ended},
        lives={k: a.life for k, a in book.active.items() if a.life is not None},
        prompts=_prompt_rows(book.holds),
    )
    return shape.model_dump_json(exclude_defaults=True).encode()


def decode_one_value(data: bytes) -> Book:
    """A format-2 ledger, fully loaded, its totals computed from its runs (``one_value``: its
    active runs capped). Raises ``LedgerCorrupt`` on a malformed value."""
    try:
        shape = OneValueShape.model_validate_json(data)
    except ValidationError as err:
        raise LedgerCorrupt(f"malformed ledger entry: {err}") from err
    used = shape.used
    book = Book(
        tenant=shape.tenant,
        limits=_limits(shape.limits),
        window=shape.window,
        used_tokens=used.tokens,
        used_cost=used.costUSD,
        used_wall=used.wallClockSeconds,
        abandoned_tokens=used.abandonedTokens,
        abandoned_cost=used.abandonedCostUSD,
        credited_tokens=used.creditedTokens,
        credited_cost=used.creditedCostUSD,
        one_value=True,
        end=shape.end if shape.end is not None else 0.0,  # 0: window + length
    )
    for uid, row in shape.active.items():
        book.start_run(uid, Active(*row, life=shape.lives.get(uid)))
    for key, hold_row in shape.holds.items():
        run = book.active_of(hold_row[0])
        place = (run.namespace, run.name) if run else ("", "")
        hold = Hold(*hold_row[:6], *place, *hold_row[6:])
        recorded = len(hold_row) == 8
        book.put_hold(key, _read_hold(hold, recorded=recorded, prompt=shape.prompts.get(key)))
    for key, waiter_row in sorted(shape.waiting.items(), key=lambda kv: (kv[1][0], kv[0])):
        book.put_waiter(key, Waiter(*waiter_row))
    for memo, until in shape.charged.items():
        book.load_memo(memo, until)
    for memo, (tokens, cost) in shape.spent.items():
        book.load_spent(memo, tokens, cost)
    for uid, until in shape.ended.items():
        book.load_end(uid, until)
    return book


# --- admission queues -----------------------------------------------------------------------------


class QueuedRunShape(_Shape):
    """One run in a tenant's admission queue, as stored (key ``queue.<tenant>.<uid>``; in the
    one-value queue of earlier releases, with its uid)."""

    uid: str
    ns: str
    name: str
    at: float
    """The AgentRun's creation time, epoch seconds (milliseconds kept)."""


QUEUED = TypeAdapter(QueuedRunShape)
LEGACY_QUEUE = TypeAdapter(list[QueuedRunShape])
"""The one-value admission queue of earlier releases (key ``queue.<tenant>``), head first."""
