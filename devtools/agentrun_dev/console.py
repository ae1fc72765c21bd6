"""Progress output for the local stack: the `Log` callable type and its default.

Everything in `agentrun_dev` reports what it does through a `Log` passed in by the caller
(the CLI prints to stderr, pytest writes to its terminal reporter). Nothing else belongs here.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

Log = Callable[[str], None]
"""Receives one progress line, without a trailing newline."""


def log_to_stderr(line: str) -> None:
    """Print one progress line to stderr and flush it, so it shows during long steps."""
    print(line, file=sys.stderr, flush=True)


def discard(line: str) -> None:
    """Drop a progress line (for callers that want silence)."""
    del line
