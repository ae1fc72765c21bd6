"""A tenant's use of its current window, rebuilt from its AgentRuns when its ledger book is
made anew (the ledger bucket or the book was lost: NATS data wiped, a book deleted).

The rule (``window_usage``, pure): the tenant's window used at least what its AgentRuns show,
counting every AgentRun whose ``.status.tenant`` is the tenant and

- that ended in the window (``.status.completionTime`` at or after its start, before its
  end): its ``.status.usage`` (``totalTokens``, ``costUSD``, ``wallSeconds``);
- that has not ended but was admitted (``.status.startTime`` set): the tokens and cost its
  status shows so far (the status lags the run's events by at most one status write). Such a
  run takes its concurrency slot again, charged what it showed, so its next settlement
  charges only what is new; its wall clock is charged live from the later of its start and
  the window's (exact, not from its status).

Its bounds: a run that started before the window began is counted in full, the tokens and
cost it spent in earlier windows included (an overcount, never an undercount, for the runs
still listed); runs deleted since, and model calls charged as abandoned (spent in no run's
usage), are not counted. ``RebuiltUsage`` then takes the larger of that sum and what the
AgentTenant's status last showed for the same window (``Tenants.seen``), resource by resource.

What belongs here: the sum and where its inputs are read. What does not: when a book is made
(``LedgerStore``: only a book that does not exist is seeded, never one that is updated).
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from agentrun.ledger import Active, Seed, UsageFloor

from ..platform.kubeapi import KubeApi
from .registry import Tenants

RUNS = "agentruns"


def window_usage(
    runs: Iterable[Mapping[str, Any]], tenant: str, *, window: float, end: float
) -> Seed:
    """What ``runs`` (AgentRun objects) show ``tenant`` used in the window from ``window`` to
    ``end`` (epoch seconds), by the rule of the module docstring: a ``Seed`` whose floor is of
    that window (tokens, USD, wall-clock seconds of the ended runs) and whose active runs are
    those admitted and not ended (by uid). Runs of other tenants, runs never admitted, runs
    that ended outside the window and malformed statuses add nothing."""
    tokens, cost, wall = 0, Decimal(0), 0.0
    active: dict[str, Active] = {}
    for run in runs:
        status = run.get("status")
        if not isinstance(status, Mapping) or status.get("tenant") != tenant:
            continue
        counted = _counted(status, window=window, end=end)
        used = _usage(status.get("usage"))
        if counted is None or used is None:
            continue
        tokens, cost = tokens + used[0], cost + used[1]
        if counted == ENDED:
            wall += used[2]
            continue
        meta = run.get("metadata") or {}
        uid, namespace, name = (str(meta.get(k, "")) for k in ("uid", "namespace", "name"))
        if uid:
            since, life = max(window, counted), _life(status)
            active[uid] = Active(namespace, name, since, -1, used[0], used[1], life=life)
    return Seed(UsageFloor(window, tokens, cost, wall, end), active)


def _life(status: Mapping[str, Any]) -> int | None:
    """The life of the run a status shows (``status.reruns``: 0 when absent, a run never
    rerun), its slot's ``Active.life``; ``None`` when malformed (any life's)."""
    reruns = status.get("reruns", 0)
    return reruns if isinstance(reruns, int) and not isinstance(reruns, bool) else None


def _usage_part(run: Mapping[str, Any], tenant: str) -> dict[str, Any] | None:
    """Of AgentRun ``run``, what ``window_usage`` reads (its uid, namespace and name, its
    status), if its status names ``tenant``; else ``None``."""
    status = run.get("status")
    if not isinstance(status, Mapping) or status.get("tenant") != tenant:
        return None
    meta = run.get("metadata") or {}
    return {
        "metadata": {k: meta[k] for k in ("uid", "namespace", "name") if k in meta},
        "status": status,
    }


ENDED = -1.0
"""``_counted`` of a run that ended in the window."""


def _counted(status: Mapping[str, Any], *, window: float, end: float) -> float | None:
    """Whether a run's recorded usage counts in the window: ``ENDED`` if it ended in it, its
    start time (epoch seconds) if it was admitted and has not ended, else ``None``."""
    if status.get("completionTime") is not None:
        completed = _time(status.get("completionTime"))
        return ENDED if completed is not None and window <= completed < end else None
    return _time(status.get("startTime"))


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

    async def __call__(self, tenant: str, window: float, end: float) -> Seed:
        """What ``tenant``'s window (``window`` to ``end``, epoch seconds) used at least and
        its active runs (``window_usage``), its floor raised, per resource, to its status's
        last showing of the same window. Raises ``ApiError`` if the AgentRuns cannot be
        listed."""
        # of this tenant's runs what ``window_usage`` reads; the rest goes page by page
        runs = await self.api.list_kept(RUNS, lambda run: _usage_part(run, tenant))
        rebuilt = window_usage(runs, tenant, window=window, end=end)
        seen = self.tenants.seen.get(tenant)
        if seen is None or abs(seen.window - window) >= 1.0:  # another window's (whole seconds)
            return rebuilt
        used = rebuilt.used.raised(window, seen.tokens, seen.cost_usd, seen.wall_seconds)
        return Seed(used, rebuilt.active)
