"""A tenant's use of its current window, rebuilt from its AgentRuns when its ledger book is
made anew (the ledger bucket or the book was lost: NATS data wiped, a book deleted).

The rule (``window_usage``, pure): the tenant's window used at least what its AgentRuns show,
counting every AgentRun whose ``.status.tenant`` is the tenant and

- that ended in the window (``.status.completionTime`` at or after its start, before its
  end): its ``.status.usage`` (``totalTokens``, ``costUSD``, ``wallSeconds``);
- that has not ended but was admitted (``.status.startTime`` set): what its status shows so
  far (the status lags the run's events by at most one status write).

Its bounds: a run that started before the window began is counted in full, the part it spent
in earlier windows included (an overcount, never an undercount, for the runs still listed);
runs deleted since, and model calls charged as abandoned (spent in no run's usage), are not
counted. ``RebuiltUsage`` then takes the larger of that sum and what the AgentTenant's status
last showed for the same window (``Tenants.seen``), resource by resource.

What belongs here: the sum and where its inputs are read. What does not: when a book is made
(``LedgerStore``: only a book that does not exist is seeded, never one that is updated).
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from agentrun.ledger import UsageFloor

from ..platform.kubeapi import KubeApi
from .registry import Tenants

RUNS = "agentruns"


def window_usage(
    runs: Iterable[Mapping[str, Any]], tenant: str, *, window: float, end: float
) -> UsageFloor:
    """What ``runs`` (AgentRun objects) show ``tenant`` used in the window from ``window`` to
    ``end`` (epoch seconds), by the rule of the module docstring: a ``UsageFloor`` of that
    window (tokens, USD, wall-clock seconds). Runs of other tenants, runs never admitted,
    runs that ended outside the window and malformed statuses add nothing."""
    tokens, cost, wall = 0, Decimal(0), 0.0
    for run in runs:
        status = run.get("status")
        if not isinstance(status, Mapping) or status.get("tenant") != tenant:
            continue
        if not _in_window(status, window=window, end=end):
            continue
        used = _usage(status.get("usage"))
        if used is not None:
            tokens, cost, wall = tokens + used[0], cost + used[1], wall + used[2]
    return UsageFloor(window, tokens, cost, wall, end)


def _in_window(status: Mapping[str, Any], *, window: float, end: float) -> bool:
    """Whether a run's recorded usage counts in the window: ended in it, or admitted and
    not ended."""
    completed = _time(status.get("completionTime"))
    if completed is not None:
        return window <= completed < end
    return _time(status.get("startTime")) is not None


def _usage(usage: object) -> tuple[int, Decimal, float] | None:
    """(tokens, USD, wall seconds) of a ``.status.usage``; ``None`` if absent or malformed."""
    if not isinstance(usage, Mapping):
        return None
    try:
        tokens = int(usage.get("totalTokens", 0))
        cost = Decimal(str(usage.get("costUSD", "0")))
        wall = float(usage.get("wallSeconds", 0.0))
    except (TypeError, ValueError, decimal.InvalidOperation):
        return None
    if tokens < 0 or not cost.is_finite() or cost < 0 or not wall >= 0:
        return None
    return tokens, cost, wall


def _time(text: object) -> float | None:
    """An RFC 3339 time as epoch seconds; ``None`` if absent or malformed."""
    if not isinstance(text, str):
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class RebuiltUsage:
    """The ledger's ``rebuild`` hook (``LedgerStore``): called when the operator makes a
    tenant's book that does not exist, with the new book's window; lists every AgentRun."""

    def __init__(self, api: KubeApi, tenants: Tenants) -> None:
        """``api`` lists AgentRuns; ``tenants`` holds what each AgentTenant's status last
        showed (``Tenants.seen``)."""
        self.api = api
        self.tenants = tenants

    async def __call__(self, tenant: str, window: float, end: float) -> UsageFloor:
        """What ``tenant``'s window (``window`` to ``end``, epoch seconds) used at least: the
        larger, per resource, of its runs' sum (``window_usage``) and its status's last
        showing of the same window. Raises ``ApiError`` if the AgentRuns cannot be listed."""
        runs = await self.api.list_objects(RUNS)
        rebuilt = window_usage(runs, tenant, window=window, end=end)
        seen = self.tenants.seen.get(tenant)
        if seen is None:
            return rebuilt
        return rebuilt.raised(seen.window, seen.tokens, seen.cost_usd, seen.wall_seconds)
