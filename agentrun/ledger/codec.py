"""The ledger's JSON: a tenant's book entry and its admission queue, as stored in KV.

The book entry is rewritten on every change of a tenant's budget (each reservation and
settlement of every turn), so its size and its encode/decode time are the ledger's cost: holds
and active runs are arrays, not objects (``[run, turn, tokens, cost, expires, owner]``,
``[ns, name, since, turn, tokens, cost]``), and decimals are strings (exact; tiny amounts in
exponent notation, ``1.5E-7``). Both entries are pydantic shapes: for a 64-run entry (11 KB)
pydantic encodes in about half the time of the hand-written ``json.dumps`` it replaced (87 µs
against 170–190 µs) and decodes about a third faster (110 against 156–162 µs).

Raises, when decoding a book: ``LedgerCorrupt`` (a ``ValueError``) on a malformed entry.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Literal

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from agentrun.ledger.book import Book
from agentrun.ledger.entries import Active, Hold, LedgerCorrupt, TenantLimits, Waiter

FORMAT = 2
"""Version of the book entry's shape (``"v"``)."""

HoldRow = (
    tuple[str, int, int, Decimal, float, str]
    | tuple[str, int, int, Decimal, float, str, int, Decimal]
)
"""A hold: run uid, turn, tokens, USD, expiry (epoch seconds), owner; then, once its call
answered, the tokens and USD the call used."""
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


class BookShape(_Shape):
    """One tenant's book entry (key ``book.<tenant>``)."""

    v: Literal[2]
    tenant: str
    limits: LimitsShape
    window: float
    used: UsedShape
    holds: dict[str, HoldRow]
    active: dict[str, ActiveRow]
    waiting: dict[str, WaiterRow] = {}
    charged: dict[str, float] = {}
    """Calls charged as abandoned by another party: ``<run-uid>:<turn>/<owner>`` → until
    (epoch seconds). Absent in entries written before it existed."""
    end: float | None = None
    """When the current window ends (epoch seconds): it differs from ``window`` plus
    ``limits.windowSeconds`` after the length was edited. Absent in entries written before it
    existed: then it is that sum (readers that predate it ignore it)."""


def encode_book(book: Book) -> bytes:
    """The book as KV entry bytes (compact JSON). Built without validation: the values are
    the book's own, typed already. Times are written as they are (the shortest exact float),
    not rounded: rounding two times per run cost a third of the encode, and a reader then sees
    exactly the writer's values."""
    limits = book.limits
    shape = BookShape.model_construct(
        v=FORMAT,
        tenant=book.tenant,
        limits=LimitsShape.model_construct(
            tokens=limits.tokens,
            costUSD=limits.cost_usd,
            wallClockSeconds=limits.wall_seconds,
            windowSeconds=limits.window_seconds,
            maxConcurrentRuns=limits.max_concurrent_runs,
        ),
        window=book.window,
        used=UsedShape.model_construct(
            tokens=book.used_tokens,
            costUSD=book.used_cost,
            wallClockSeconds=round(book.used_wall, 3),
            abandonedTokens=book.abandoned_tokens,
            abandonedCostUSD=book.abandoned_cost,
        ),
        holds={k: _hold_row(h) for k, h in book.holds.items()},
        active={
            k: (a.namespace, a.name, a.since, a.turn, a.tokens, a.cost_usd)
            for k, a in book.active.items()
        },
        waiting={k: (w.since, w.tokens, w.cost_usd, w.expires) for k, w in book.waiting.items()},
        charged=dict(book.charged),
        end=book.end,
    )
    return shape.model_dump_json().encode()


def _hold_row(h: Hold) -> HoldRow:
    row = (h.run_uid, h.turn, h.tokens, h.cost_usd, h.expires, h.owner)
    return (*row, h.spent_tokens, h.spent_cost) if h.answered else row


def decode_book(data: bytes) -> Book:
    """Inverse of ``encode_book``; raises ``LedgerCorrupt`` on a malformed entry (or one of
    another format version)."""
    try:
        shape = BookShape.model_validate_json(data)
    except ValidationError as err:
        raise LedgerCorrupt(f"malformed ledger entry: {err}") from err
    limits, used = shape.limits, shape.used
    active = {k: Active(*row) for k, row in shape.active.items()}
    holds: dict[str, Hold] = {}
    for k, row in shape.holds.items():
        run = active.get(row[0])  # a hold's run names come from its active entry
        place = (run.namespace, run.name) if run else ("", "")
        holds[k] = Hold(*row[:6], *place, *row[6:])
    return Book(
        tenant=shape.tenant,
        limits=TenantLimits(
            limits.tokens,
            limits.costUSD,
            limits.wallClockSeconds,
            limits.windowSeconds,
            limits.maxConcurrentRuns,
        ),
        window=shape.window,
        used_tokens=used.tokens,
        used_cost=used.costUSD,
        used_wall=used.wallClockSeconds,
        abandoned_tokens=used.abandonedTokens,
        abandoned_cost=used.abandonedCostUSD,
        holds=holds,
        active=active,
        waiting={k: Waiter(*row) for k, row in shape.waiting.items()},
        charged=dict(shape.charged),
        end=shape.end if shape.end is not None else 0.0,  # 0: window + length
    )


class QueuedRunShape(_Shape):
    """One run in a tenant's admission queue, as stored."""

    uid: str
    ns: str
    name: str
    at: float
    """The AgentRun's creation time, epoch seconds (milliseconds kept)."""


QUEUE = TypeAdapter(list[QueuedRunShape])
"""The admission queue's shape (key ``queue.<tenant>``): its runs, head first."""
