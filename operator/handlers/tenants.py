"""kopf handler of AgentTenants: it keeps the tenant registry current.

It starts or ends no run; a changed tenant's queue is pumped. What does not belong here: the
AgentRun handlers (``runs``), kopf's configuration (``startup``).
"""

from __future__ import annotations

from typing import Any

import kopf

from agentrun import kube

from ..wiring import OperatorMemo

TENANT = (kube.GROUP, kube.VERSION, kube.TENANTS)


@kopf.on.event(*TENANT)
async def tenant_changed(
    *, type: str | None, body: kopf.Body, name: str, memo: OperatorMemo, **_: Any
) -> None:
    """Keep the tenant registry current; a changed tenant (more budget, more slots) is pumped."""
    parts = memo.running().tenants
    if type == "DELETED":
        parts.tenants.remove(name)
        return
    if parts.tenants.put(body) is not None:
        parts.board.kick(name)
