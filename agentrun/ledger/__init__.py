"""The tenant budget ledger (DESIGN.md §5): reservations before model calls, settlement after.

``book`` is the pure arithmetic of one tenant's ledger entry; ``store`` keeps entries in
JetStream KV and changes them only by compare-and-set on the entry's revision.
"""

from agentrun.ledger.book import (
    RESOURCES,
    Active,
    Book,
    BudgetRefusal,
    Hold,
    LedgerCorrupt,
    TenantLimits,
    window_start,
    worst_case,
)
from agentrun.ledger.store import LedgerStore, LedgerUnavailable, QueuedRun

__all__ = [
    "RESOURCES",
    "Active",
    "Book",
    "BudgetRefusal",
    "Hold",
    "LedgerCorrupt",
    "LedgerStore",
    "LedgerUnavailable",
    "QueuedRun",
    "TenantLimits",
    "window_start",
    "worst_case",
]
