"""Settling a run's tenant-ledger entry when the run ends, and the shared view of the
admission queues.

What belongs here: closing a run's ledger slot (charging what its events show it committed and
its wall-clock time) and ``QueueBoard``, the small state the queue pump writes and the
dispatcher and sweep read. What does not: deciding admission (``pump``), repairing entries
(``sweep``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

from agentrun.ledger import LedgerStore
from agentrun.protocol import RunEvent

from .runs import QueueWait


class QueueBoard:
    """What the admission queues look like as of each tenant's last pump, and requests to pump
    a tenant's queue (coalesced: a kicked tenant is pumped once however often it was kicked)."""

    def __init__(self) -> None:
        self.queued: dict[str, int] = {}
        """Runs waiting per tenant."""
        self.blocked: dict[str, QueueWait | None] = {}
        """Why the head of each tenant's queue waits (``None``: nothing waits)."""
        self.admitting: set[str] = set()
        """Uids of runs being admitted right now (their ledger slot exists, their view not yet)."""
        self._kicked: set[str] = set()
        self._wake = asyncio.Event()

    def queued_counts(self) -> Mapping[str, int]:
        """Runs waiting per tenant (for ``agentrun_runs_in_phase``)."""
        return self.queued

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


class RunSettlement:
    """Closes runs' ledger entries and asks for their tenant's queue to be pumped (a freed
    slot may admit the next run)."""

    def __init__(
        self,
        store: LedgerStore,
        board: QueueBoard,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``clock``: epoch seconds."""
        self.store = store
        self.board = board
        self.clock = clock

    async def settle_ended_run(self, event: RunEvent, *, tenant: str, uid: str) -> None:
        """A run ended (its terminal event, or its last event when deleted): settle its final
        usage, charge its wall-clock time, free its slot, pump its tenant's queue.

        Raises what the ledger store raises (the sweep closes runs it finds ended)."""
        now = self.clock()
        end = event.time or now
        await self.store.close_run(
            tenant, uid, event.summary, end=end, now=now, committer=event.owner
        )
        self.board.kick(tenant)

    async def release_unstarted(self, tenant: str, *, uid: str) -> None:
        """Free the slot of a run that was admitted in the ledger but never started."""
        now = self.clock()
        await self.store.close_run(tenant, uid, None, end=now, now=now)
