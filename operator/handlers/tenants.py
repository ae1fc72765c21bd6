"""kopf handler of AgentTenants: it keeps the tenant registry current.

It starts or ends no run; a changed tenant's queue is pumped, and every queue when a binding
changed (the pump moves or ends the queued runs whose namespace's tenant changed). What does
not belong here: the AgentRun handlers (``runs``), kopf's configuration (``startup``).
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
    """Keep the tenant registry current; a changed tenant (more budget, more slots) is pumped,
    and when the change moved a binding (made, deleted, ``spec.namespaces`` or
    ``spec.namespaceSelector`` edited, made invalid) every queue pumped here is too: its runs
    whose namespace binds another tenant now move there (``admission.rebinding``)."""
    parts = memo.running().tenants
    before = parts.tenants.bindings
    if type == "DELETED":
        parts.tenants.remove(name)
    elif parts.tenants.put(body) is not None:
        parts.board.kick(name)
    if parts.tenants.bindings != before:
        for tenant in parts.board.tenants():
            parts.board.kick(tenant)
