"""A clock for tests that jump ahead in time and expect to stay inside one budget window.

The default budget window is 24 hours aligned to 00:00 UTC (``window_start``). A test that reads
the real clock and then acts an hour later (``ENDED_MEMORY``, a hold's expiry) crosses 00:00 UTC
whenever it runs from 23:00 on, and the ledger then starts a new window: the tenant's used
tokens read 0, not what the test charged. ``steady_clock`` keeps real time's pace but reads
01:00 UTC (on some day) when this module is first imported, so a test has 22 hours of jumps
before the next window starts, at any hour of the day it runs.
"""

from __future__ import annotations

import time

DAY = 86_400.0
"""Seconds in the default budget window."""

_SHIFT = time.time() % DAY - 3_600.0


def steady_clock() -> float:
    """Epoch seconds (float): the real clock moved back to read 01:00 UTC at import time."""
    return time.time() - _SHIFT
