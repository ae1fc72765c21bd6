"""Prometheus metric objects (names are public API, DESIGN.md §6).

Only the metrics the code records today are defined here; each is recorded at one place.
Labels are bounded: tenant, model, tool, reason, outcome, phase — never run names or ids.
"""

from __future__ import annotations

from prometheus_client import Counter

TURNS = Counter(
    "agentrun_turns",
    "Turns committed by this worker (one model call and its tool batch, or a budget stop).",
    ["tenant"],
)
"""Exposed as ``agentrun_turns_total{tenant}``."""
