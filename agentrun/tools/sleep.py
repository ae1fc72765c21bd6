"""`sleep`: wait a given number of seconds (for latency, ordering and cancellation tests)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from . import catalog

__all__ = ["SPEC", "Sleep"]

MAX_SECONDS = 30

SPEC = catalog.ToolSpec(
    name="sleep",
    description=f"Wait the given number of seconds (0 to {MAX_SECONDS}), then say so.",
    parameters=catalog.object_schema(
        {
            "seconds": {
                "type": "number",
                "minimum": 0,
                "maximum": MAX_SECONDS,
                "description": "How long to wait, in seconds (fractions allowed).",
            },
        },
        required=["seconds"],
    ),
    effect="read",
    pollable=True,
)


class Sleep:
    """The `sleep` tool; cancellable (the asyncio sleep is the only await)."""

    spec = SPEC

    async def run(self, arguments: Mapping[str, Any], ctx: catalog.ToolContext) -> str:
        """Sleep ``arguments["seconds"]`` (clamped to 0..MAX_SECONDS); returns "slept 1.5s"."""
        seconds = min(max(float(arguments["seconds"]), 0.0), MAX_SECONDS)
        await asyncio.sleep(seconds)
        return f"slept {seconds:g}s"
