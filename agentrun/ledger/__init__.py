"""The tenant budget ledger: reservations before model calls, settlement after.

``book`` is the pure arithmetic of one tenant's ledger entry (its parts: ``entries``);
``reserve`` decides one model call's reservation (held, waiting or refused); ``store`` is
the port the operator and the workers use — named operations on the entries
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
from agentrun.ledger.reserve import BudgetWait, CallNeed, Granted
from agentrun.ledger.store import LedgerStore, QueuedRun, QueueFull, Repair

__all__ = [
    "DEFAULT_HOLD_TTL",
    "RESOURCES",
    "Active",
    "Book",
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
    "TenantLimits",
    "TurnHold",
    "TurnRef",
    "codec",
    "window_start",
    "worst_case",
]
