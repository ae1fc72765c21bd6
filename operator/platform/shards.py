"""Operator shards: which tenant belongs to which shard, and how many shards one process holds.

Pure: no I/O, no clock. ``main`` reads the shard and membership Leases (``leadership``) and asks
``plan`` what to take and give up; the parts built by ``wiring`` ask an ``Ownership`` whether a
tenant (and so its runs) is theirs.

The rule: a tenant's shard is ``sha256(tenant name) mod N`` (stable across processes, Python
versions and restarts; never Python's ``hash``). A run belongs to the tenant it was admitted
under (``status.tenant``, recorded from its sealed ``admitted`` event), so relabelling its
namespace never moves a running run to another shard. A run whose namespace resolves to no
tenant belongs to shard 0 (whose owner rejects it). Cluster-scoped and cross-tenant work
(AgentEvals, CronAgentRun schedules, tool-server discovery, purging deleted runs' events) is
done by the holder of shard 0. With N = 1 the one process that holds shard 0 owns everything:
active/standby as before, on the Lease ``<lease_name>``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Mapping
from typing import Any

import cachetools

CLUSTER_SHARD = 0
"""The shard whose holder does the cluster-scoped and cross-tenant work, and owns the runs of
namespaces no tenant binds."""


def shard_of(tenant: str, shards: int) -> int:
    """The shard (``0 <= s < shards``) of tenant name ``tenant``: ``sha256`` of its UTF-8 bytes,
    the first 8 bytes big-endian, modulo ``shards``. Raises ``ValueError`` if ``shards < 1``."""
    if shards < 1:
        raise ValueError(f"shards must be at least 1, not {shards}")
    if shards == 1:
        return 0
    digest = hashlib.sha256(tenant.encode()).digest()
    return int.from_bytes(digest[:8], "big") % shards


def lease_name(base: str, shard: int, shards: int) -> str:
    """The Lease of ``shard``: ``base`` itself when there is one shard (the Lease an
    active/standby install always used), else ``<base>-<shard>``."""
    return base if shards == 1 else f"{base}-{shard}"


def member_lease_name(base: str, slot: int) -> str:
    """Membership slot ``slot``'s Lease, ``<base>-member-<slot>``: each process holds one slot
    while it runs, so the others count it live before it owns any shard."""
    return f"{base}-member-{slot}"


def fair_share(shards: int, live: int) -> int:
    """How many shards one of ``live`` processes holds at most: ``ceil(shards / live)``
    (``live`` below 1 counts as 1)."""
    return math.ceil(shards / max(live, 1))


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """What one process does next with the shard Leases."""

    take: tuple[int, ...] = ()
    """Free shards to try to take, in this order (each write may still lose a race)."""
    give: tuple[int, ...] = ()
    """Shards it holds beyond its fair share, to give up (highest first)."""

    @property
    def changes(self) -> bool:
        """Whether anything is to be taken or given up."""
        return bool(self.take or self.give)


def plan(holders: Mapping[int, str], *, me: str, live: int) -> Plan:
    """What process ``me`` should take or give up.

    ``holders``: every shard → the identity holding its Lease as this process judges it
    (``""`` when free: released, never taken, or unchanged for its duration on this process's
    clock). ``live``: processes counted live (membership Leases held, this one included).
    A process below its fair share takes free shards, lowest first; one above it gives up its
    highest shards, never below the share; a process at its share does nothing.
    """
    share = fair_share(len(holders), live)
    mine = sorted(s for s, holder in holders.items() if holder == me)
    if len(mine) > share:
        return Plan(give=tuple(reversed(mine[share:])))
    free = sorted(s for s, holder in holders.items() if not holder)
    return Plan(take=tuple(free[: share - len(mine)]))


@dataclasses.dataclass(frozen=True, slots=True)
class Ownership:
    """The shards one operator process owns while its parts run (fixed for their lifetime:
    ``main`` restarts the parts when the set changes)."""

    shards: int = 1
    """N, the install's shard count."""
    owned: frozenset[int] = frozenset({0})
    """The shards this process holds."""

    def owns_shard(self, shard: int) -> bool:
        """Whether shard ``shard`` is this process's."""
        return shard in self.owned

    def owns_tenant(self, tenant: str | None) -> bool:
        """Whether tenant ``tenant``'s runs, queue and ledger entry are this process's; no
        tenant (``None`` or ``""``: a namespace no tenant binds) is shard 0's."""
        return self.shard(tenant) in self.owned

    def shard(self, tenant: str | None) -> int:
        """The shard of ``tenant`` (shard 0 for none)."""
        return shard_of(tenant, self.shards) if tenant else CLUSTER_SHARD

    @property
    def cluster_work(self) -> bool:
        """Whether this process does the cluster-scoped and cross-tenant work (it holds
        shard 0)."""
        return CLUSTER_SHARD in self.owned

    @property
    def everything(self) -> bool:
        """Whether this process owns every shard (always so with one shard)."""
        return len(self.owned) == self.shards


ALL_OF_ONE = Ownership()
"""One shard, owned: an active/standby install's leader (the default of every part)."""


class RunShards:
    """Which AgentRuns this process owns: ``ownership`` plus the tenants resolved for runs not
    admitted yet (by uid; bounded)."""

    def __init__(self, ownership: Ownership, *, memory: int = 100_000) -> None:
        """``memory``: how many resolved runs are remembered (least recently used first out)."""
        self.ownership = ownership
        self._resolved: cachetools.LRUCache[str, str] = cachetools.LRUCache(memory)

    def learn(self, uid: str, tenant: str | None) -> None:
        """Run ``uid``'s namespace resolves to ``tenant`` (``None``: to none)."""
        self._resolved[uid] = tenant or ""

    def tenant_of(self, body: Mapping[str, Any]) -> str | None:
        """The tenant of AgentRun ``body``: its admitted tenant, else the one learned for it,
        else ``None`` (unknown: shard 0's)."""
        tenant = (body.get("status") or {}).get("tenant")
        if tenant:
            return str(tenant)
        uid = str((body.get("metadata") or {}).get("uid") or "")
        return self._resolved.get(uid) or None

    def owns(self, body: Mapping[str, Any]) -> bool:
        """Whether ``body`` is this process's to handle: any object but an AgentRun is; an
        AgentRun is if its tenant's shard is owned here."""
        if self.ownership.everything or body.get("kind") != "AgentRun":
            return True
        return self.ownership.owns_tenant(self.tenant_of(body))
