"""Resolving a run's ``SERVER/TOOL`` names at admission (pure): the ``RemoteTool`` values its
admitted config carries.

What belongs here: the rule (only allowlisted tools that discovery found, the last good list if
a refresh failed; a model-facing name the OpenAI API accepts) and whether a server was not
looked at yet. What does not: reading the AgentToolServer (``store``), the tenant's
``allowedTools`` (``tenants``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentrun.protocol import RemoteTool
from agentrun.tools import remote

from ..platform.spec import SpecError
from .spec import AgentToolServerSpec, Effect, split_reference

MAX_FUNCTION_NAME = 64
"""Longest function name the OpenAI tools API accepts."""


def resolve_tool(reference: str, server: Mapping[str, Any] | None, *, namespace: str) -> RemoteTool:
    """The ``RemoteTool`` a run gets for ``reference`` (``SERVER/TOOL``), from the
    AgentToolServer object (``None``: it does not exist) in the run's namespace.

    Only allowlisted tools that discovery found are resolved (the last good list if a refresh
    failed). Raises ``SpecError`` naming ``spec.tools`` and the reason otherwise.
    """
    parts = split_reference(reference)
    assert parts is not None
    server_name, tool = parts
    where = f"spec.tools: {reference}"
    if server is None:
        raise SpecError(f"{where}: AgentToolServer {server_name!r} not found in {namespace}")
    try:
        spec = AgentToolServerSpec.of(server.get("spec"))
    except SpecError as err:
        raise SpecError(f"{where}: AgentToolServer {server_name!r} is invalid: {err}") from None
    if spec.effect_of(tool) is None:
        offered = ", ".join(t.name for t in spec.tools) or "none"
        raise SpecError(
            f"{where}: AgentToolServer {server_name!r} does not offer {tool!r} "
            f"(spec.tools: {offered})"
        )
    status = server.get("status") or {}
    found = {t.get("name"): t for t in status.get("tools") or []}
    entry = found.get(tool)
    if entry is None:
        conditions = status.get("conditions") or []
        ready: Mapping[str, Any] = next((c for c in conditions if c.get("type") == "Ready"), {})
        why = ready.get("message") or "its tools have not been discovered yet"
        raise SpecError(f"{where}: not discovered on AgentToolServer {server_name!r}: {why}")
    function = remote.function_name(server_name, tool)
    if len(function) > MAX_FUNCTION_NAME:
        raise SpecError(
            f"{where}: the model-facing name {function} is longer than {MAX_FUNCTION_NAME} "
            "characters; use a shorter AgentToolServer name"
        )
    headers = spec.headers_from
    return RemoteTool(
        name=function,
        server=server_name,
        tool=tool,
        description=str(entry.get("description") or ""),
        parameters=dict(entry.get("inputSchema") or {"type": "object"}),
        effect=spec.effect_of(tool) or Effect.READ,
        url=spec.url,
        transport=spec.transport.value,
        timeout=spec.timeouts.call.seconds,
        headers_secret=headers.secret_ref.name if headers else None,
    )


def is_pending(server: Mapping[str, Any] | None) -> bool:
    """True when an AgentToolServer exists but has not been looked at yet (no condition): a
    run naming it was probably applied together with it and should wait a moment."""
    return server is not None and not (server.get("status") or {}).get("conditions")
