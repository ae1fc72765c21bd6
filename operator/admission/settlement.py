"""Settling a run's tenant-ledger entry when the run ends.

What belongs here: closing a run's ledger slot (charging what its events show it committed and
its wall-clock time) and asking for its tenant's queue to be pumped. What does not: deciding
admission (``pump``), repairing entries (``sweep``), the queues' shared view (``queue``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from agentrun.ledger import Ending, LedgerStore
from agentrun.protocol import RunEvent

from .queue import QueueBoard


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

    async def settle_ended_run(
        self, event: RunEvent, *, tenant: str, uid: str, life: int | None = None
    ) -> None:
        """A run's life ``life`` (the ``reruns`` its admission sealed; ``None``: not known)
        ended (its terminal event, or its last event when deleted): settle its final usage,
        charge its wall-clock time, free its slot, pump its tenant's queue. A slot of a later
        life (a rerun admitted meanwhile) is left alone (``LedgerStore.close_run``).

        Raises what the ledger store raises (the sweep closes runs it finds ended)."""
        now = self.clock()
        end = event.time or now
        ending = Ending(event.owner, life)
        await self.store.close_run(tenant, uid, event.summary, end=end, now=now, ending=ending)
        self.board.kick(tenant)

    async def release_unstarted(self, tenant: str, *, uid: str, life: int | None = None) -> None:
        """Free the slot of a run that was admitted in the ledger but never started (or that
        runs again from turn 0: a rerun), if it is of life ``life`` or an earlier one (its
        ``status.reruns``; ``None``: any); its next admission is a new one."""
        await self.store.free_run(tenant, uid, now=self.clock(), life=life)
