"""Clocks for tests that expect to stay inside one budget window.

The default budget window is 24 hours aligned to 00:00 UTC (``window_start``). A test that reads
the real clock and then acts an hour later (``ENDED_MEMORY``, a hold's expiry) crosses 00:00 UTC
whenever it runs from 23:00 on, and the ledger then starts a new window: the tenant's used
tokens read 0, not what the test charged. ``steady_clock`` keeps real time's pace but reads
01:00 UTC (on some day) when this module is first imported, so a test has 22 hours of jumps
before the next window starts, at any hour of the day it runs.

Real processes (an operator, workers, a nats-server's ledger) read the real clock: a test of
them that charges runs and then reads the tenant's window finds the usage split at 00:00 UTC.
``pause_before_day_ends`` tells how long to wait so a test starts with ``DAY_END_MARGIN``
seconds of the day left (tests/conftest.py waits so before every test of real processes).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

DAY = 86_400.0
"""Seconds in the default budget window."""

_SHIFT = time.time() % DAY - 3_600.0


def steady_clock() -> float:
    """Epoch seconds (float): the real clock moved back to read 01:00 UTC at import time."""
    return time.time() - _SHIFT


DAY_END_MARGIN = 600.0
"""Seconds of the UTC day a test of real processes needs left when it starts: more than any
such test takes on a slow machine (the longest, the soak and the big tenant, about 2 minutes)."""
MODULE_MARGIN = 900.0
"""Seconds of the UTC day a module of node tests needs left when its first test starts: its
tests share one cluster, whose runs a later test reads the charges of (set-up and tests took
at most 5 minutes in CI); its later tests never wait, which would split those charges."""

REAL_CLOCK_FIXTURES = frozenset({"devenv_launch"})
"""The fixture every fixture starting a real process (nats-server, the control plane, a node,
a stack) takes its log directory from: their ledgers and budget windows follow the real
clock."""


def pause_before_day_ends(now: float, margin: float = DAY_END_MARGIN) -> float:
    """Seconds (≥ 0) to wait at epoch second ``now`` so that at least ``margin`` seconds of
    the default budget window (the UTC day) are left: 0 when they are, else until 1 s into
    the next day."""
    left = DAY - now % DAY
    return left + 1.0 if left < margin else 0.0


def pause_before_test(
    fixturenames: Iterable[str], now: float, *, whole_module: bool, first_in_module: bool
) -> float:
    """Seconds to wait before a test using ``fixturenames`` starts at epoch second ``now``: 0
    for a test of no real process (its clocks are the test's own, none of
    `REAL_CLOCK_FIXTURES`); for a test of a module whose tests share one stack
    (``whole_module``), `MODULE_MARGIN` before its first test and never after; else
    `DAY_END_MARGIN` before each test."""
    if not REAL_CLOCK_FIXTURES & set(fixturenames):
        return 0.0
    if whole_module:
        return pause_before_day_ends(now, MODULE_MARGIN) if first_in_module else 0.0
    return pause_before_day_ends(now)
