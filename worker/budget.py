"""One turn's view of its tenant's ledger: reserve before the model call, settle after commit.

The order (DESIGN.md §5): reserve the call's worst case → call the model → run tools → commit
the turn event → settle the run's cumulative usage. A turn that never commits (cancelled, lost
the commit race, its worker shut down) releases its hold; a worker that dies leaves the hold to
expire, and the operator releases it (``operator.tenancy``). The hold is refreshed with the
turn's JetStream heartbeat, so only a dead worker's hold expires.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from decimal import Decimal

from agentrun import kernel
from agentrun.ledger import Book, BudgetRefusal, Hold, LedgerStore, worst_case

__all__ = ["DEFAULT_HOLD_TTL", "TurnBudget", "worst_case"]

log = logging.getLogger(__name__)

DEFAULT_HOLD_TTL = 60.0
"""Seconds a hold lives without a refresh (``AGENTRUN_HOLD_TTL``)."""


class TurnBudget:
    """Ledger operations of one delivery of one turn (``<run-uid>:<turn>``, a fresh owner id)."""

    def __init__(
        self,
        store: LedgerStore,
        *,
        tenant: str,
        run_uid: str,
        namespace: str,
        name: str,
        turn: int,
        ttl: float = DEFAULT_HOLD_TTL,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.tenant = tenant
        self.run_uid = run_uid
        self.namespace = namespace
        self.name = name
        self.turn = turn
        self.ttl = ttl
        self.clock = clock
        self.key = f"{run_uid}:{turn}"
        self.owner = uuid.uuid4().hex[:16]
        self.held = False
        self.spent: kernel.Usage | None = None
        """What this turn's model call used, once it answered and until the turn commits: a
        turn abandoned after that is charged for it (the provider bills it)."""

    async def reserve(
        self, *, tokens: int, cost_usd: Decimal, before: kernel.RunState | None = None
    ) -> BudgetRefusal | None:
        """Hold ``tokens`` / ``cost_usd`` (the call's worst case) or say why it does not fit.

        ``before`` is the run's state before this turn: its totals through the last committed
        turn are settled first, in the same write, and that turn's hold dropped — so a call is
        never refused for a previous turn whose worker has not settled yet.

        Raises ``LedgerUnavailable`` or a NATS error when the ledger cannot be changed (the
        turn is then retried by redelivery, never run unreserved).
        """
        now = self.clock()
        hold = Hold(
            self.run_uid,
            self.turn,
            tokens,
            cost_usd,
            now + self.ttl,
            self.owner,
            self.namespace,
            self.name,
        )

        def apply(book: Book) -> BudgetRefusal | None:
            if before is not None:
                book.catch_up(
                    self.run_uid,
                    turn=before.turn - 1,
                    tokens=before.usage.total_tokens,
                    cost_usd=before.usage.cost_usd,
                    now=now,
                )
            return book.reserve(self.key, hold, now=now)

        self.held = True  # if cancelled mid-write, release() still drops it (owner-checked)
        try:
            refusal = await self.store.change(self.tenant, apply)
        except BaseException:
            await self.release()
            raise
        self.held = refusal is None
        return refusal

    async def refresh(self) -> None:
        """Keep the hold alive while the turn runs (called with each heartbeat)."""
        if not self.held:
            return
        expires = self.clock() + self.ttl
        await self.store.change(
            self.tenant, lambda book: book.refresh(self.key, owner=self.owner, expires=expires)
        )

    async def settle(self, after: kernel.RunState) -> None:
        """Charge the run's cumulative usage after this committed turn; drop the hold."""
        now = self.clock()
        usage = after.usage
        await self.store.change(
            self.tenant,
            lambda book: book.settle(
                self.run_uid,
                turn=self.turn,
                tokens=usage.total_tokens,
                cost_usd=usage.cost_usd,
                now=now,
                key=self.key,
            ),
        )
        self.held = False

    def committed(self) -> None:
        """The turn committed: its call's usage is now in the run's, charged by ``settle``."""
        self.spent = None

    async def release(self) -> None:
        """The turn will not commit: drop this delivery's hold, charging the model call's
        usage if it answered (best effort: an unreleased hold expires anyway)."""
        if not self.held:
            return
        self.held = False
        spent, now = self.spent, self.clock()
        with contextlib.suppress(Exception):
            if spent is None:
                await self.store.change(
                    self.tenant, lambda book: book.release(self.key, owner=self.owner)
                )
            else:
                await self.store.change(
                    self.tenant,
                    lambda book: book.abandon(
                        self.key,
                        owner=self.owner,
                        tokens=spent.total_tokens,
                        cost_usd=spent.cost_usd,
                        now=now,
                    ),
                )
