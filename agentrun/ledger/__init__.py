"""The tenant budget ledger: reservations before model calls, settlement after.

The pure part, layered one way (each imports only those before it): ``entries`` (the ledger's
parts: limits, holds, active runs, a run's entry, refusals, the window, a call's worst case) →
``state`` (one tenant's ledger, ``BookState``: its totals, the entries of its runs loaded, and
the bookkeeping that changes them) → ``deliveries`` (a turn run by two deliveries at once) →
``reserve`` (a run's admission and one model call's reservation: held, waiting or refused) →
``book`` (``Book``: the ledger with every operation named) → ``queue`` (a tenant's admission
queue in order, positions in O(log n)) → ``codec`` (the stored JSON). The I/O part: ``cas``
(compare-and-set writes over JetStream KV, several values in one atomic batch of bounded size
or, guarded, in several), ``hold``
(``TurnHold``, one delivery's hold on its turn's budget, over the ``TurnLedger`` port) and
``store`` (``LedgerStore``, the port the operator and the workers use: named operations — admit
a run, a turn's hold, close a run, the sweep's repairs, the admission queue — each one write of
a tenant's totals and the run entry it touches). A tenant with no book has no
budget: only the operator's admission makes one.
"""

from agentrun.ledger import codec
from agentrun.ledger.book import Book
from agentrun.ledger.cas import LedgerUnavailable
from agentrun.ledger.entries import (
    NO_CALL_OWNER,
    RESOURCES,
    Active,
    BudgetRefusal,
    Hold,
    LedgerCorrupt,
    Seed,
    TenantLimits,
    UsageFloor,
    window_start,
    worst_case,
)
from agentrun.ledger.hold import DEFAULT_HOLD_TTL, MovedOn, TurnHold, TurnLedger, TurnRef
from agentrun.ledger.queue import QueuedRun, TenantQueue
from agentrun.ledger.reserve import BudgetWait, CallNeed, Granted
from agentrun.ledger.store import (
    INLINE_RUNS,
    BookMissing,
    Ending,
    LedgerStore,
    QueueFull,
    Repair,
)

__all__ = [
    "DEFAULT_HOLD_TTL",
    "INLINE_RUNS",
    "NO_CALL_OWNER",
    "RESOURCES",
    "Active",
    "Book",
    "BookMissing",
    "BudgetRefusal",
    "BudgetWait",
    "CallNeed",
    "Ending",
    "Granted",
    "Hold",
    "LedgerCorrupt",
    "LedgerStore",
    "LedgerUnavailable",
    "MovedOn",
    "QueueFull",
    "QueuedRun",
    "Repair",
    "Seed",
    "TenantLimits",
    "TenantQueue",
    "TurnHold",
    "TurnLedger",
    "TurnRef",
    "UsageFloor",
    "codec",
    "window_start",
    "worst_case",
]
