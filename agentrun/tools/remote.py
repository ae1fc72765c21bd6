"""Remote tools over MCP: discovery, calls, and the mapping of results and failures.

An ``AgentToolServer`` declares a remote MCP server (streamable HTTP, or SSE for servers that
still need it). The operator discovers its tools (``discover``); a worker calls them
(``McpTool``), always through the official ``mcp`` SDK client, never hand-written protocol code.

A worker's calls go through its ``SessionPool`` (``agentrun.tools.sessions``): one reused
session per server identity, owned by a task of its own, dropped and reopened when the server
restarts or the connection breaks (the call is then sent once more when that is safe). A tool
without a pool, and every discovery, opens its own session and closes it in the same task,
inside one ``async with``. Either way a timeout bounds the whole exchange (connecting and the
handshake included).

Results map to the text the model reads (``render_result``): text content joined by newlines,
images and audio named but not inlined, embedded resources by their text or their URI,
structured content kept (appended as compact JSON unless the text already is that JSON). An
``isError`` result is an error the model caused (``ToolFault.REJECTED``), and so is an HTTP
4xx answer other than 408 and 429 (the request was refused: the model reads the status and may
correct the call); a 5xx, 408 or 429 answer and a failure to reach or talk to the server are
infrastructure faults (``fault_of``).

What does not belong here: reading Secrets (the caller resolves headers), the allowlist and the
tenant's policy (the operator), retries and the result byte cap (the worker's tool runner).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import http
import json
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

import httpx2

from agentrun import peers
from agentrun.kernel import ToolFault, schemas
from agentrun.protocol import RemoteTool

from . import catalog
from .endpoint import (
    CALL_REF_KEY,
    CONNECTION_LOST,
    STATUSES,
    Endpoint,
    Transport,
    mcp_error_code,
    open_session,
    root_cause,
)
from .sessions import Loss, SessionLost, SessionPool

if TYPE_CHECKING:  # loaded on first use (``endpoint.load_sdk``)
    from mcp.types import CallToolResult, RequestParamsMeta

__all__ = [
    "IDEMPOTENCY_META_KEY",
    "Discovered",
    "Endpoint",
    "HeaderSource",
    "McpTool",
    "RemoteError",
    "SessionPool",
    "Transport",
    "discover",
    "fault_of",
    "function_name",
    "mcp_tool",
    "never_sent",
    "render_result",
    "spec_of",
    "status_fault",
]

IDEMPOTENCY_META_KEY = "agentrun.dev/idempotencyKey"
"""The request ``_meta`` key carrying ``<run-uid>:<call-id>`` on write and idempotent calls."""
SEPARATOR = "__"
"""Joins server and tool in the function name the model sees (``SERVER__TOOL``)."""
MAX_DISCOVERED_PAGES = 20
"""Pages of ``tools/list`` read at most (a server that pages for ever is cut off)."""
MAX_DISCOVERED_FOOTPRINT = 8 * 2**20
"""The most bytes the tools of one server may take as discovery keeps them, in all, over every
page: their input schemas parsed (``schemas.footprint``), their names and their descriptions
as kept (``MAX_DESCRIPTION_CHARS`` each): what discovery holds in the operator's memory until
it writes the status. Past it the discovery fails; a list of a few hundred tools with rich
schemas takes a few megabytes. Descriptions counted nothing, and were kept whole: one server
listing 20 pages of one tool with an 8 MiB description made its discovery hold 160 MiB, and a
tenant's 8 discoveries at once (``PER_TENANT``) over a gigabyte."""
MAX_DESCRIPTION_CHARS = 4_096
"""Characters of a tool's description kept (the status keeps no more: the model reads it in
every request); the rest is cut as each page arrives."""


class ToolListTooLarge(Exception):
    """The tools a server listed take more than ``MAX_DISCOVERED_FOOTPRINT`` bytes as kept."""


_INVALID_PARAMS = -32602
_METHOD_NOT_FOUND = -32601


@dataclasses.dataclass(frozen=True, slots=True)
class Discovered:
    """A tool the server lists."""

    name: str
    description: str
    input_schema: Mapping[str, Any]
    """The JSON Schema of its arguments object, as the server gives it."""


class RemoteError(Exception):
    """The server could not be reached or failed; ``fault`` classifies it."""

    def __init__(self, message: str, *, fault: ToolFault) -> None:
        super().__init__(message)
        self.message = message
        self.fault = fault


def function_name(server: str, tool: str) -> str:
    """The function name the model sees for ``tool`` of AgentToolServer ``server``."""
    return f"{server}{SEPARATOR}{tool}"


_CONNECTION_ERRORS = (*CONNECTION_LOST, OSError)


def status_fault(status: int) -> ToolFault:
    """The fault of an HTTP error answer, by its status alone: a 4xx other than 408 and 429
    is the request's own fault (``rejected``: the model reads it and may correct the call —
    the documented rule for MCP and HTTP tools); 408 is a ``timeout``, 429 and 5xx a fault of
    the ``server`` (retried for read and idempotent tools)."""
    if status == 408:
        return ToolFault.TIMEOUT
    if 400 <= status < 500 and status != 429:
        return ToolFault.REJECTED
    return ToolFault.SERVER


def fault_of(exc: BaseException, *, status: int | None = None) -> ToolFault:
    """The fault of a failed exchange: by the HTTP ``status`` of the call's answer when it was
    an error (``status_fault``); else ``timeout``; ``connection`` (refused, reset, dropped);
    ``server`` (a JSON-RPC error other than bad parameters); ``arguments`` (the server refused
    the arguments: JSON-RPC invalid params); ``transport`` (anything else, e.g. an unreadable
    response, a terminated session)."""
    if isinstance(exc, SessionLost):
        return ToolFault.TRANSPORT if exc.loss is Loss.REFUSED else ToolFault.CONNECTION
    cause = root_cause(exc)
    if status is None and isinstance(cause, httpx2.HTTPStatusError):
        status = cause.response.status_code
    if status is not None:
        return status_fault(status)
    if isinstance(cause, TimeoutError | httpx2.TimeoutException):
        return ToolFault.TIMEOUT
    code = mcp_error_code(cause)
    if code is not None:
        if code == _INVALID_PARAMS:
            return ToolFault.ARGUMENTS
        return ToolFault.TRANSPORT if code == _METHOD_NOT_FOUND else ToolFault.SERVER
    if isinstance(cause, _CONNECTION_ERRORS):
        return ToolFault.CONNECTION
    return ToolFault.TRANSPORT


def never_sent(exc: BaseException) -> bool:
    """Whether the failed exchange ``exc`` cannot have reached the tool: the connection could
    not be opened, or the server refused the request unread (HTTP 404 for a session id it no
    longer knows). Anything else — a reset, a timeout, an error answer — may have come after
    the tool ran."""
    if isinstance(exc, SessionLost):
        return exc.loss is Loss.REFUSED
    return isinstance(root_cause(exc), httpx2.ConnectError)


CAUSE_CHARS = 300
"""Most characters of a failed exchange's innermost cause its message keeps (the server's
words, which reach a status, the model and the run's events)."""


def _describe(
    exc: BaseException, *, redact: Callable[[str], str], status: int | None = None
) -> str:
    """What failed, for a ``RemoteError`` or a ``catalog.ToolError``: the HTTP status when
    there was one, else the innermost cause's type and text, ``redact``-ed *before* it is cut
    to ``CAUSE_CHARS`` (a credential the cut split would no longer be found whole)."""
    if isinstance(exc, SessionLost):
        return redact(f"MCP session lost: {exc}")
    cause = root_cause(exc)
    if status is None and isinstance(cause, httpx2.HTTPStatusError):
        status = cause.response.status_code
    if status is not None:
        try:
            phrase = f" {http.HTTPStatus(status).phrase}"
        except ValueError:
            phrase = ""
        kind = (
            "the request was refused" if status_fault(status) is ToolFault.REJECTED else "a fault"
        )
        return f"the MCP server answered HTTP {status}{phrase} ({kind})"
    if isinstance(cause, TimeoutError):
        return "no answer in time"
    text = redact(str(cause) or type(cause).__name__)
    return f"{type(cause).__name__}: {text[:CAUSE_CHARS]}"


async def discover(endpoint: Endpoint) -> list[Discovered]:
    """Every tool the server lists, within ``endpoint.timeout`` seconds in all (a hard bound:
    connect, handshake and every page).

    Each description is kept to ``MAX_DESCRIPTION_CHARS``. Raises ``RemoteError`` (with its
    fault) when the server cannot be reached, fails, does not answer in time, or lists tools
    that take more than ``MAX_DISCOVERED_FOOTPRINT`` bytes as kept, in all.
    """
    found: list[Discovered] = []
    try:
        async with asyncio.timeout(endpoint.timeout), open_session(endpoint) as client:
            cursor: str | None = None
            held = 0
            for _ in range(MAX_DISCOVERED_PAGES):
                page = await client.list_tools(cursor=cursor, cache_mode="refresh")
                kept = [
                    Discovered(t.name, clip_description(t.description), dict(t.input_schema))
                    for t in page.tools
                ]
                held += sum(_kept_bytes(tool) for tool in kept)
                if held > MAX_DISCOVERED_FOOTPRINT:
                    raise ToolListTooLarge(
                        f"its tools' input schemas, names and descriptions take over "
                        f"{MAX_DISCOVERED_FOOTPRINT} bytes as kept"
                    )
                found.extend(kept)
                cursor = page.next_cursor
                del page, kept  # the next page is read with this one's tools as kept alone
                if cursor is None:
                    break
    except Exception as err:
        why = _describe(err, redact=endpoint.redact)  # the server's words may quote them
        raise RemoteError(
            f"MCP server {endpoint.url} unavailable: {why}", fault=fault_of(err)
        ) from err
    return found


def clip_description(description: str | None) -> str:
    """A tool's description as kept: ``MAX_DESCRIPTION_CHARS`` at most, a longer one cut and
    ended with ``…``."""
    text = description or ""
    if len(text) <= MAX_DESCRIPTION_CHARS:
        return text
    return text[: MAX_DESCRIPTION_CHARS - 1] + "…"


def _kept_bytes(tool: Discovered) -> int:
    """What discovery holds of ``tool``, about: its input schema parsed, its name and its
    description (as kept)."""
    return schemas.footprint(tool.input_schema) + len(tool.name) + len(tool.description)


def _size_of(data: str) -> int:
    try:
        return len(base64.b64decode(data, validate=False))
    except (binascii.Error, ValueError):
        return len(data)


def _block_text(block: Any) -> str:
    kind = getattr(block, "type", "")
    if kind == "text":
        return str(block.text)
    if kind in ("image", "audio"):
        return f"[{kind} {block.mime_type}, {_size_of(block.data)} bytes, not shown]"
    if kind == "resource":
        resource = block.resource
        text = getattr(resource, "text", None)
        if isinstance(text, str):
            return text
        blob = getattr(resource, "blob", "")
        return f"[resource {resource.uri} ({resource.mime_type}), {_size_of(blob)} bytes]"
    if kind == "resource_link":
        return f"[resource link {block.uri}]"
    return f"[{kind or 'unknown'} content, not shown]"


def render_result(result: CallToolResult) -> str:
    """The text the model reads for ``result`` (see the module docstring)."""
    text = "\n".join(_block_text(block) for block in result.content)
    structured = result.structured_content
    if structured is None:
        return text
    try:
        parsed: Any = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's stack
        parsed = text
    # the SDK wraps a tool's non-object return value as {"result": value}
    same = structured in (parsed, {"result": parsed})
    if same:
        return text
    compact = json.dumps(structured, separators=(",", ":"), sort_keys=True, default=str)
    return f"{text}\n{compact}" if text else compact


HeaderSource = Callable[[], Awaitable[Mapping[str, str]]]
"""Reads the headers to send (e.g. from a Secret) at call time; raises ``catalog.ToolError``
when it cannot."""


@dataclasses.dataclass(frozen=True, slots=True)
class McpTool:
    """One allowlisted tool of an MCP server, callable by the worker (``catalog.Tool``)."""

    spec: catalog.ToolSpec
    """Its function name (``SERVER__TOOL``), description, real input schema and effect."""
    tool: str
    """The tool's own name on the server."""
    endpoint: Endpoint
    headers: HeaderSource | None = None
    """Headers added to ``endpoint.headers`` at each call."""
    pool: SessionPool | None = None
    """The worker's pooled sessions (``None``: a session of its own per call)."""
    server: str = ""
    """Its AgentToolServer's name: what the SDK logs while calling it (in the call's task and
    in the tasks of a session it opens) counts against the peer ``<namespace>/<server>``
    (``peers.serving``, the call's namespace)."""

    async def run(self, arguments: Mapping[str, Any], ctx: catalog.ToolContext) -> str:
        """Call the tool once, on a pooled session (sent once more on a new session when the
        pooled one was lost and ``sessions.may_resend`` allows it) or on a session of its own;
        returns the rendered result, within ``endpoint.timeout`` seconds in all.

        Write and idempotent calls carry ``<run-uid>:<call-id>`` in the request's ``_meta``
        (``IDEMPOTENCY_META_KEY``); every call carries its own reference (``CALL_REF_KEY``),
        by which the HTTP status of an error answer is found. Raises ``catalog.ToolError``:
        ``rejected`` for an ``isError`` result (its text), else the exchange's fault
        (``fault_of``, by the status when there was one), the message naming the status.
        """
        endpoint = self.endpoint
        if self.headers is not None:
            extra = await self.headers()
            endpoint = dataclasses.replace(endpoint, headers={**endpoint.headers, **extra})
        ref = uuid.uuid4().hex  # finds the HTTP status of an error answer (``STATUSES``)
        keys = {CALL_REF_KEY: ref}
        if self.spec.effect != "read":  # an open map: extra keys are allowed
            keys[IDEMPOTENCY_META_KEY] = f"{ctx.run_uid}:{ctx.call_id}"
        meta = cast("RequestParamsMeta", keys)
        try:
            with peers.serving(ctx.namespace, self.server):
                result = await self._call(endpoint, dict(arguments), meta, ctx.namespace)
        except Exception as err:
            status = STATUSES.pop(ref)
            raise catalog.ToolError(
                f"{self.spec.name}: {_describe(err, redact=endpoint.redact, status=status)}",
                fault=fault_of(err, status=status),
                unsent=never_sent(err),
            ) from None
        text = endpoint.redact(render_result(result))  # the model and the events see it
        if result.is_error:
            raise catalog.ToolError(text or "the tool reported an error", fault=ToolFault.REJECTED)
        return text

    async def _call(
        self, endpoint: Endpoint, arguments: dict[str, Any], meta: RequestParamsMeta, scope: str
    ) -> CallToolResult:
        """One ``tools/call`` with ``arguments``: on a session of the pool's in ``scope`` (the
        run's namespace), or on one of its own. Raises what ``SessionPool.call_tool`` or the
        SDK raises."""
        if self.pool is not None:
            return await self.pool.call_tool(
                endpoint, self.tool, arguments, meta=meta, effect=self.spec.effect, scope=scope
            )
        async with asyncio.timeout(endpoint.timeout), open_session(endpoint) as client:
            return await client.call_tool(self.tool, arguments, meta=meta)


def spec_of(tool: RemoteTool) -> catalog.ToolSpec:
    """The declaration of an admitted MCP tool: its function name, the server's description
    and input schema, its effect. Never pollable (the no-progress breaker watches it)."""
    effect: catalog.Effect = "read"
    if tool.effect in ("idempotent", "write"):
        effect = "idempotent" if tool.effect == "idempotent" else "write"
    return catalog.ToolSpec(
        name=tool.name,
        description=tool.description or f"Tool {tool.tool} of MCP server {tool.server}.",
        parameters=tool.parameters,
        effect=effect,
        pollable=False,
        timeout=tool.timeout,
    )


def mcp_tool(
    tool: RemoteTool, *, headers: HeaderSource | None = None, pool: SessionPool | None = None
) -> McpTool:
    """The callable tool of an admitted MCP tool; ``headers`` (when given) are read at each
    call and sent with every request; ``pool`` (when given) holds the sessions it calls on."""
    endpoint = Endpoint(
        tool.url,
        Transport(tool.transport),
        timeout=tool.timeout,
        private_network=tool.private_network,
        path_prefix=tool.path_prefix,
    )
    return McpTool(spec_of(tool), tool.tool, endpoint, headers, pool, tool.server)
