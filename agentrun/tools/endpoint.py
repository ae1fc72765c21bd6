"""How the worker and the operator reach an MCP server: its ``Endpoint`` and one client session
opened on it with the official ``mcp`` SDK (streamable HTTP, or SSE for servers that still
need it).

Every connection of a session is checked against the tenant's address rule
(``reach.CheckedBackend``: resolved once, non-global addresses refused unless the rule allows
private networks, connected to the checked addresses only), and every request against the URL
rule that allowed the endpoint (``Bounds``): the endpoint's scheme, host and port, a path under
the rule's prefix. A request outside them is never sent (``OutsideRule``) and ends the session
at once — an SSE server names the URL its session's messages go to (its ``endpoint`` event),
which the SDK checks only for the origin. Redirects are never followed: the SDK follows a
same-origin one itself, so the transport answers any 3xx with an error (``Redirected``), never
a request to another path or host. No answer is read past ``MAX_MESSAGE_BYTES`` a message (an
SSE session's events, ``SSE_EVENT_BYTES``), nor past ``MAX_MESSAGE_VALUES`` JSON values a
message, nor compressed.

What does not belong here: reusing sessions (``sessions``), mapping results and faults
(``remote``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import hashlib
import importlib
import json
import sys
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import anyio
import cachetools
import httpcore2
import httpx2

from agentrun import display

from . import eventstream, heads, reach

if TYPE_CHECKING:  # loaded on first use: see ``load_sdk``
    from mcp import Client

__all__ = [
    "CALL_REF_KEY",
    "STATUSES",
    "Bounds",
    "CheckedTransport",
    "Endpoint",
    "FaultHook",
    "HttpStatuses",
    "OutsideRule",
    "ResponseHook",
    "StreamEnded",
    "Transport",
    "WatchedReads",
    "load_sdk",
    "mcp_error_code",
    "open_session",
    "root_cause",
    "trust_no_output_schema",
]

SDK_MODULES = ("mcp", "mcp.client.sse", "mcp.client.streamable_http")
"""The parts of the ``mcp`` SDK a session uses."""


async def load_sdk() -> None:
    """Import the ``mcp`` SDK unless it is loaded, in a thread. It is loaded on first use:
    with the server stack it imports (uvicorn, starlette) it takes about 27 MB and 0.4 s of
    CPU, which a process that never reaches an MCP server does not pay; the thread keeps the
    first caller's event loop turning meanwhile."""
    if all(name in sys.modules for name in SDK_MODULES):
        return
    await asyncio.to_thread(lambda: [importlib.import_module(name) for name in SDK_MODULES])


def mcp_error_code(exc: BaseException | None) -> int | None:
    """The JSON-RPC error code of an ``mcp.MCPError``; ``None`` for any other exception (an
    ``MCPError`` only comes from the SDK, so an unloaded SDK means there is none)."""
    sdk = sys.modules.get("mcp")
    if sdk is None or not isinstance(exc, sdk.MCPError):
        return None
    return int(exc.code)


class Transport(enum.StrEnum):
    """How the MCP server is reached (``AgentToolServer.spec.transport``)."""

    STREAMABLE_HTTP = "StreamableHTTP"
    SSE = "SSE"


@dataclasses.dataclass(frozen=True, slots=True)
class Endpoint:
    """How to reach one MCP server."""

    url: str
    transport: Transport = Transport.STREAMABLE_HTTP
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Sent with every request (e.g. ``Authorization``); never logged or echoed."""
    timeout: float = 30.0
    """Seconds one exchange (connect, handshake and the request) may take in all."""
    private_network: bool = False
    """Whether the host may resolve to private, loopback or link-local addresses (its tenant's
    rule for the URL, ``AgentTenant.spec.toolServers.allow[].privateNetwork``); every
    connection is checked so (``reach.CheckedBackend``)."""
    path_prefix: str = "/"
    """The path every request of a session must stay under (the same rule's ``pathPrefix``;
    ``/``: anywhere on the URL's origin); every request is checked so (``Bounds``)."""

    @property
    def bounds(self) -> Bounds:
        """Where this endpoint's sessions may send requests."""
        return Bounds(self.url, self.path_prefix)

    def redact(self, text: str) -> str:
        """``text`` without the values of ``headers``, nor any whitespace-separated part of
        one of at least 8 characters (the token of ``Bearer <token>``): what the server sends
        back in an error or a result reaches a status, the model and the run's events."""
        secrets = {value for value in self.headers.values() if value}
        secrets |= {part for value in secrets for part in display.secret_parts(value)}
        return display.redact(text, display.by_length(secrets))

    def identity(self) -> tuple[str, str, float, str, bool, str]:
        """The pool key: URL, transport, timeout, a SHA-256 digest of the headers (names
        and values), so the values themselves are never kept or logged, and the rule (its
        address rule and path prefix)."""
        canonical = "\n".join(f"{k.lower()}:{v}" for k, v in sorted(self.headers.items()))
        digest = hashlib.sha256(canonical.encode()).hexdigest()[:16]
        return (
            self.url,
            self.transport.value,
            self.timeout,
            digest,
            self.private_network,
            self.path_prefix,
        )


ROUTING_HEADERS = frozenset(
    {
        "host",
        "forwarded",
        "x-forwarded-host",
        "x-forwarded-for",
        "x-forwarded-proto",
        "x-forwarded-port",
        "x-forwarded-prefix",
        "x-forwarded-path",
        "x-forwarded-uri",
        "x-forwarded-server",
        "x-forwarded-scheme",
        "x-original-url",
        "x-original-uri",
        "x-original-host",
        "x-rewrite-url",
        "x-host",
        "x-http-method-override",
        "x-http-method",
        "x-method-override",
        "x-envoy-original-path",
    }
)
"""Headers by which a reverse proxy, an ingress or a framework chooses where a request goes (a
virtual host, a path, a method) other than by its URL: on a gateway shared by tenants, one of
them would send a session to another tenant's server whatever its tenant's rule for the URL
allows. No request carries one (``Bounds.header_refusal``); ``Host`` only as the URL's own."""
FRAMING_HEADERS = frozenset(
    {
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
        "expect",
        "accept-encoding",
        "content-encoding",
        "content-type",
        "accept",
        "mcp-session-id",
        "mcp-protocol-version",
        "last-event-id",
    }
)
"""Headers the HTTP client or the MCP transport sets itself (how a message is framed, coded,
typed, which session it belongs to): not a tenant's to send."""


def reserved_header(name: str) -> str | None:
    """Why ``name`` may not be a header a tenant's Secret gives
    (``AgentToolServer.spec.headersFrom.keys``), or ``None`` when it may."""
    lowered = name.strip().lower()
    if lowered in ROUTING_HEADERS:
        return f"{name} routes a request elsewhere than its URL (a shared gateway obeys it)"
    if lowered in FRAMING_HEADERS:
        return f"{name} is set by the HTTP client or the MCP transport, not by a Secret"
    return None


class OutsideRule(httpx2.TransportError):
    """A request of a session was for a URL outside its endpoint's ``Bounds`` (e.g. an SSE
    server's ``endpoint`` event naming another path): it was never sent."""


@dataclasses.dataclass(frozen=True, slots=True)
class Bounds:
    """Where the requests of a session may go: the scheme, host and port of ``url`` (the
    endpoint's), a path under ``path_prefix`` (``reach.outside_prefix``)."""

    url: str
    path_prefix: str = "/"

    def header_refusal(self, request: httpx2.Request) -> str | None:
        """Why ``request``'s headers may not be sent, or ``None``: a ``Host`` other than its
        URL's authority, or any of ``ROUTING_HEADERS`` (a shared gateway would route by it,
        not by the URL ``refusal`` checked)."""
        host = request.headers.get("host")
        if host is not None and host.strip().lower() != request.url.netloc.decode().lower():
            return f"its Host header {host[:100]!r} is not the host of {self.url}"
        routing = sorted(n for n in request.headers if n.lower() in ROUTING_HEADERS - {"host"})
        if routing:
            return f"it carries {', '.join(routing)[:200]}, which would route it elsewhere"
        return None

    def refusal(self, url: httpx2.URL) -> str | None:
        """Why a request for ``url`` may not be sent, or ``None`` when it may."""
        origin = httpx2.URL(self.url)
        if (url.scheme, url.host, url.port) != (origin.scheme, origin.host, origin.port):
            return f"{url.scheme}://{url.netloc.decode()} is not the origin of {self.url}"
        raw_path = url.raw_path.partition(b"?")[0].decode("ascii", "replace")
        why = reach.outside_prefix(raw_path, self.path_prefix)
        if why is None:
            return None
        return f"{raw_path[:200]!r} is outside the tenant's rule for {self.url}: {why}"


MAX_MESSAGE_BYTES = 8 * 1024 * 1024
"""The most bytes one message from a tool server may take (a JSON body, or one event of an
event stream: its bytes up to the empty line that ends it, ``eventstream``). A tenant's server
answering a bigger one (a ``tools/list`` of 150 MiB) would otherwise be read whole into the
operator's or a worker's memory, every time it is asked; past this the response fails as a
transport fault. A tool's result is cut much shorter anyway (``MAX_RESULT_BYTES`` of the
worker's runner)."""


SSE_EVENT_BYTES = 1024 * 1024
"""The most bytes one event of an SSE session's stream may take: the MCP SDK's own limit for
that transport (``mcp.client.sse.sse_client`` takes none, so its ``EventSource`` keeps
``httpx2``'s default), held by the transport first so that a bigger event fails as every
other message over a bound does (``StreamTooLarge``, naming it) rather than as the SDK's
``SSEError``. A streamable HTTP session's events are given ``MAX_MESSAGE_BYTES``, as its
JSON bodies are (the SDK is told so: ``max_sse_event_size``)."""


MAX_MESSAGE_VALUES = 131_072
"""The most JSON values one message from a tool server may hold: its ``{``, ``[`` and ``,``
bytes, counted as they arrive, before anything parses the message (those inside strings
count too, so the count errs high: prose has a comma every few dozen bytes). Parsed, a value
takes a Python object, or a pointer to one, however few bytes it took on the wire: ``{}``
(two bytes) is a dict of some 64, ``0.5`` a float of 24 plus its pointer, so 8 MiB of them
would take hundreds of megabytes to gigabytes of the operator's or a worker's memory and
seconds of its event loop to validate. A tool list page holds a few thousand (a hundred
tools' input schemas); a tool's result past this (a megabyte or two of JSON data or prose)
is refused as a transport fault rather than cut (the model sees
``AGENTRUN_TOOL_RESULT_MAX_BYTES`` of it at most anyway)."""


GET_STREAM_INTERVAL = 1.0
"""Seconds between the starts of two GET requests of one session at least (a streamable HTTP
session's server-initiated stream, and the resumption of a request's answer: the SDK opens
them again each time the server ends one, after the ``retry`` the server names). A server
asking ``retry: 0`` and ending each stream at once made a loop of about a thousand requests
a second (and an INFO log line each) for as long as the session lived, on the event loop of
a worker or operator that every tenant shares; the SDK's own pause is 1 s when the server
names none."""


class MessageTooLarge(httpx2.StreamError):
    """A tool server sent one message over ``MAX_MESSAGE_BYTES`` or ``MAX_MESSAGE_VALUES``
    (or a body it could not be bounded in)."""


class StreamTooLarge(MessageTooLarge, httpx2.SSEError):
    """``MessageTooLarge`` in an event stream: the SDK reports an ``SSEError`` by its text
    (``SSE stream failed: …``) where it reports any other error of a request's stream as
    "ended without a response"."""


class Redirected(httpx2.TransportError):
    """A tool server answered with a redirect, which is never followed (the SDK would follow
    one to any path of the origin, outside the tenant's rule)."""


def values_in(data: bytes) -> int:
    """The JSON values ``data`` holds at most, but for one: its ``{``, ``[`` and ``,`` bytes
    (every value but the first of an object or array follows a comma)."""
    return data.count(b"{") + data.count(b"[") + data.count(b",")


@dataclasses.dataclass(frozen=True, slots=True)
class WholeBound:
    """A bound on a whole body besides the one on each of its messages: for a body that
    answers one request and has no reason to go on (a model's answer), where many messages
    each within the bound would otherwise be read until the peer stops."""

    max_bytes: int
    """The most bytes the whole body may take."""
    max_messages: int
    """The most messages (events of an event stream: ``eventstream``) it may hold."""


@dataclasses.dataclass(slots=True)
class Spent:
    """What the bodies of one answer have read so far, against its ``WholeBound``: one body's,
    or a request's answer's and each resumption's of it together."""

    read: int = 0
    """Bytes."""
    ended: int = 0
    """Messages."""


TOOL_ANSWER = WholeBound(16 * 1024 * 1024, 4_096)
"""What the answer of a streamable HTTP tool server to one request may hold in all, over every
resumption of it (``CheckedTransport.answer_limits``): 16 MiB (its result, at most
``MAX_MESSAGE_BYTES``, and the notifications before it) and 4,096 messages. Past it the
exchange fails as a transport fault (``MessageTooLarge``): a server answering a call with
notifications for ever had them parsed on the worker's event loop until the call's timeout,
and one ending each stream under the bound had the SDK resume it as long."""
SERVER_STREAM = WholeBound(1024 * 1024, 256)
"""What one server-initiated stream of a streamable HTTP session (a GET outside any request:
the stream opened, or opened again with ``Last-Event-ID``) may hold in all: 1 MiB and 256
messages. The platform reads nothing a server sends there (it offers no sampling, roots or
elicitation; its lists are refreshed on their own schedule); past it the stream is cut, and
the SDK opens it again at most a ``GET_STREAM_INTERVAL`` later, twice when it keeps failing.
A server flooding it had 223 MB read and parsed in 3 s."""


def is_event_stream(headers: Mapping[str, str]) -> bool:
    """Whether a response's media type (its ``Content-Type`` before any parameter) is
    ``text/event-stream``: only such a body is bounded event by event (``BoundedStream``);
    any other is bounded as one message, whatever its readers make of it (the MCP SDK reads a
    type that starts with ``application/json`` as one JSON document, the worker one that
    names ``json``), so a type naming both is never bounded the lax way and read the other."""
    media = headers.get("content-type", "").partition(";")[0]
    return media.strip().lower() == "text/event-stream"


def utf8_event_stream(headers: httpx2.Headers) -> httpx2.Headers:
    """``headers`` of an event stream, its ``Content-Type`` without parameters: an event
    stream is UTF-8 whatever charset it names (WHATWG HTML, "Server-sent events": "always
    decoded as UTF-8"), and ``BoundedStream`` finds its events in its bytes so; the MCP SDK
    reads its text in the charset the type names (``httpx2.EventSource``), so a stream named
    ``charset=utf-16`` had events the bound never saw end (an LF is two bytes there)."""
    plain = headers.copy()
    plain["Content-Type"] = "text/event-stream"
    return plain


@dataclasses.dataclass(frozen=True, slots=True)
class Pace:
    """How fast a body with no bound in all (an SSE session's one stream, which carries every
    answer of the session) is read at most, past a burst: the reader waits (the server's
    writes then wait too) rather than fail."""

    bytes_per_second: int
    messages_per_second: int
    burst_seconds: float
    """Seconds of either read at once, from the start of the body, before any wait."""


SSE_PACE = Pace(512 * 1024, 512, 16.0)
"""An SSE session's stream: 512 KiB and 512 messages a second past a burst of 8 MiB and 8,192
messages (a result of ``MAX_MESSAGE_BYTES`` arrives unslowed). A server flooding it with
notifications had 234 MB read and parsed in 3 s on the event loop of a worker every tenant
shares."""


@dataclasses.dataclass(frozen=True, slots=True)
class StreamLimits:
    """What ``BoundedStream`` lets through."""

    message_bytes: int = MAX_MESSAGE_BYTES
    """Bytes of one message at most."""
    message_values: int = MAX_MESSAGE_VALUES
    """JSON values of one message at most (``values_in``)."""
    whole: WholeBound | None = None
    """What the whole body may hold (``None``: no bound in all)."""
    pace: Pace | None = None
    """How fast the body is read at most (``None``: as it arrives)."""


MIN_PART_BYTES = 64
"""Bytes each part of a body (each piece the HTTP client yields: a read of the connection, or
one chunk of a chunked body) counts for at least, in a message and in all: a peer sending its
body in chunks of one byte had each parsed and passed on by itself (six bytes on the wire
each), so the bytes bounds took millions of parts to reach — a model endpoint's answer was
read until the run's deadline, a worker core busy all the while. A real stream's parts (an
event each, or a read of 64 KiB) are longer."""


class Metered(httpx2.AsyncByteStream):
    """A response's body with the count of bytes its connection received
    (``heads.HeadsStream.received``, the response's ``network_stream`` extension), so that
    ``BoundedStream`` counts each part at what it took on the wire: a chunk of one byte
    behind a chunk extension of 100 KiB (which the HTTP parser reads and drops) is 100 KiB.
    Without a metered connection (another transport's), parts count their own bytes."""

    def __init__(self, inner: httpx2.AsyncByteStream, network: object) -> None:
        self.inner = inner
        self.network = network if isinstance(network, heads.HeadsStream) else None

    def received(self) -> int:
        """Bytes the connection received so far (0 when not metered)."""
        return 0 if self.network is None else self.network.received

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self.inner:
            yield part

    async def aclose(self) -> None:
        await self.inner.aclose()


def metered(response: httpx2.Response) -> Metered:
    """``response``'s body, ``Metered`` by its connection."""
    assert isinstance(response.stream, httpx2.AsyncByteStream)
    return Metered(response.stream, response.extensions.get("network_stream"))


class _PartCosts:
    """What the parts of one body cost in all: the larger of their bytes, each part
    ``MIN_PART_BYTES`` at least, and (a ``Metered`` body) the bytes its connection received
    meanwhile — bytes read ahead are not counted twice, framing is counted once."""

    def __init__(self, body: httpx2.AsyncByteStream) -> None:
        self.wire = body.received if isinstance(body, Metered) else None
        self.start = self.wire() if self.wire is not None else 0
        self.data = self.total = 0

    def of(self, part: bytes) -> int:
        """The cost of ``part``, the next part (0 when bytes read ahead paid for it)."""
        self.data += max(len(part), MIN_PART_BYTES)
        total = self.data if self.wire is None else max(self.data, self.wire() - self.start)
        cost, self.total = total - self.total, total
        return cost


class BoundedStream(httpx2.AsyncByteStream):
    """A response body read on, but never a message longer than ``limits.message_bytes``
    bytes or opening more than ``limits.message_values`` JSON values (``values_in``), nor,
    with ``limits.whole``, more bytes or messages in all than it allows (with ``spent``, what
    other bodies of the same answer read before it counted in): raises ``error`` (by default
    ``MessageTooLarge``) naming ``source`` as soon as one passes either; with
    ``limits.pace``, read no faster than it allows. In an event stream (``events``) a message
    is an event, which ends at an empty line however its lines end
    (``eventstream.EventEnds``); in any other body, the whole body. Messages that begin and
    end within one read of the connection (64 KiB) are bounded by it. Each part read counts
    ``MIN_PART_BYTES`` at least, and a ``Metered`` body's parts the bytes its connection
    received when more (their framing: chunk headers and extensions; ``_PartCosts``)."""

    def __init__(
        self,
        inner: httpx2.AsyncByteStream,
        limits: StreamLimits,
        *,
        events: bool,
        error: type[Exception] = MessageTooLarge,
        source: str = "the tool server",
        spent: Spent | None = None,
    ) -> None:
        self.inner = inner
        self.limits = limits
        self.events = events
        self.error = error
        self.source = source
        self.spent = Spent() if spent is None else spent

    async def __aiter__(self) -> AsyncIterator[bytes]:
        pending = opened = read = ended = 0
        ends = eventstream.EventEnds()
        started = time.monotonic()
        costs = _PartCosts(self.inner)
        async for chunk in self.inner:
            count, first, last = ends.feed(chunk) if self.events else (0, 0, 0)
            cost = costs.of(chunk)
            read, ended = read + cost, ended + count
            self._spend(cost, count)
            if count:  # a message ended in this read: check it whole, then the next one's
                framing = max(cost - len(chunk), 0)
                self._check(pending + first + framing, opened + values_in(chunk[:first]))
                pending, opened = len(chunk) - last, values_in(chunk[last:])
            else:
                pending, opened = pending + cost, opened + values_in(chunk)
            self._check(pending, opened)
            await self._keep_pace(read, ended, started)
            yield chunk

    async def _keep_pace(self, read: int, ended: int, started: float) -> None:
        """Wait until ``read`` bytes and ``ended`` messages since ``started`` are within
        ``limits.pace``."""
        pace = self.limits.pace
        if pace is None:
            return
        due = max(read / pace.bytes_per_second, ended / pace.messages_per_second)
        delay = started + due - pace.burst_seconds - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    def _spend(self, read: int, ended: int) -> None:
        """Count ``read`` bytes and ``ended`` messages in ``spent``, checked against
        ``limits.whole``."""
        spent = self.spent
        spent.read += read
        spent.ended += ended
        whole = self.limits.whole
        if whole is None:
            return
        if spent.read > whole.max_bytes:
            raise self.error(f"{self.source} sent over {whole.max_bytes} bytes in all")
        if spent.ended > whole.max_messages:
            raise self.error(f"{self.source} sent over {whole.max_messages} messages in all")

    def _check(self, size: int, opened: int) -> None:
        limit, values = self.limits.message_bytes, self.limits.message_values
        if size > limit:
            raise self.error(f"{self.source} sent a message over {limit} bytes")
        if opened > values:
            raise self.error(f"{self.source} sent a message of over {values} JSON values")

    async def aclose(self) -> None:
        await self.inner.aclose()


RefusalHook = Callable[[OutsideRule], None]
"""Told of each request ``CheckedTransport`` refuses, before it raises."""


class CheckedTransport(httpx2.AsyncHTTPTransport):
    """An ``httpx2`` transport whose connections go through ``reach.CheckedBackend``: each
    host resolved once, refused unless every address is allowed, connected to those addresses
    only. No proxy from the environment (the addresses checked are the server's own). With
    ``bounds``, a request for a URL outside them (``Bounds.refusal``) is never sent: it raises
    ``OutsideRule``, told first to ``on_refused`` (the SDK's SSE transport drops a failed
    message's error; ``open_session`` ends the session by it). Each response's messages are
    bounded (``BoundedStream``, ``MAX_MESSAGE_BYTES``), counted as they arrive: requests ask
    for no content coding (``Accept-Encoding: identity``) and a response that has one anyway
    is refused (``MessageTooLarge``) — a compressed body would be decoded past the bound
    (8 MiB of gzip are gigabytes)."""

    def __init__(
        self,
        *,
        private_network: bool,
        bounds: Bounds | None = None,
        on_refused: RefusalHook | None = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        streamable: bool = False,
    ) -> None:
        """``streamable``: the session speaks streamable HTTP, each response one answer
        (``stream_limits``); an SSE session's one stream carries all its answers."""
        super().__init__(trust_env=False)
        # httpx2's transport takes no network backend; its pool does (the one seam, checked
        # by tests/tools/test_reach.py)
        self._pool = httpcore2.AsyncConnectionPool(
            ssl_context=httpx2.create_ssl_context(trust_env=False),
            network_backend=heads.HeadsBackend(
                reach.CheckedBackend(private_network=private_network), MessageTooLarge
            ),
        )
        self.bounds = bounds
        self.on_refused = on_refused
        self.max_message_bytes = max_message_bytes
        self.streamable = streamable
        self._next_get = 0.0
        """When (``time.monotonic``) the session's next GET may start (``GET_STREAM_INTERVAL``)."""
        self._answers: weakref.WeakKeyDictionary[asyncio.Task[Any], Spent]
        self._answers = weakref.WeakKeyDictionary()
        """What the answer to the request each task sent last has read so far."""

    def answer_limits(self, request: httpx2.Request) -> tuple[StreamLimits, Spent]:
        """What the response to ``request`` may hold, and what its answer read before it: each
        message ``max_message_bytes``; an SSE session's stream, which carries all its answers,
        each message ``SSE_EVENT_BYTES`` at most (the SDK's limit on each of its events) and
        nothing in all, but read at ``SSE_PACE``.
        In all, in a streamable HTTP session: for a request's answer, ``TOOL_ANSWER`` over
        every resumption of it (a GET with ``Last-Event-ID``); for the session's own stream,
        ``SERVER_STREAM`` each time it is opened. The MCP SDK sends each request and resumes
        its answer in a task of its own (``StreamableHTTPTransport._handle_post_request``,
        then ``_handle_reconnection``), so a GET from the task of a POST resumes that POST's
        answer, and a GET from any other is the session's own stream (``handle_get_stream``,
        which resumes it too)."""
        limits = StreamLimits(message_bytes=self.max_message_bytes)
        if not self.streamable:
            message_bytes = min(self.max_message_bytes, SSE_EVENT_BYTES)
            return StreamLimits(message_bytes=message_bytes, pace=SSE_PACE), Spent()
        task = asyncio.current_task()
        answer = None if task is None else self._answers.get(task)
        if request.method == "GET":
            if answer is None or "last-event-id" not in request.headers:
                return dataclasses.replace(limits, whole=SERVER_STREAM), Spent()
        else:
            answer = Spent()
            if request.method == "POST" and task is not None:
                self._answers[task] = answer
        return dataclasses.replace(limits, whole=TOOL_ANSWER), answer

    async def _pace(self, request: httpx2.Request) -> None:
        """Wait until ``request``, when a GET, may start: ``GET_STREAM_INTERVAL`` after the
        session's previous one started (each GET takes its turn as it comes)."""
        if request.method != "GET":
            return
        now = time.monotonic()
        start = max(now, self._next_get)
        self._next_get = start + GET_STREAM_INTERVAL
        if start > now:
            await asyncio.sleep(start - now)

    def _check(self, request: httpx2.Request) -> None:
        """Raises ``OutsideRule`` (after telling ``on_refused``) when ``request`` is outside
        ``bounds``."""
        why = None
        if self.bounds is not None:
            why = self.bounds.refusal(request.url) or self.bounds.header_refusal(request)
        if why is None:
            return
        refused = OutsideRule(f"a request of the session was not sent: {why}")
        if self.on_refused is not None:
            self.on_refused(refused)
        raise refused

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        """The response, its body bounded (``BoundedStream``). Raises ``OutsideRule`` for a
        request outside ``bounds`` (never sent), ``MessageTooLarge`` for a response with a
        content coding, ``Redirected`` for a redirect. A GET waits its turn first
        (``GET_STREAM_INTERVAL``)."""
        self._check(request)
        await self._pace(request)
        request.headers["Accept-Encoding"] = "identity"
        response = await super().handle_async_request(request)
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        if 300 <= response.status_code < 400:
            await response.aclose()
            where = response.headers.get("location", "")[:200]
            raise Redirected(
                f"the tool server redirected (HTTP {response.status_code}) to {where!r}"
            )
        coding = response.headers.get("content-encoding", "identity").strip().lower()
        if coding not in ("", "identity"):
            await response.aclose()
            raise MessageTooLarge(
                f"the tool server answered with content coding {coding!r}, which was not "
                "asked for: a compressed body cannot be bounded as it arrives"
            )
        events = is_event_stream(response.headers)
        limits, spent = self.answer_limits(request)
        return httpx2.Response(
            response.status_code,
            headers=utf8_event_stream(response.headers) if events else response.headers,
            stream=BoundedStream(
                metered(response),
                limits,
                events=events,
                error=StreamTooLarge if events else MessageTooLarge,
                spent=spent,
            ),
            extensions=response.extensions,
        )


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def root_cause(exc: BaseException) -> BaseException:
    """The first leaf of an exception group that is not a cancellation (anyio cancels the
    transport's other tasks once one fails); ``exc`` itself when it is no group."""
    for leaf in _leaves(exc):
        if not isinstance(leaf, asyncio.CancelledError | anyio.get_cancelled_exc_class()):
            return leaf
    return exc


CONNECTION_LOST = (
    httpx2.NetworkError,
    httpx2.RemoteProtocolError,
    anyio.ClosedResourceError,
    anyio.BrokenResourceError,
    anyio.EndOfStream,
    ConnectionError,
)
"""The errors of a connection that was reset, closed or could not carry the exchange (a
session's connection is lost; the call's fault is ``connection``)."""


ResponseHook = Callable[[httpx2.Response], Awaitable[None]]
FaultHook = Callable[[Exception], None]


class StreamEnded(ConnectionError):
    """The server ended the session's inbound stream (e.g. an SSE stream closed cleanly by a
    server shutting down): no answer can come on this session any more."""


class WatchedReads:
    """A transport's read stream (the SDK's ``ReadStream`` of ``SessionMessage | Exception``)
    that tells ``on_fault`` of every transport failure it carries and of its end
    (``StreamEnded``), synchronously, as the SDK's dispatcher reads them.

    Its sender closing (``anyio.EndOfStream``) is an end; this side's own close
    (``anyio.ClosedResourceError``) is not. Items pass through unchanged, so the dispatcher
    sees what it would without the watch.
    """

    def __init__(self, inner: Any, on_fault: FaultHook) -> None:
        self._inner = inner
        self._on_fault = on_fault

    @property
    def last_context(self) -> Any:
        """The sender's context of the last item, where the inner stream keeps one."""
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        """The next item. Raises ``anyio.EndOfStream`` once the sender closed."""
        try:
            item = await self._inner.receive()
        except anyio.EndOfStream:
            self._on_fault(StreamEnded("the MCP server ended the session's stream"))
            raise
        if isinstance(item, Exception):
            self._on_fault(item)
        return item

    async def aclose(self) -> None:
        """Close the inner stream."""
        await self._inner.aclose()

    def __aiter__(self) -> WatchedReads:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> WatchedReads:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


@contextlib.asynccontextmanager
async def _watched(transport: Any, on_fault: FaultHook | None) -> AsyncIterator[Any]:
    """``transport`` (an SDK transport: a context manager of ``(read, write)`` streams) with
    its read stream watched by ``on_fault`` when one is given."""
    async with transport as (read, write):
        yield (read if on_fault is None else WatchedReads(read, on_fault)), write


CALL_REF_KEY = "agentrun.dev/callRef"
"""The request ``_meta`` key carrying a ``tools/call``'s own reference, so the HTTP status of
its answer can be found after the SDK turned an error answer into a JSON-RPC error that no
longer says which status it was (``HttpStatuses``)."""


class HttpStatuses:
    """The HTTP error statuses (>= 400) of ``tools/call`` requests, by their reference
    (``CALL_REF_KEY`` in the request's ``_meta``): the MCP SDK reports a 403 and a 503 alike
    ("Server returned an error response"), and the status is what tells an error the model
    must correct from a fault of the server. Bounded: the oldest are forgotten."""

    def __init__(self, size: int = 4096) -> None:
        self._by_ref: cachetools.FIFOCache[str, int] = cachetools.FIFOCache(size)

    async def observe(self, response: httpx2.Response) -> None:
        """Response hook: note the status of an error answer to a referenced call."""
        if response.status_code < 400:
            return
        try:
            params = json.loads(response.request.content).get("params") or {}
            ref = params["_meta"][CALL_REF_KEY]
        except (ValueError, KeyError, TypeError, AttributeError, httpx2.RequestNotRead):
            return
        if isinstance(ref, str):
            self._by_ref[ref] = response.status_code

    def pop(self, ref: str) -> int | None:
        """The status the call ``ref`` was answered with, if it was an error (forgotten)."""
        return self._by_ref.pop(ref, None)


STATUSES = HttpStatuses()
"""The process's record, fed by every session ``open_session`` opens."""


async def _unchecked(name: str, result: object) -> None:
    """Accept any tool result: the structured content is data for the model, never trusted."""


def trust_no_output_schema(session: object) -> None:
    """Stop ``session`` (an ``mcp`` ``ClientSession``) from checking tool results against the
    ``outputSchema`` the server lists. The SDK checks with ``jsonschema`` and Python's
    backtracking ``re``, inside the caller's event loop, a schema and a content that the
    server alone chooses: one hostile server would freeze every tenant's runs on the worker
    (``^(a+)+$`` and 40 characters take hours). The runtime never relies on the result's
    shape (``remote.render_result`` shows it to the model as data), so the check is dropped,
    not moved; dropping it also saves the ``tools/list`` the SDK sends before a session's
    first call to learn the schema. ``validate_tool_result`` is the SDK's public method that
    both ``Client.call_tool`` and ``ClientSession.call_tool`` go through."""
    setattr(session, "validate_tool_result", _unchecked)  # noqa: B010 (shadows the method)


def _http_client(
    endpoint: Endpoint,
    *,
    on_refused: RefusalHook,
    hooks: dict[str, list[ResponseHook]],
    headers: Mapping[str, str] | None = None,
    timeout: httpx2.Timeout | None = None,
) -> httpx2.AsyncClient:
    """The ``httpx2`` client of one session of ``endpoint``: every request checked against
    its ``Bounds`` and its address rule (``CheckedTransport``)."""
    transport = CheckedTransport(
        private_network=endpoint.private_network,
        bounds=endpoint.bounds,
        on_refused=on_refused,
        streamable=endpoint.transport is Transport.STREAMABLE_HTTP,
    )
    return httpx2.AsyncClient(
        headers=headers, timeout=timeout, event_hooks=hooks, transport=transport
    )


@contextlib.asynccontextmanager
async def open_session(
    endpoint: Endpoint,
    *,
    on_response: ResponseHook | None = None,
    on_fault: FaultHook | None = None,
) -> AsyncIterator[Client]:
    """An MCP client session (handshake done), entered and left in the caller's task.

    ``on_response``, when given, sees every HTTP response of the session (headers only);
    ``on_fault`` every transport failure the transport reports outside a request (e.g. the
    SSE stream of a server that went away) and the end of its inbound stream
    (``StreamEnded``), as the SDK reads them. The first request outside the endpoint's
    ``Bounds`` ends the session: what runs inside it is cancelled and ``OutsideRule`` raised
    (whichever task of the SDK's made the request). Raises what the SDK and ``httpx2`` raise
    when the server cannot be reached or refuses.
    """

    await load_sdk()
    hooks: dict[str, list[ResponseHook]] = {
        "response": [STATUSES.observe, *([on_response] if on_response else [])]
    }
    refused: list[OutsideRule] = []
    try:
        with anyio.CancelScope() as scope:

            def stop(err: OutsideRule) -> None:
                refused.append(err)
                scope.cancel()

            async with _client_session(
                endpoint, hooks=hooks, on_refused=stop, on_fault=on_fault
            ) as entered:
                yield entered
    except Exception:
        if not refused:
            raise
    if refused:
        raise refused[0]


@contextlib.asynccontextmanager
async def _client_session(
    endpoint: Endpoint,
    *,
    hooks: dict[str, list[ResponseHook]],
    on_refused: RefusalHook,
    on_fault: FaultHook | None = None,
) -> AsyncIterator[Client]:
    """The session of ``open_session``, its requests refused outside the endpoint's
    ``Bounds`` (told to ``on_refused``)."""
    from mcp import Client
    from mcp.client.sse import sse_client
    from mcp.client.streamable_http import streamable_http_client

    async with contextlib.AsyncExitStack() as stack:
        if endpoint.transport is Transport.SSE:

            def factory(
                headers: dict[str, str] | None = None,
                timeout: httpx2.Timeout | None = None,
                auth: httpx2.Auth | None = None,
            ) -> httpx2.AsyncClient:
                return _http_client(
                    endpoint, on_refused=on_refused, hooks=hooks, headers=headers, timeout=timeout
                )

            transport = sse_client(
                endpoint.url,
                headers=dict(endpoint.headers),
                timeout=endpoint.timeout,
                httpx_client_factory=factory,
            )
        else:
            http = _http_client(
                endpoint,
                on_refused=on_refused,
                hooks=hooks,
                headers=endpoint.headers,
                timeout=httpx2.Timeout(endpoint.timeout),
            )
            await stack.enter_async_context(http)
            transport = streamable_http_client(
                endpoint.url, http_client=http, max_sse_event_size=MAX_MESSAGE_BYTES
            )
        client = Client(
            _watched(transport, on_fault), read_timeout_seconds=endpoint.timeout, cache=None
        )
        entered = await stack.enter_async_context(client)
        trust_no_output_schema(entered.session)
        yield entered
