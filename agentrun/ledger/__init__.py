"""The tenant budget ledger: reservations before model calls, settlement after.

The pure part, layered one way (each imports only those before it): ``entries`` (the entry's
parts: limits, holds, active runs, refusals, the window, a call's worst case) → ``state``
(one tenant's entry, ``BookState``: its fields and the bookkeeping that changes them) →
``deliveries`` (a turn run by two deliveries at once) → ``reserve`` (a run's admission and one
model call's reservation: held, waiting or refused) → ``book`` (``Book``: the entry with every
operation named) → ``codec`` (its JSON). The I/O part: ``cas`` (compare-and-set writes over
JetStream KV), ``hold`` (``TurnHold``, one delivery's hold on its turn's budget, over the
``TurnLedger`` port) and ``store`` (``LedgerStore``, the port the operator and the workers use:
named operations on the entries — admit a run, a turn's hold, close a run, the sweep's
repairs, the admission queue — each one compare-and-set write). A tenant with no book has no
budget: only the operator's admission makes one.
"""

from agentrun.ledger import codec
from agentrun.ledger.book import Book
from agentrun.ledger.cas import LedgerUnavailable
from agentrun.ledger.entries import (
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
from agentrun.ledger.hold import DEFAULT_HOLD_TTL, TurnHold, TurnLedger, TurnRef
from agentrun.ledger.reserve import BudgetWait, CallNeed, Granted
from agentrun.ledger.store import BookMissing, LedgerStore, QueuedRun, QueueFull, Repair

__all__ = [
    "DEFAULT_HOLD_TTL",
    "RESOURCES",
    "Active",
    "Book",
    "BookMissing",
    "BudgetRefusal",
    "BudgetWait",
    "CallNeed",
    "Granted",
    "Hold",
    "LedgerCorrupt",
    "LedgerStore",
    "LedgerUnavailable",
    "QueueFull",
    "QueuedRun",
    "Repair",
    "Seed",
    "TenantLimits",
    "TurnHold",
    "TurnLedger",
    "TurnRef",
    "UsageFloor",
    "codec",
    "window_start",
    "worst_case",
]
