"""How much of the event stream each tenant's runs take, and whether its next run may start.

What belongs here: ``EventStorage``, the bytes the events of each tenant's runs take, learned
from the runs' statuses (``status.usage.eventBytes``, which the dispatcher writes from the
events it consumes) as the AgentRun watch lists and changes them, so an operator that starts
knows them again from the API server alone; and the wait of a tenant at its limit. What does
not: the per-run bound (the workers end a run at ``AGENTRUN_RUN_EVENT_MAX_BYTES``), the
stream's own limits (``agentrun.bus``).

Enforced at admission: a tenant at its limit admits nothing (its queue waits, reason
``EventStorageFull``) until runs are deleted — by a person or ``ttlSecondsAfterFinished``,
which purges their events. Runs already going finish, each within the per-run bound, so a
tenant holds at most its limit plus its running runs' bounds; the stream's ``max_bytes``
bounds the sum for everyone.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import Any

from ..tenants import QueueWait, WaitReason


class EventStorage:
    """Bytes of events per tenant, from the statuses of the runs that still exist."""

    def __init__(self, *, limit: int) -> None:
        """``limit``: the bytes a tenant's runs may take (``AGENTRUN_TENANT_EVENT_MAX_BYTES``)."""
        self.limit = limit
        self._runs: dict[str, tuple[str, int]] = {}
        """Run uid → (tenant, bytes) as its status last said."""
        self._used: collections.Counter[str] = collections.Counter()

    def observe(self, uid: str, status: Mapping[str, Any]) -> None:
        """An AgentRun's status as listed or changed (its tenant and ``usage.eventBytes``)."""
        tenant = str(status.get("tenant") or "")
        size = int((status.get("usage") or {}).get("eventBytes") or 0)
        if not tenant:
            return
        self.forget(uid)
        self._runs[uid] = (tenant, size)
        self._used[tenant] += size

    def forget(self, uid: str) -> None:
        """The run was deleted: its events are purged."""
        known = self._runs.pop(uid, None)
        if known is not None:
            tenant, size = known
            self._used[tenant] -= size
            if self._used[tenant] <= 0:
                del self._used[tenant]

    def used(self, tenant: str) -> int:
        """Bytes the events of ``tenant``'s runs take."""
        return self._used.get(tenant, 0)

    def wait(self, tenant: str) -> QueueWait | None:
        """Why ``tenant``'s next run must wait for storage, or ``None`` when it may start."""
        used = self.used(tenant)
        if used < self.limit:
            return None
        return QueueWait(
            WaitReason.EVENT_STORAGE_FULL,
            f"the events of AgentTenant {tenant!r}'s runs take {used} bytes, at its limit of "
            f"{self.limit} (AGENTRUN_TENANT_EVENT_MAX_BYTES); delete finished runs (or set "
            "ttlSecondsAfterFinished) to free it",
        )
