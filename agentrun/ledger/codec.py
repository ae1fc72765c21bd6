"""The ledger's JSON: a tenant's book entry and its admission queue, as stored in KV.

The book entry is rewritten on every change of a tenant's budget (each reservation and
settlement of every turn), so its size and its encode/decode time are the ledger's cost: holds
and active runs are arrays, not objects (``[run, turn, tokens, cost, expires, owner]``,
``[ns, name, since, turn, tokens, cost]``), decimals are strings, and the codec is written by
hand — pydantic would parse the entry no faster and build it slower. The admission queue is
written by the operator only, once per admission: a pydantic shape.

Raises, when decoding: ``LedgerCorrupt`` (a ``ValueError``) on a malformed entry.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter

from agentrun.ledger.book import Active, Book, Hold, LedgerCorrupt, TenantLimits

FORMAT = 2
"""Version of the book entry's shape (``"v"``)."""


def _dec(value: Any) -> Decimal:
    return Decimal(str(value))


def _limits_as_dict(limits: TenantLimits) -> dict[str, Any]:
    return {
        "tokens": limits.tokens,
        "costUSD": None if limits.cost_usd is None else format(limits.cost_usd, "f"),
        "wallClockSeconds": limits.wall_seconds,
        "windowSeconds": limits.window_seconds,
        "maxConcurrentRuns": limits.max_concurrent_runs,
    }


def _limits_from_dict(data: dict[str, Any]) -> TenantLimits:
    cost, wall = data["costUSD"], data["wallClockSeconds"]
    return TenantLimits(
        tokens=data["tokens"],
        cost_usd=None if cost is None else _dec(cost),
        wall_seconds=None if wall is None else float(wall),
        window_seconds=float(data["windowSeconds"]),
        max_concurrent_runs=data["maxConcurrentRuns"],
    )


def encode_book(book: Book) -> bytes:
    """The book as KV entry bytes (compact JSON)."""
    return json.dumps(
        {
            "v": FORMAT,
            "tenant": book.tenant,
            "limits": _limits_as_dict(book.limits),
            "window": book.window,
            "used": {
                "tokens": book.used_tokens,
                "costUSD": format(book.used_cost, "f"),
                "wallClockSeconds": round(book.used_wall, 3),
                "abandonedTokens": book.abandoned_tokens,
                "abandonedCostUSD": format(book.abandoned_cost, "f"),
            },
            "holds": {
                k: [
                    h.run_uid,
                    h.turn,
                    h.tokens,
                    format(h.cost_usd, "f"),
                    round(h.expires, 3),
                    h.owner,
                ]
                for k, h in book.holds.items()
            },
            "active": {
                k: [
                    a.namespace,
                    a.name,
                    round(a.since, 3),
                    a.turn,
                    a.tokens,
                    format(a.cost_usd, "f"),
                ]
                for k, a in book.active.items()
            },
        },
        separators=(",", ":"),
    ).encode()


def decode_book(data: bytes) -> Book:
    """Inverse of ``encode_book``; raises ``LedgerCorrupt`` on a malformed entry (or one of
    another format version)."""
    try:
        raw = json.loads(data)
        if raw["v"] != FORMAT:
            raise ValueError(f"ledger entry format {raw['v']!r}, expected {FORMAT}")
        used = raw["used"]
        active = {
            k: Active(v[0], v[1], float(v[2]), int(v[3]), int(v[4]), _dec(v[5]))
            for k, v in raw["active"].items()
        }
        holds: dict[str, Hold] = {}
        for k, v in raw["holds"].items():
            run = active.get(v[0])  # a hold's run names come from its active entry
            holds[k] = Hold(
                v[0],
                int(v[1]),
                int(v[2]),
                _dec(v[3]),
                float(v[4]),
                str(v[5]),
                run.namespace if run else "",
                run.name if run else "",
            )
        return Book(
            tenant=str(raw["tenant"]),
            limits=_limits_from_dict(raw["limits"]),
            window=float(raw["window"]),
            used_tokens=int(used["tokens"]),
            used_cost=_dec(used["costUSD"]),
            used_wall=float(used["wallClockSeconds"]),
            abandoned_tokens=int(used["abandonedTokens"]),
            abandoned_cost=_dec(used["abandonedCostUSD"]),
            holds=holds,
            active=active,
        )
    except (KeyError, IndexError, TypeError, AttributeError, ArithmeticError, ValueError) as err:
        raise LedgerCorrupt(f"malformed ledger entry: {err!r}") from err


class QueuedRunShape(BaseModel):
    """One run in a tenant's admission queue, as stored."""

    model_config = ConfigDict(frozen=True)

    uid: str
    ns: str
    name: str
    at: float
    """The AgentRun's creation time, epoch seconds (milliseconds kept)."""


QUEUE = TypeAdapter(list[QueuedRunShape])
"""The admission queue's shape: its runs, head first."""
