"""An AgentToolServer's ``.status`` (pure): what discovery found, or why it failed.

What belongs here: the status bodies discovery writes (the tools found with their input
schemas, a ``Ready`` condition with a reason, ``lastRefreshTime``) and keeping a condition's
transition time while its status holds. What does not: discovery and the write
(``refresher``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any

from agentrun.tools import remote

from ..platform.conditions import condition, rfc3339
from .spec import AgentToolServerSpec


class Reason(enum.StrEnum):
    """Reasons of the ``Ready`` condition."""

    DISCOVERED = "Discovered"
    """Every allowlisted tool was found."""
    TOOLS_MISSING = "ToolsMissing"
    """The server does not offer some allowlisted tools (the others are usable)."""
    REFRESH_FAILED = "RefreshFailed"
    """The last refresh failed; the last good list is kept and still used."""
    DISCOVERY_FAILED = "DiscoveryFailed"
    """Discovery never succeeded: the server offers no tools to runs."""
    INVALID_SPEC = "InvalidSpec"
    """The spec does not parse."""


def discovered_status(
    spec: AgentToolServerSpec,
    found: Sequence[remote.Discovered],
    *,
    generation: int,
    now: float,
) -> dict[str, Any]:
    """``.status`` after a successful discovery: the allowlisted tools the server offers (in
    allowlist order, with their input schemas), and ``Ready`` saying whether any is missing."""
    by_name = {d.name: d for d in found}
    tools = [
        {
            "name": t.name,
            "effect": t.effect.value,
            "description": by_name[t.name].description,
            "inputSchema": dict(by_name[t.name].input_schema),
        }
        for t in spec.tools
        if t.name in by_name
    ]
    missing = [t.name for t in spec.tools if t.name not in by_name]
    if missing:
        ready = condition(
            "Ready",
            status=False,
            reason=Reason.TOOLS_MISSING,
            message=f"the server does not offer {', '.join(missing)}; it offers "
            f"{', '.join(sorted(by_name)) or 'no tools'}",
            at=now,
            generation=generation,
        )
    else:
        ready = condition(
            "Ready",
            status=True,
            reason=Reason.DISCOVERED,
            message=f"{len(tools)} tool(s) discovered",
            at=now,
            generation=generation,
        )
    return {
        "observedGeneration": generation,
        "lastRefreshTime": rfc3339(now),
        "tools": tools,
        "toolCount": len(tools),
        "conditions": [ready],
    }


def failed_status(
    previous: Mapping[str, Any], error: str, *, generation: int, now: float
) -> dict[str, Any]:
    """``.status`` after a failed discovery: the last good list is kept (and still used)."""
    kept = list(previous.get("tools") or [])
    last = previous.get("lastRefreshTime")
    if last:
        reason = Reason.REFRESH_FAILED
        message = f"{error}; keeping the {len(kept)} tool(s) discovered at {last}"
    else:
        reason, message, kept = Reason.DISCOVERY_FAILED, error, []
    ready = condition(
        "Ready", status=False, reason=reason, message=message, at=now, generation=generation
    )
    return {
        "observedGeneration": generation,
        "lastRefreshTime": last,
        "tools": kept,
        "toolCount": len(kept),
        "conditions": [ready],
    }


def keep_transition(status: dict[str, Any], previous: Mapping[str, Any]) -> dict[str, Any]:
    """``lastTransitionTime`` moves only when the condition's status flips."""
    before = {c.get("type"): c for c in previous.get("conditions") or []}
    for cond in status["conditions"]:
        old = before.get(cond["type"])
        if old is not None and old.get("status") == cond["status"]:
            cond["lastTransitionTime"] = old.get("lastTransitionTime", cond["lastTransitionTime"])
    return status
