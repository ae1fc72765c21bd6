"""``Book``: one tenant's ledger entry with every operation on it named as a method; pure.

The entry's state and its bookkeeping are ``state.BookState`` (the window, settlement and a
run's close, a hold's own lifecycle); the rules that decide are modules of their own, which
import ``state`` and change the entry only through its methods: ``reserve`` (a run's admission,
a model call held, waiting or refused) and ``deliveries`` (a turn run by two deliveries at
once). ``Book`` puts them behind one name, so a caller — the store's compare-and-set changes,
the tests — reads ``book.reserve_call(...)`` whichever module holds the rule. Nothing below
imports this module: the layers run ``entries`` → ``state`` → ``deliveries`` → ``reserve`` →
``book`` → ``codec`` → ``cas`` → ``hold`` → ``store``.

What belongs here: naming the operations. What does not: any rule or change of state (those
live in ``state``, ``reserve`` and ``deliveries``), I/O (``store``).
"""

from __future__ import annotations

from decimal import Decimal

from agentrun.ledger import deliveries, reserve
from agentrun.ledger.entries import BudgetRefusal, Hold
from agentrun.ledger.reserve import BudgetWait, CallNeed, Granted
from agentrun.ledger.state import BookState


class Book(BookState):
    """One tenant's ledger entry (its fields and bookkeeping: ``BookState``) and the operations
    whose rules live in ``reserve`` and ``deliveries``. Operations mutate it; the store applies
    each to a freshly decoded copy and writes it back with compare-and-set, so they must stay
    deterministic."""

    __slots__ = ()

    def admit(
        self,
        run_uid: str,
        namespace: str,
        name: str,
        *,
        now: float,
        need_tokens: int = 0,
        need_cost: Decimal = Decimal(0),
    ) -> BudgetRefusal | None:
        """Take a concurrency slot for a run if one is free and the budget left covers
        ``need`` (the worst case of its first call, held until that call reserves; 0: anything
        left); the refusal otherwise. Idempotent (``reserve.admit``)."""
        return reserve.admit(
            self, run_uid, (namespace, name), now=now, need=(need_tokens, need_cost)
        )

    def reserve(self, key: str, hold: Hold, *, now: float) -> BudgetRefusal | None:
        """Hold ``hold`` under ``key`` (``<run-uid>:<turn>``) if it fits within every limit,
        else the refusal; a hold already under ``key`` is replaced (``reserve.reserve``)."""
        return reserve.reserve(self, key, hold, now=now)

    def reserve_call(
        self, key: str, need: CallNeed, hold: Hold, *, now: float
    ) -> Granted | BudgetWait | BudgetRefusal:
        """Hold the call ``need`` under ``key`` with the largest output allowance that fits,
        or record it as waiting, or refuse it (``reserve.reserve_call``)."""
        return reserve.reserve_call(self, key, need, hold, now=now)

    def earlier_life(self, run_uid: str, life: int | None) -> BudgetRefusal | None:
        """``TurnCommitted`` for a delivery of the run's life ``life`` when its slot is a later
        life's (a rerun), else ``None`` (``reserve.earlier_life``)."""
        return reserve.earlier_life(self, run_uid, life)

    def resolve_turn(self, run_uid: str, turn: int, *, committer: str) -> int:
        """Turn ``turn`` of the run was committed by ``committer``: drop its holds, charging
        other deliveries' answered calls as abandoned (``deliveries.resolve_turn``)."""
        return deliveries.resolve_turn(self, run_uid, turn, committer=committer)
