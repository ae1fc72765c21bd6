"""An AgentToolServer's ``.status`` (pure): what discovery found, or why it failed.

What belongs here: the status bodies discovery writes (the tools found with their input
schemas, a ``Ready`` condition with a reason, ``lastRefreshTime``), what the platform accepts
of a server's tool (an input schema it can check in bounded time, ``schemas.schema_problem``;
a description and a status of bounded size), and keeping a condition's transition time while
its status holds. What does not: discovery and the write (``refresher``).

The server is untrusted: it chooses its tools' descriptions and schemas. A tool whose schema
the platform cannot use (a pattern RE2 refuses, too large or deep, invalid) is left out of
``status.tools`` — runs naming it are refused, as for a tool the server does not offer — and
the condition says which and why (reason ``ToolsUnusable``), instead of a crash or a check
that freezes a worker.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from typing import Any

from agentrun.kernel import schemas
from agentrun.tools import remote

from ..platform.conditions import condition, rfc3339
from ..platform.spec import with_hints
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
    NOT_ALLOWED = "NotAllowed"
    """Its tenant's ``spec.toolServers`` rules do not allow its URL (or its namespace has no
    tenant): the server is never contacted and offers no tools."""
    TOOLS_UNUSABLE = "ToolsUnusable"
    """The server offers some allowlisted tools with an input schema the platform cannot use
    (the others are usable)."""


MAX_DESCRIPTION_CHARS = remote.MAX_DESCRIPTION_CHARS
"""Characters of a tool's description kept (the model reads it in every request; discovery
keeps no more)."""
MAX_SCHEMAS_BYTES = 524_288
"""Bytes of input schemas (compact JSON) one status may hold; tools past it are unusable. With
``schemas.MAX_SCHEMA_BYTES`` per tool, the status stays far below the API server's object
limit (1.5 MiB in etcd) whatever a server lists."""


def _usable(
    spec: AgentToolServerSpec, by_name: Mapping[str, remote.Discovered]
) -> tuple[list[dict[str, Any]], list[str]]:
    """The allowlisted tools the server offers that the platform can use, as status entries,
    and why each of the others cannot be used (``NAME: reason``)."""
    tools: list[dict[str, Any]] = []
    refused: list[str] = []
    room = MAX_SCHEMAS_BYTES
    for t in spec.tools:
        found = by_name.get(t.name)
        if found is None:
            continue
        schema = dict(found.input_schema)
        problem = schemas.known_problem(schema)
        size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False).encode())
        if problem is None and size > room:
            problem = f"no room left in the status for its {size}-byte schema"
        if problem is not None:
            refused.append(f"{t.name}: inputSchema {problem}")
            continue
        room -= size
        description = remote.clip_description(found.description)
        tools.append(
            {
                "name": t.name,
                "effect": t.effect.value,
                "description": description,
                "inputSchema": schema,
            }
        )
    return tools, refused


def discovered_status(
    spec: AgentToolServerSpec,
    found: Sequence[remote.Discovered],
    *,
    generation: int,
    now: float,
) -> dict[str, Any]:
    """``.status`` after a successful discovery: the allowlisted tools the server offers that
    the platform can use (in allowlist order, with their input schemas), and ``Ready`` saying
    whether any is missing or unusable (and why). Checking the schemas takes bounded but real
    CPU: call it off the event loop."""
    by_name = {d.name: d for d in found}
    tools, refused = _usable(spec, by_name)
    missing = [t.name for t in spec.tools if t.name not in by_name]
    if missing:
        offers = ", ".join(sorted(by_name)[:50]) or "no tools"
        reason = Reason.TOOLS_MISSING
        message = f"the server does not offer {with_hints(missing, by_name)}; it offers {offers}"
        message += "".join(f"; unusable: {why}" for why in refused)
    elif refused:
        reason = Reason.TOOLS_UNUSABLE
        message = f"{len(tools)} tool(s) usable; the platform cannot use " + "; ".join(refused)
    else:
        reason, message = Reason.DISCOVERED, f"{len(tools)} tool(s) discovered"
    ready = condition(
        "Ready",
        status=reason is Reason.DISCOVERED,
        reason=reason,
        message=message,
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


def refused_status(why: str, *, generation: int, now: float) -> dict[str, Any]:
    """``.status`` of a server its tenant does not allow (``Reason.NOT_ALLOWED``): no tools,
    nothing contacted."""
    ready = condition(
        "Ready", status=False, reason=Reason.NOT_ALLOWED, message=why, at=now, generation=generation
    )
    return {"observedGeneration": generation, "tools": [], "toolCount": 0, "conditions": [ready]}


def keep_transition(status: dict[str, Any], previous: Mapping[str, Any]) -> dict[str, Any]:
    """``lastTransitionTime`` moves only when the condition's status flips."""
    before = {c.get("type"): c for c in previous.get("conditions") or []}
    for cond in status["conditions"]:
        old = before.get(cond["type"])
        if old is not None and old.get("status") == cond["status"]:
            cond["lastTransitionTime"] = old.get("lastTransitionTime", cond["lastTransitionTime"])
    return status
