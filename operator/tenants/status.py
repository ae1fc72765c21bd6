"""AgentTenant ``.status`` projection: a tenant's ledger entry and queue → the status body.

Pure: the caller passes the policy, the ledger entry (``Book``), what the queue pump last saw
and the conditions' previous transitions; nothing here reads a clock or talks to the API
server. Condition reasons are a closed vocabulary (``TenantReason``); a condition's
``lastTransitionTime`` moves only when its status flips.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from agentrun.ledger import Book, UsageFloor

from ..platform.conditions import condition, rfc3339
from .policy import TenantPolicy
from .waits import QueueWait, WaitReason


class TenantCondition(enum.StrEnum):
    """Condition types of an AgentTenant."""

    ACCEPTED = "Accepted"
    """The spec is valid and enforced."""
    BUDGET_EXHAUSTED = "BudgetExhausted"
    """A window budget is used up, or too little is left for the next queued run's call."""
    NAMESPACES_AMBIGUOUS = "NamespacesAmbiguous"
    """Some namespace it binds is bound by another tenant too: runs there are rejected."""


class TenantReason(enum.StrEnum):
    """Condition reasons of an AgentTenant."""

    VALID = "Valid"
    INVALID_SPEC = "InvalidSpec"
    WITHIN_BUDGET = "WithinBudget"
    TOKENS_EXHAUSTED = "TokensExhausted"
    COST_EXHAUSTED = "CostUSDExhausted"
    WALL_CLOCK_EXHAUSTED = "WallClockSecondsExhausted"
    AMBIGUOUS = "Ambiguous"
    UNAMBIGUOUS = "Unambiguous"


EXHAUSTED_REASON: Mapping[str, TenantReason] = {
    "tokens": TenantReason.TOKENS_EXHAUSTED,
    "costUSD": TenantReason.COST_EXHAUSTED,
    "wallClockSeconds": TenantReason.WALL_CLOCK_EXHAUSTED,
}
"""The ``BudgetExhausted`` reason per ledger resource (``agentrun.ledger.RESOURCES``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Transition:
    """A condition's status and since when (epoch seconds) it has had it."""

    status: bool
    since: float


Transitions = Mapping[TenantCondition, Transition]


@dataclasses.dataclass(frozen=True, slots=True)
class TenantStatus:
    """A projected ``.status`` body and the transitions to pass to the next projection."""

    body: dict[str, Any]
    transitions: dict[TenantCondition, Transition]


@dataclasses.dataclass(frozen=True, slots=True)
class _Conditions:
    """Builds conditions of one projection, remembering their transitions."""

    generation: int
    now: float
    previous: Transitions
    transitions: dict[TenantCondition, Transition] = dataclasses.field(default_factory=dict)

    def condition(
        self, type_: TenantCondition, state: bool, reason: TenantReason, message: str
    ) -> dict[str, Any]:
        before = self.previous.get(type_)
        since = before.since if before is not None and before.status == state else self.now
        self.transitions[type_] = Transition(state, since)
        return condition(
            type_.value,
            status=state,
            reason=reason.value,
            message=message,
            at=since,
            generation=self.generation,
        )


def invalid_tenant_status(
    generation: int, why: str, *, now: float, previous: Transitions
) -> TenantStatus:
    """The status of an AgentTenant that cannot be enforced: ``Accepted=False`` with ``why``."""
    conditions = _Conditions(generation, now, previous)
    body = {
        "observedGeneration": generation,
        "conditions": [
            conditions.condition(TenantCondition.ACCEPTED, False, TenantReason.INVALID_SPEC, why)
        ],
    }
    return TenantStatus(body, conditions.transitions)


def exhaustion(book: Book, blocked: QueueWait | None, now: float) -> QueueWait | None:
    """Why the tenant counts as exhausted: a used-up resource, else a queue head that waits
    because too little is left for its first call; ``None`` when neither."""
    exhausted = book.exhausted(now)
    if exhausted is not None:
        return QueueWait.of(exhausted)
    if blocked is not None and blocked.reason is WaitReason.BUDGET_EXHAUSTED:
        return blocked
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class QueueView:
    """A tenant's queue as the status shows it."""

    queued: int = 0
    """Runs waiting in its queue."""
    blocked: QueueWait | None = None
    """Why the queue head waits (as of the last pump); ``None``: nothing waits."""


EMPTY_QUEUE = QueueView()


def tenant_status(
    policy: TenantPolicy,
    book: Book,
    *,
    now: float,
    previous: Transitions,
    queue: QueueView = EMPTY_QUEUE,
    ambiguous: Mapping[str, tuple[str, ...]] | None = None,
) -> TenantStatus:
    """The status of an enforced AgentTenant.

    ``now``: epoch seconds; ``queue``: its queue as of the last pump; ``ambiguous``: the
    namespaces it shares with other tenants (namespace → the others), whose runs are rejected.
    """
    exhausted = exhaustion(book, queue.blocked, now)
    budget = budget_status(book, now)
    if exhausted is None:
        state, reason, message = False, TenantReason.WITHIN_BUDGET, within_message(budget)
    else:
        assert exhausted.resource is not None
        state, reason, message = True, EXHAUSTED_REASON[exhausted.resource], exhausted.message
    conditions = _Conditions(policy.generation, now, previous)
    body = {
        "observedGeneration": policy.generation,
        "windowStart": rfc3339(book.window),
        "resetTime": rfc3339(book.reset_time),
        "activeRuns": book.active_runs,
        "queuedRuns": queue.queued,
        "budget": budget,
        "conditions": [
            conditions.condition(TenantCondition.ACCEPTED, True, TenantReason.VALID, "enforced"),
            conditions.condition(TenantCondition.BUDGET_EXHAUSTED, state, reason, message),
            _ambiguity(conditions, ambiguous or {}),
        ],
    }
    return TenantStatus(body, conditions.transitions)


def _ambiguity(conditions: _Conditions, ambiguous: Mapping[str, tuple[str, ...]]) -> dict[str, Any]:
    """``NamespacesAmbiguous``: True naming each shared namespace (at most 10) and the other
    tenants binding it; runs in those namespaces only are rejected until one tenant lets go."""
    kind = TenantCondition.NAMESPACES_AMBIGUOUS
    if not ambiguous:
        return conditions.condition(
            kind, False, TenantReason.UNAMBIGUOUS, "no namespace is bound by another tenant too"
        )
    shown = [f"{ns} (also {', '.join(others)})" for ns, others in list(ambiguous.items())[:10]]
    more = f" and {len(ambiguous) - 10} more" if len(ambiguous) > 10 else ""
    message = (
        f"runs are rejected in namespaces other AgentTenants bind too: {'; '.join(shown)}{more}; "
        "list each namespace in one tenant's spec.namespaces (a name wins over a selector) or "
        "narrow the selectors"
    )
    return conditions.condition(kind, True, TenantReason.AMBIGUOUS, message)


def within_message(budget: Mapping[str, Any]) -> str:
    """The ``WithinBudget`` message: what is left of each limited resource
    (``budget_status``'s ``remaining`` of its ``limit``), and that a call goes only when its
    worst case fits, so a tenant with tokens left may still refuse a large call."""
    left = [
        f"{resource} {part['remaining']} of {part['limit']}"
        for resource, part in budget.items()
        if "limit" in part
    ]
    if not left:
        return "no budget limits in this window"
    return (
        f"left in this window: {', '.join(left)}; a model call goes only when its worst case "
        "fits (its prompt's estimate plus its max output tokens)"
    )


def budget_status(book: Book, now: float) -> dict[str, Any]:
    """``AgentTenant.status.budget``: used / reserved / abandoned / limit / remaining per
    resource (tokens as integers, USD as decimal strings, wall clock in seconds)."""
    limits = book.limits
    tokens: dict[str, Any] = {
        "used": book.used_tokens,
        "reserved": book.reserved_tokens,
        "abandoned": book.abandoned_tokens,
    }
    if limits.tokens is not None:
        tokens["limit"] = limits.tokens
        tokens["remaining"] = max(0, limits.tokens - book.used_tokens - book.reserved_tokens)
    cost: dict[str, Any] = {
        "used": format(book.used_cost, "f"),
        "reserved": format(book.reserved_cost, "f"),
        "abandoned": format(book.abandoned_cost, "f"),
    }
    if limits.cost_usd is not None:
        cost["limit"] = format(limits.cost_usd, "f")
        left = limits.cost_usd - book.used_cost - book.reserved_cost
        cost["remaining"] = format(max(Decimal(0), left), "f")
    wall_used = book.wall_used(now)
    wall: dict[str, Any] = {"used": round(wall_used, 1), "reserved": 0}
    if limits.wall_seconds is not None:
        wall["limit"] = limits.wall_seconds
        wall["remaining"] = round(max(0.0, limits.wall_seconds - wall_used), 1)
    return {"tokens": tokens, "costUSD": cost, "wallClockSeconds": wall}


def usage_seen(status: Mapping[str, Any] | None) -> UsageFloor | None:
    """What an AgentTenant's ``.status`` (written by the operator alone: no NATS credential
    can change it) says the tenant had used in its window, as the floor of what its ledger
    entry may show (``UsageFloor``); ``None`` when the status says nothing usable (none
    written yet, or malformed: then the floor starts from what the operator reads)."""
    if not status or not isinstance(status.get("windowStart"), str):
        return None
    budget = status.get("budget") or {}
    try:
        window = _epoch(status["windowStart"])
        reset = status.get("resetTime")
        return UsageFloor(
            window,
            int((budget.get("tokens") or {}).get("used", 0)),
            Decimal(str((budget.get("costUSD") or {}).get("used", "0"))),
            0.0,  # its wall clock counts active runs live: not a floor of the ended ones'
            end=_epoch(reset) if isinstance(reset, str) and _epoch(reset) > window else 0.0,
        )
    except (AttributeError, TypeError, ValueError, decimal.InvalidOperation):
        return None


def _epoch(text: str) -> float:
    """An RFC 3339 time as epoch seconds; raises ``ValueError`` if it is not one."""
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
