"""The memory of the turns one worker runs at once, bounded in bytes and shared by tenants.

A turn holds its run in memory: the folded state and the model request built from it. By
count alone (``AGENTRUN_WORKER_CONCURRENCY``, 64) the turns of runs near the per-run event cap
(64 runs of 6.7 MiB of events) took 1.85 GiB of a worker's RSS, over the chart's 1 GiB limit: an
OOM kill redelivers every tenant's turns. So before a turn reads its run, it reserves
`turn_bytes` of its run's stored bytes (``TurnRequest.stored``, which the operator writes from
the run's last event) from the worker's `TurnMemory`: a `ByteBudget` of
``AGENTRUN_WORKER_TURN_MEMORY_BYTES`` cut into ``AGENTRUN_WORKER_TURN_MEMORY_SHARES`` tenant
shares. A tenant's turns wait behind its own, in the order they came, within its share, so one
tenant's heavy runs leave the others the rest; a turn larger than a share is held alone within
it (and takes its size of the whole budget, all of it at most).

A turn waiting for room holds its worker slot and heartbeats, as a long turn does: it counts
in its tenant's turns in flight (``maxConcurrentTurns``), whose fair share of the workers'
slots bounds how many a tenant can hold. It waits without a time limit, so a big turn is never
passed over for ever by the small ones behind it.

`turn_bytes` is an estimate from the stored bytes alone (``STATE_FACTOR``), made for the runs
that take the most memory per byte stored; others reserve more than they use.

What belongs here: the estimate and the reservation. What does not: reading the run, the
delivery (``consumer``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from agentrun.bytebudget import ByteBudget, Shares

STATE_FACTOR = 7
"""Bytes of a turn's memory per byte its run's events take in the stream: measured for runs
of small tool results (the most per byte), a run of 6.7 MiB of events folds to 23.7 MiB of
state and builds a model request of 23 MiB more (the prompt conformed and fitted, its JSON):
about 7 times. A run of large results takes less (its state about its events' size)."""
TURN_BASE_BYTES = 256 * 1024
"""Bytes every turn reserves besides its run's (the request, the answer, the tools' results
before they are cut)."""


def turn_bytes(stored: int) -> int:
    """Bytes a turn of a run whose events take ``stored`` bytes reserves (≥ ``TURN_BASE_BYTES``;
    a negative ``stored`` counts as 0)."""
    return TURN_BASE_BYTES + STATE_FACTOR * max(stored, 0)


class TurnMemory:
    """The worker's turn memory: ``total`` bytes, each tenant's turns within ``total //
    shares`` of them. One event loop's tasks share it (not thread-safe)."""

    def __init__(self, total: int, *, shares: int) -> None:
        """``total``: bytes (≥ 1); ``shares``: tenant shares it is cut into (≥ 1). Raises
        ``ValueError`` for a total or shares below 1."""
        self.budget = ByteBudget(total)
        self.shares = Shares(self.budget, parts=shares)

    @property
    def held(self) -> int:
        """Bytes the turns running now reserved."""
        return self.budget.held

    @contextlib.asynccontextmanager
    async def reserved(self, tenant: str, stored: int) -> AsyncIterator[None]:
        """For the block, `turn_bytes` of ``stored`` reserved from ``tenant``'s share: waits
        (behind the tenant's earlier turns) until they fit; given back after the block.
        Cancelled while waiting, it takes nothing."""
        with self.shares.using(tenant) as share:
            amount = await share.take(turn_bytes(stored))
            try:
                yield
            finally:
                share.give(amount)
