"""Why a run queued in its tenant's admission queue waits: a closed vocabulary.

What belongs here: ``WaitReason`` (the reason of a queued run's ``Admitted=False`` condition)
and ``QueueWait`` (why a queue's head waits, as the queue pump last saw it), shared by the
pump, the queue status and the AgentTenant status. Nothing here does I/O.
"""

from __future__ import annotations

import dataclasses
import enum

from agentrun.ledger import BudgetRefusal


class WaitReason(enum.StrEnum):
    """Why a queued run waits: the reason of its ``Admitted=False`` condition."""

    CONCURRENCY_LIMIT = "ConcurrencyLimit"
    """Its tenant runs ``maxConcurrentRuns`` runs already."""
    BUDGET_EXHAUSTED = "BudgetExhausted"
    """Its tenant's window budget cannot cover its first model call."""
    BUDGET_HELD = "BudgetHeld"
    """Its first model call fits what its tenant has used, but not next to the holds of
    calls in flight: it is admitted once they settle (never failed for it)."""
    TENANT_INVALID = "TenantInvalid"
    """Its AgentTenant cannot be enforced as written."""
    TENANT_MISSING = "TenantMissing"
    """Its AgentTenant was deleted while it waited, and its namespace binds no other tenant
    now (or what it binds cannot be told yet: its labels unreadable): it is admitted when
    that AgentTenant is applied again within ``rebinding.DELETED_GRACE``, else ends as a new
    run there, or moves to the tenant that comes to bind its namespace
    (``admission.rebinding``)."""
    TOOL_SERVER_PENDING = "ToolServerPending"
    """An AgentToolServer it names has not been discovered yet (applied together with it): it
    waits without holding up the runs queued behind it."""
    REFERENCE_MISSING = "ReferenceMissing"
    """Its AgentModel, or an AgentToolServer it names, was deleted while it waited (a new run
    naming a missing one is rejected): it waits for it to be made again, without holding up
    the runs queued behind it."""
    ADMISSION_RETRYING = "AdmissionRetrying"
    """Admitting the run at the head of the queue failed for a reason that passes (NATS or
    the API server away); it is tried again at the next pass. A failure that does not pass
    ends that run instead, and the queue goes on."""
    EVENT_STORAGE_FULL = "EventStorageFull"
    """The events of its tenant's runs take the tenant's share of the event stream; it is
    admitted once runs are deleted."""


@dataclasses.dataclass(frozen=True, slots=True)
class QueueWait:
    """Why the head of a tenant's queue waits."""

    reason: WaitReason
    message: str
    resource: str | None = None
    """The exhausted ledger resource for ``BUDGET_EXHAUSTED``."""

    @classmethod
    def of(cls, refusal: BudgetRefusal) -> QueueWait:
        """The ledger's refusal as a queue wait; raises ``ValueError`` for an unknown reason."""
        return cls(WaitReason(refusal.reason), refusal.message, refusal.resource)
