"""The tenant budget ledger: reservations before model calls, settlement after.

``book`` is the pure arithmetic of one tenant's ledger entry (its parts: ``entries``);
``store`` is the port the operator and the workers use — named operations on the entries
(admit a run, a turn's ``hold``, close a run, the admission queue), written by
compare-and-set (``cas``).
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
    TenantLimits,
    window_start,
    worst_case,
)
from agentrun.ledger.hold import DEFAULT_HOLD_TTL, TurnHold, TurnRef
from agentrun.ledger.store import LedgerStore, QueuedRun, Repair

__all__ = [
    "DEFAULT_HOLD_TTL",
    "RESOURCES",
    "Active",
    "Book",
    "BudgetRefusal",
    "Hold",
    "LedgerCorrupt",
    "LedgerStore",
    "LedgerUnavailable",
    "QueuedRun",
    "Repair",
    "TenantLimits",
    "TurnHold",
    "TurnRef",
    "codec",
    "window_start",
    "worst_case",
]
