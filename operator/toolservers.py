"""AgentToolServers: remote MCP servers whose tools AgentRuns may call as ``SERVER/TOOL``.

What belongs here: the shape of ``AgentToolServer.spec``; the ``.status`` discovery of each
server's tools writes (the tools found with their input schemas, a ``Ready`` condition with
a reason, ``lastRefreshTime``); and the resolution of a run's ``SERVER/TOOL`` names into the
``RemoteTool`` values its admitted config carries.

Discovery itself runs in its own background loop (``toolrefresh.ToolServerRefresher``), which
writes the status bodies built here.

What does not: calling tools (the worker), the tenant's ``allowedTools`` (``tenancy``).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import Field

from agentrun import kube
from agentrun.protocol import RemoteTool
from agentrun.tools import remote

from .admission import InvalidSpec
from .specs import Duration, DurationField, SpecError, SpecModel, parse
from .status import condition, rfc3339

log = logging.getLogger(__name__)

TOOL_SERVERS = "agenttoolservers"
REFERENCE = "/"
"""Separates server and tool in ``AgentRun.spec.tools`` (``SERVER/TOOL``)."""
MAX_FUNCTION_NAME = 64
"""Longest function name the OpenAI tools API accepts."""
SERVER_CACHE_SECONDS = 5.0
"""How long admission reuses an AgentToolServer read (a burst of runs reads it once)."""


class Effect(enum.StrEnum):
    """``spec.tools[].effect``: what calling the tool does."""

    READ = "read"
    IDEMPOTENT = "idempotent"
    WRITE = "write"


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


class OfferedTool(SpecModel):
    """``spec.tools[]``: one allowlisted tool."""

    name: str
    effect: Effect = Effect.READ


class SecretName(SpecModel):
    """``spec.headersFrom.secretRef``."""

    name: str


class HeadersFrom(SpecModel):
    """``spec.headersFrom``."""

    secret_ref: SecretName = Field(alias="secretRef")


class Timeouts(SpecModel):
    """``spec.timeouts``."""

    discovery: DurationField = Field(default_factory=lambda: Duration.parse("10s"))
    call: DurationField = Field(default_factory=lambda: Duration.parse("30s"))


class AgentToolServerSpec(SpecModel):
    """``AgentToolServer.spec``. Parse with ``AgentToolServerSpec.of``."""

    url: str
    transport: remote.Transport = remote.Transport.STREAMABLE_HTTP
    headers_from: HeadersFrom | None = Field(default=None, alias="headersFrom")
    timeouts: Timeouts = Field(default_factory=Timeouts)
    refresh_interval: DurationField = Field(
        default_factory=lambda: Duration.parse("5m"), alias="refreshInterval"
    )
    tools: tuple[OfferedTool, ...] = ()

    @classmethod
    def of(cls, spec: Mapping[str, Any] | None) -> AgentToolServerSpec:
        """Parse an AgentToolServer's spec; raises ``SpecError`` naming the field."""
        return parse(cls, spec, where="spec")

    def effect_of(self, tool: str) -> Effect | None:
        """The allowlisted tool's effect, or ``None`` when it is not allowlisted."""
        return next((t.effect for t in self.tools if t.name == tool), None)


# --- status ---------------------------------------------------------------------------------


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


# --- resolution at admission ----------------------------------------------------------------


def split_reference(name: str) -> tuple[str, str] | None:
    """``("server", "tool")`` for a ``SERVER/TOOL`` name, ``None`` for a built-in tool."""
    if REFERENCE not in name:
        return None
    server, _, tool = name.partition(REFERENCE)
    return server, tool


def resolve_tool(reference: str, server: Mapping[str, Any] | None, *, namespace: str) -> RemoteTool:
    """The ``RemoteTool`` a run gets for ``reference`` (``SERVER/TOOL``), from the
    AgentToolServer object (``None``: it does not exist) in the run's namespace.

    Only allowlisted tools that discovery found are resolved (the last good list if a refresh
    failed). Raises ``InvalidSpec`` naming ``spec.tools`` and the reason otherwise.
    """
    parts = split_reference(reference)
    assert parts is not None
    server_name, tool = parts
    where = f"spec.tools: {reference}"
    if server is None:
        raise InvalidSpec(f"{where}: AgentToolServer {server_name!r} not found in {namespace}")
    try:
        spec = AgentToolServerSpec.of(server.get("spec"))
    except SpecError as err:
        raise InvalidSpec(f"{where}: AgentToolServer {server_name!r} is invalid: {err}") from None
    if spec.effect_of(tool) is None:
        offered = ", ".join(t.name for t in spec.tools) or "none"
        raise InvalidSpec(
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
        raise InvalidSpec(f"{where}: not discovered on AgentToolServer {server_name!r}: {why}")
    function = remote.function_name(server_name, tool)
    if len(function) > MAX_FUNCTION_NAME:
        raise InvalidSpec(
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


def function_names(names: Sequence[str]) -> tuple[str, ...]:
    """The names the model (and the kernel) use for ``spec.tools``-style names: built-in names
    unchanged, ``SERVER/TOOL`` as ``SERVER__TOOL``."""
    out = []
    for name in names:
        parts = split_reference(name)
        out.append(name if parts is None else remote.function_name(*parts))
    return tuple(out)


def is_pending(server: Mapping[str, Any] | None) -> bool:
    """True when an AgentToolServer exists but has not been looked at yet (no condition): a
    run naming it was probably applied together with it and should wait a moment."""
    return server is not None and not (server.get("status") or {}).get("conditions")


class ToolServerCache:
    """AgentToolServers by (namespace, name), each read at most once per
    ``SERVER_CACHE_SECONDS``."""

    def __init__(
        self, api: client.ApiClient | None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """``api`` ``None`` (no API server) finds no server."""
        self._objects = client.CustomObjectsApi(api) if api is not None else None
        self._clock = clock
        self._cache: dict[tuple[str, str], tuple[float, dict[str, Any] | None]] = {}

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The AgentToolServer object or ``None``; raises ``ApiException`` on other errors."""
        if self._objects is None:
            return None
        now = self._clock()
        hit = self._cache.get((namespace, name))
        if hit is not None and hit[0] > now:
            return hit[1]
        try:
            found: dict[str, Any] | None = await self._objects.get_namespaced_custom_object(
                kube.GROUP, kube.VERSION, namespace, TOOL_SERVERS, name
            )
        except ApiException as err:
            if err.status != 404:
                raise
            found = None
        if found is not None and is_pending(found):
            self._cache.pop((namespace, name), None)  # read again soon
        else:
            self._cache[(namespace, name)] = (now + SERVER_CACHE_SECONDS, found)
        return found
