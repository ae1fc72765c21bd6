"""Writing AgentTenant ``.status``, its budget metrics and the Events of its budget window.

What belongs here: ``TenantStatusWriter``, which merge-patches a tenant's status (skipping a
body equal to the last one written), keeps each condition's last transition and records a
window budget used up and a new window as Kubernetes Events. What does not: the status body
(``status``, pure), when it is written (the ledger sweep, ``admission.sweep``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from agentrun import kube, metrics
from agentrun.ledger import Book, UsageFloor

from ..platform.conditions import rfc3339
from ..platform.events import EventRecorder, EventType, Involved
from ..platform.failures import Failures
from ..platform.kubeapi import ApiError, KubeApi, Ref
from .policy import TenantPolicy
from .status import (
    QueueView,
    TenantCondition,
    Transition,
    invalid_tenant_status,
    tenant_status,
)
from .waits import QueueWait

log = logging.getLogger(__name__)

TENANTS = kube.TENANTS
"""The plural of ``AgentTenant``."""

EXHAUSTED = TenantCondition.BUDGET_EXHAUSTED


class TenantStatusWriter:
    """Merge-patches AgentTenant ``.status`` (skipping a body equal to the last one written),
    keeps each condition's last transition, and records the moments a person looks for as
    Kubernetes Events: a window budget used up (``BudgetExhausted``, Warning) and a new window
    (``WindowReset``, Normal)."""

    def __init__(self, api: KubeApi, *, events: EventRecorder) -> None:
        """``api``: where the status is written; ``events``: the Kubernetes Events."""
        self.api = api
        self.events = events
        self._windows: dict[str, Book] = {}
        """The last book seen per tenant (its window start and usage)."""
        self._written: dict[str, dict[str, Any]] = {}
        self._transitions: dict[str, dict[TenantCondition, Transition]]
        self._transitions = {}
        self._overruns: set[tuple[str, str, float]] = set()
        """(tenant, resource, window start) of the overruns told (once per window)."""
        self.failures = Failures(log, what="status write")
        """AgentTenants whose status write failed (each logged once; the next sweep writes
        it again)."""

    def record_rollback(self, tenant: str, book: Book, floor: UsageFloor) -> None:
        """Tell a ledger entry rolled back below what the operator saw (``LedgerRolledBack``,
        Warning), once per tenant and window."""
        self.events.record(
            Involved("AgentTenant", tenant),
            type=EventType.WARNING,
            reason="LedgerRolledBack",
            message=(
                f"the ledger book showed {book.used_tokens} tokens, {book.used_cost} USD used in "
                f"the window from {rfc3339(book.window)}; the operator had seen "
                f"{floor.tokens} tokens, {floor.cost_usd} USD in the window from "
                f"{rfc3339(floor.window)}: written by a writer of the bucket, not by the "
                "ledger's rules; restored"
            ),
            key=(tenant, "LedgerRolledBack", floor.window),
        )

    async def write_invalid(self, name: str, generation: int, why: str, *, now: float) -> None:
        """``Accepted=False`` with ``why`` for an AgentTenant that cannot be enforced."""
        projected = invalid_tenant_status(
            generation, why, now=now, previous=self._transitions.get(name, {})
        )
        self._transitions[name] = projected.transitions
        await self._patch(name, projected.body)

    async def write_enforced(
        self,
        policy: TenantPolicy,
        book: Book | None,
        *,
        queued: int,
        blocked: QueueWait | None,
        now: float,
        ambiguous: Mapping[str, tuple[str, ...]] | None = None,
    ) -> None:
        """The status of an enforced AgentTenant and its budget metrics; ``book`` ``None``:
        the tenant has no ledger entry yet (an empty one is shown); ``queued``: runs waiting in
        its queue, ``blocked``: why its head waits (``None``: nothing waits), as of the queue
        pump's last pass."""
        if book is None:
            book = Book.new(policy.name, policy.limits, now=now)
        before = self._transitions.get(policy.name, {}).get(EXHAUSTED)
        projected = tenant_status(
            policy,
            book,
            now=now,
            previous=self._transitions.get(policy.name, {}),
            queue=QueueView(queued, blocked),
            ambiguous=ambiguous,
        )
        self._transitions[policy.name] = projected.transitions
        metrics.record_tenant_budget(policy.name, book, now=now)
        await self._patch(policy.name, projected.body)
        after = projected.transitions.get(EXHAUSTED)
        if after is not None and after.status and (before is None or not before.status):
            condition = next(
                c for c in projected.body["conditions"] if c["type"] == EXHAUSTED.value
            )
            self.events.record(
                Involved("AgentTenant", policy.name),
                type=EventType.WARNING,
                reason="BudgetExhausted",
                message=condition["message"],
                key=(policy.name, "BudgetExhausted", book.window),
            )
        self._record_overrun(policy, book)
        self._record_window(policy.name, book)

    def _record_overrun(self, policy: TenantPolicy, book: Book) -> None:
        """A window's usage past a limit: the calls in flight when the budget ran out used more
        than was held for them (a provider ignoring ``max_tokens``, hidden prompt tokens).
        Told once per window and resource (Warning ``BudgetOverrun``)."""
        limits = policy.limits
        for resource, used, limit in (
            ("tokens", book.used_tokens, limits.tokens),
            ("costUSD", book.used_cost, limits.cost_usd),
        ):
            told = (policy.name, resource, book.window)
            if limit is None or used <= limit or told in self._overruns:
                continue
            self._overruns.add(told)
            self.events.record(
                Involved("AgentTenant", policy.name),
                type=EventType.WARNING,
                reason="BudgetOverrun",
                message=(
                    f"budget {resource} overrun: {used} used of {limit} this window; model "
                    "calls used more than was held for them (a provider that ignored "
                    "max_tokens, or counted hidden prompt tokens): see "
                    "agentrun_budget_overrun_tokens_total"
                ),
                key=(policy.name, "BudgetOverrun", resource, book.window),
            )

    def _record_window(self, tenant: str, book: Book) -> None:
        previous = self._windows.get(tenant)
        self._windows[tenant] = book
        if previous is None or book.window <= previous.window:
            return
        self.events.record(
            Involved("AgentTenant", tenant),
            type=EventType.NORMAL,
            reason="WindowReset",
            message=(
                f"budget window reset: a new window runs from {rfc3339(book.window)} to "
                f"{rfc3339(book.reset_time)}; the previous one used "
                f"{previous.used_tokens} tokens, {previous.used_cost} USD"
            ),
            key=(tenant, "WindowReset", book.window),
        )

    async def _patch(self, name: str, body: dict[str, Any]) -> None:
        if self._written.get(name) == body:
            return
        try:
            await self.api.patch_status(Ref(TENANTS, name), body)
        except ApiError as err:
            if err.status != 404:
                self.failures.failed(name, err, subject=f"AgentTenant {name}")
            return
        self.failures.succeeded(name, subject=f"AgentTenant {name}")
        self._written[name] = body
