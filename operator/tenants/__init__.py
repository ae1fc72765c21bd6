"""AgentTenant: a tenant's spec, its policy over runs, the registry of tenants and its status.

Inside: ``spec`` (``AgentTenant.spec``, pure), ``policy`` (namespace binding and what a run may
ask for, pure), ``waits`` (why a run queued in a tenant waits, pure), ``status`` (ledger entry
and queue → ``.status`` body, pure), ``registry`` (the AgentTenants the operator knows and the
tenant of a namespace), ``writer`` (writes the status, the budget metrics and the window's
Events), ``rebuild`` (a tenant's window use rebuilt from its AgentRuns, for a ledger book made
anew).

This module is the kind's port: other kinds import what is re-exported here and nothing from
the modules inside (the import contracts check it); the handlers and the wiring may import the
modules directly.
"""

from .policy import OverCap, TenantPolicy, WhenExhausted
from .registry import NoTenant, Tenants
from .waits import QueueWait, WaitReason
from .writer import TenantStatusWriter

__all__ = [
    "NoTenant",
    "OverCap",
    "QueueWait",
    "TenantPolicy",
    "TenantStatusWriter",
    "Tenants",
    "WaitReason",
    "WhenExhausted",
]
