"""The admission queues as the queue pump last saw them, and requests to pump a tenant's queue.

What belongs here: ``QueueBoard``. Its state is private: only the queue pump writes it
(``record_pass``, ``admitting``), after each pass over a tenant's queue; the dispatcher (the
phase gauge), the ledger sweep (AgentTenant status, runs being admitted) and the handlers read
it or ``kick`` a tenant. What does not: the queues themselves (in the ledger bucket, through
``agentrun.ledger.LedgerStore``), deciding admission (``pump``).
"""

from __future__ import annotations

import asyncio
import contextlib
import types
from collections.abc import Iterator, Mapping

from .. import tenants


class QueueBoard:
    """What the admission queues look like as of each tenant's last pump, and requests to pump
    a tenant's queue (coalesced: a kicked tenant is pumped once however often it was kicked)."""

    def __init__(self) -> None:
        self._queued: dict[str, int] = {}
        """Runs waiting per tenant."""
        self._blocked: dict[str, tenants.QueueWait | None] = {}
        """Why the head of each tenant's queue waits (``None``: nothing waits)."""
        self._admitting: set[str] = set()
        """Uids of runs being admitted right now (their ledger slot exists, their view not yet)."""
        self._kicked: set[str] = set()
        self._wake = asyncio.Event()

    # --- what the pump saw (written by the pump only) -------------------------------------------

    def record_pass(self, tenant: str, *, waiting: int, blocked: tenants.QueueWait | None) -> None:
        """The pump's pass over ``tenant``'s queue left ``waiting`` runs in it; ``blocked``: why
        its head waits (``None``: nothing waits)."""
        self._queued[tenant] = waiting
        self._blocked[tenant] = blocked

    def record_progress(self, tenant: str, *, waiting: int) -> None:
        """A pass over ``tenant``'s queue, still under way, has ``waiting`` runs left in it:
        a pass that admits thousands of runs (a raised ``maxConcurrentRuns`` over a long
        queue) takes minutes, and the AgentTenant's ``queuedRuns`` follows the count as it
        falls rather than showing the pass's start until it ends. Why the head waits stays as
        the last whole pass recorded."""
        self._queued[tenant] = waiting

    @contextlib.contextmanager
    def admitting(self, uid: str) -> Iterator[None]:
        """While run ``uid`` is being admitted (its ledger slot taken, its events not yet
        followed), the sweep leaves its slot alone."""
        self._admitting.add(uid)
        try:
            yield
        finally:
            self._admitting.discard(uid)

    # --- reading it ------------------------------------------------------------------------------

    def queued_counts(self) -> Mapping[str, int]:
        """Runs waiting per tenant (for ``agentrun_runs_in_phase``); a read-only view."""
        return types.MappingProxyType(self._queued)

    def queued(self, tenant: str) -> int:
        """Runs waiting in ``tenant``'s queue (0: none, or never pumped)."""
        return self._queued.get(tenant, 0)

    def blocked(self, tenant: str) -> tenants.QueueWait | None:
        """Why the head of ``tenant``'s queue waits; ``None`` when nothing waits."""
        return self._blocked.get(tenant)

    def tenants(self) -> frozenset[str]:
        """The tenants whose queue was pumped."""
        return frozenset(self._queued)

    def is_admitting(self, uid: str) -> bool:
        """Whether run ``uid`` is being admitted right now."""
        return uid in self._admitting

    # --- requests to pump -------------------------------------------------------------------------

    def kick(self, tenant: str) -> None:
        """Ask for the tenant's queue to be pumped."""
        self._kicked.add(tenant)
        self._wake.set()

    async def take_kicks(self) -> set[str]:
        """Wait for kicks; the tenants kicked since the last call."""
        await self._wake.wait()
        self._wake.clear()
        kicked, self._kicked = self._kicked, set()
        return kicked
