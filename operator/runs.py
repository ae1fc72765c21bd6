"""An AgentRun's identity, the annotations a person sets on it, and why a queued run waits.

What belongs here: the ``RunKey`` every operator module uses to name a run, the control
annotations' names, the closed vocabulary of queue waits. Nothing here does I/O.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentrun.ledger import BudgetRefusal

CANCEL_ANNOTATION = "agentrun.dev/cancel"
"""Set to ``"true"`` to end the run ``cancelled`` (a queued run leaves its queue)."""
APPROVE_ANNOTATION = "agentrun.dev/approve"
"""Set to the digest in ``.status.pendingApproval`` to approve that held call."""
DENY_ANNOTATION = "agentrun.dev/deny"
"""Set to the digest in ``.status.pendingApproval`` to deny that held call."""


@dataclasses.dataclass(frozen=True, slots=True)
class RunKey:
    """Which AgentRun object: namespace, name and uid (names are reused, uids never)."""

    namespace: str
    name: str
    uid: str


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
    """Its AgentTenant was deleted while it waited."""
    TOOL_SERVER_PENDING = "ToolServerPending"
    """An AgentToolServer it names has not been discovered yet (applied together with it): it
    waits without holding up the runs queued behind it."""


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
