"""A tool server is tenant code: how often it makes a session's client open a request, and how
much one of its answers holds in all, are bounded, not only what each message holds.

- A handshake-era server (one that gives an ``Mcp-Session-Id``) is sent a GET for its
  server-initiated stream, which the SDK opens again each time the server ends it, after the
  ``retry`` the server names: ``retry: 0`` made a tight loop of requests (2,893 in 3 s; and
  an INFO log line each) for as long as the session lived, in the worker or the operator,
  which every tenant shares. A session's GETs now start at least
  ``endpoint.GET_STREAM_INTERVAL`` seconds apart.
- A streamable HTTP answer (a request's, or the server's own stream) was read message after
  message for as long as the server wrote: notifications, each within the message bounds,
  parsed on that event loop until the call's timeout (up to 300 s) or for as long as the
  session lived. One answer now holds at most ``endpoint.TOOL_ANSWER`` in all, the server's
  own stream ``endpoint.SERVER_STREAM`` (the platform reads nothing it sends there).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import json
import logging
import time

import pytest
from aiohttp import web
from http_support import serving

from agentrun import process
from agentrun.kernel import ToolFault
from agentrun.protocol import RemoteTool
from agentrun.tools import ToolContext, ToolError, endpoint, remote

SESSION = "s-1"
CTX = ToolContext(namespace="ns", run_name="run", run_uid="run-uid", call_id="call_0_0")
NOTE = {
    "jsonrpc": "2.0",
    "method": "notifications/message",
    "params": {"level": "info", "data": "n" * 65_000},
}
NOTE_EVENT = b"event: message\ndata: " + json.dumps(NOTE).encode() + b"\n\n"
"""A notification of 64 KB (a log message), within every bound on one message."""


ODD_EVENTS = [b"event: " + b"u" * 5_000 + b"\ndata: {}\n\n"] * 2_000
"""2,000 events of a type the SDK does not know, each of which it logs a warning for, naming
the type (10 MB in all: within every bound on an answer)."""


class Server:
    """A handshake-era MCP server over streamable HTTP. ``stream``: what its GET stream does —
    ``end`` ends it at once asking for ``retry: 0``, ``flood`` writes ``NOTE_EVENT`` for ever;
    ``flood_calls``: a call's answer is notifications for ever, never the result; ``odd``:
    a call's answer is ``ODD_EVENTS`` before its result."""

    def __init__(
        self, *, stream: str = "end", flood_calls: bool = False, odd: bool = False
    ) -> None:
        self.stream = stream
        self.flood_calls = flood_calls
        self.odd = odd
        self.gets = 0
        self.written = 0
        """Bytes of notifications written (GET streams and answers)."""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "GET":
            self.gets += 1
            if self.stream == "end":
                return await self.events(request, [b"retry: 0\n\n"])
            return await self.flood(request)
        if request.method == "POST":
            return await self.post(request)
        return web.Response(status=200)  # DELETE: the session's end

    async def post(self, request: web.Request) -> web.StreamResponse:
        message = await request.json()
        method = message.get("method")
        if method == "server/discover":  # the 2026 probe: refused as a handshake-era server
            error = {"code": -32600, "message": "Bad Request: Missing session ID"}
            body = {"jsonrpc": "2.0", "id": None, "error": error}
            return web.json_response(body, status=400)
        if "id" not in message:
            return web.Response(status=202)
        if method == "tools/call" and self.flood_calls:
            return await self.flood(request)
        if method == "tools/call" and self.odd:
            result = {"content": [{"type": "text", "text": "7"}], "isError": False}
            done = {"jsonrpc": "2.0", "id": message["id"], "result": result}
            last = b"event: message\ndata: " + json.dumps(done).encode() + b"\n\n"
            return await self.events(request, [*ODD_EVENTS, last])
        if method == "initialize":
            result = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "hostile", "version": "1"},
            }
        elif method == "tools/call":
            result = {"content": [{"type": "text", "text": "7"}], "isError": False}
        else:
            result = {"tools": []}
        reply = {"jsonrpc": "2.0", "id": message["id"], "result": result}
        return web.json_response(reply, headers={"Mcp-Session-Id": SESSION})

    async def events(self, request: web.Request, events: list[bytes]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in events:
            await response.write(event)
        await response.write_eof()
        return response

    async def flood(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Mcp-Session-Id": SESSION}
        )
        await response.prepare(request)
        try:
            while True:
                await response.write(NOTE_EVENT)
                self.written += len(NOTE_EVENT)
        except (ConnectionError, asyncio.CancelledError):
            pass
        return response


def where(base: str, *, timeout: float = 10.0) -> remote.Endpoint:
    return remote.Endpoint(
        f"{base}/mcp", remote.Transport.STREAMABLE_HTTP, {}, timeout=timeout, private_network=True
    )


async def hold_session(server: Server, seconds: float) -> float:
    """A session of ``server`` held open ``seconds`` after its first request; how long it was
    held in all."""
    async with (
        serving({"/mcp": server.handle}) as base,
        endpoint.open_session(where(base)) as client,
    ):
        started = time.monotonic()
        await client.list_tools()
        await asyncio.sleep(seconds)
        return time.monotonic() - started


async def test_a_server_that_ends_its_stream_at_once_is_not_asked_again_in_a_loop() -> None:
    server = Server(stream="end")
    held = await hold_session(server, 3.0)
    assert 1 <= server.gets <= 1 + held / endpoint.GET_STREAM_INTERVAL, (server.gets, held)


async def test_a_server_that_floods_its_own_stream_is_read_bounded() -> None:
    """Before: hundreds of megabytes read and parsed in 3 s."""
    server = Server(stream="flood")
    held = await hold_session(server, 3.0)
    streams = 1 + held / endpoint.GET_STREAM_INTERVAL
    sockets = 16 * 1024 * 1024  # what the loopback's buffers hold besides, at most
    assert server.written <= streams * endpoint.SERVER_STREAM.max_bytes + sockets, server.written


async def test_a_call_answered_with_notifications_for_ever_fails_at_once() -> None:
    """A ``server`` fault saying why. Before: the call read notifications until its timeout
    (20 s), then failed ``timeout``."""
    server = Server(stream="end", flood_calls=True)
    async with serving({"/mcp": server.handle}) as base:
        url = f"{base}/mcp"
        tool = RemoteTool("h__add", "h", "add", "", {}, "read", url, "StreamableHTTP", timeout=20)
        tool = dataclasses.replace(tool, private_network=True)
        started = time.monotonic()
        with pytest.raises(ToolError) as caught:
            await remote.mcp_tool(tool).run({}, CTX)
        took = time.monotonic() - started
    assert caught.value.fault is ToolFault.SERVER, caught.value.message
    assert "SSE stream failed: the tool server sent over" in caught.value.message
    assert "in all" in caught.value.message, caught.value.message
    assert took < 10, took


async def test_what_a_server_makes_the_sdk_log_is_bounded() -> None:
    """A call's answer of 2,000 events each of which the SDK logs a line for writes at most
    ``process.LIBRARY_LINES_PER_MINUTE`` lines, each cut. Before: 2,000 lines, 10 MB."""
    written = io.StringIO()
    handler = logging.StreamHandler(written)
    process.bound_library_logs(handler)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        server = Server(stream="end", odd=True)
        async with serving({"/mcp": server.handle}) as base:
            url = f"{base}/mcp"
            tool = RemoteTool(
                "h__add", "h", "add", "", {}, "read", url, "StreamableHTTP", timeout=20
            )
            tool = dataclasses.replace(tool, private_network=True)
            assert await remote.mcp_tool(tool).run({}, CTX) == "7"
    finally:
        root.removeHandler(handler)
    lines = [line for line in written.getvalue().splitlines() if line]
    assert len(lines) <= process.LIBRARY_LINES_PER_MINUTE + 1, (len(lines), len(written.getvalue()))
    assert (
        len(written.getvalue()) <= 2 * process.LIBRARY_LINES_PER_MINUTE * process.LIBRARY_LINE_CHARS
    )


class SseServer:
    """A handshake-era MCP server over the SSE transport whose one stream, once the session is
    initialised, carries ``NOTE_EVENT`` for ever between its answers."""

    def __init__(self) -> None:
        self.answers: asyncio.Queue[bytes] = asyncio.Queue()
        self.initialised = asyncio.Event()
        self.written = 0

    async def stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"event: endpoint\ndata: /messages/?session_id=s1\n\n")
        try:
            while True:
                while not self.answers.empty():
                    await response.write(self.answers.get_nowait())
                if not self.initialised.is_set():
                    await asyncio.sleep(0.01)
                    continue
                await response.write(NOTE_EVENT)
                self.written += len(NOTE_EVENT)
        except (ConnectionError, asyncio.CancelledError):
            pass
        return response

    async def post(self, request: web.Request) -> web.Response:
        message = await request.json()
        method = message.get("method")
        if method == "notifications/initialized":
            self.initialised.set()
        if "id" in message:
            if method == "initialize":
                result: dict[str, object] = {
                    "protocolVersion": message["params"]["protocolVersion"],
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "hostile", "version": "1"},
                }
            else:
                result = {"tools": []}
            reply = {"jsonrpc": "2.0", "id": message["id"], "result": result}
            await self.answers.put(b"event: message\ndata: " + json.dumps(reply).encode() + b"\n\n")
        return web.Response(status=202)


async def test_an_sse_server_flooding_its_stream_is_read_at_a_bounded_pace() -> None:
    """An SSE session's one stream carries every answer of the session, so it has no bound in
    all; it is read at ``endpoint.SSE_PACE`` at most past its burst. Before: hundreds of
    megabytes read and parsed in 3 s."""
    server = SseServer()
    async with serving({"/sse": server.stream, "/messages/": server.post}) as base:
        point = remote.Endpoint(
            f"{base}/sse", remote.Transport.SSE, {}, timeout=10.0, private_network=True
        )
        with contextlib.suppress(Exception):  # the SDK's reader may fail as the session ends
            async with endpoint.open_session(point):
                started = time.monotonic()
                await server.initialised.wait()
                await asyncio.sleep(3.0)
                held = time.monotonic() - started
                written = server.written
    pace = endpoint.SSE_PACE
    sockets = 16 * 1024 * 1024  # what the loopback's buffers hold besides, at most
    allowed = pace.bytes_per_second * (pace.burst_seconds + held) + sockets
    assert written <= allowed, (written, allowed)


MIXED_NOTE = (
    b'event: message\ndata: {"jsonrpc":"2.0","method":"notifications/progress",'
    b'"params":{"progressToken":1,"progress":1}}\n\r'
)
"""A notification ended by ``\\n\\r``: an LF then a CR, two line ends, so an empty line."""


class MixedEndsServer(Server):
    """Answers a call with 50,000 ``MIXED_NOTE`` (a ``\\n\\n`` every 1,000), then its result:
    12 times ``TOOL_ANSWER``'s 4,096 messages, 5.5 MB."""

    async def post(self, request: web.Request) -> web.StreamResponse:
        message = json.loads(await request.read())
        if message.get("method") != "tools/call":
            return await super().post(request)
        result = {"content": [{"type": "text", "text": "7"}], "isError": False}
        done = {"jsonrpc": "2.0", "id": message["id"], "result": result}
        block = MIXED_NOTE * 999 + MIXED_NOTE[:-2] + b"\n\n"
        events = [block] * 50 + [b"event: message\ndata: " + json.dumps(done).encode() + b"\n\n"]
        return await self.events(request, events)


async def test_a_call_answered_with_notifications_ended_by_mixed_line_ends_is_bounded() -> None:
    """As ``test_a_call_answered_with_notifications_for_ever_fails_at_once``. Before: all
    50,000 notifications were parsed and the call answered ``7`` (only 50 counted)."""
    server = MixedEndsServer(stream="end")
    async with serving({"/mcp": server.handle}) as base:
        url = f"{base}/mcp"
        tool = RemoteTool("h__add", "h", "add", "", {}, "read", url, "StreamableHTTP", timeout=20)
        tool = dataclasses.replace(tool, private_network=True)
        with pytest.raises(ToolError) as caught:
            answer = await remote.mcp_tool(tool).run({}, CTX)
            pytest.fail(f"answered {answer!r} past {endpoint.TOOL_ANSWER.max_messages} messages")
    assert caught.value.fault is ToolFault.SERVER, caught.value.message
    assert f"over {endpoint.TOOL_ANSWER.max_messages} messages in all" in caught.value.message


LOG_NOTE = {
    "jsonrpc": "2.0",
    "method": "notifications/message",
    "params": {"level": "info", "data": "n" * 1_000},
}


class Resumed(Server):
    """Answers ``tools/call``, and each resumption of the answer (a GET with
    ``Last-Event-ID``), with ``per_stream`` notifications carrying event ids, then ends the
    stream cleanly; with ``result_after`` streams, the result at the end of the next one."""

    def __init__(self, per_stream: int, result_after: int | None = None) -> None:
        super().__init__(stream="end")
        self.per_stream = per_stream
        self.result_after = result_after
        self.streams = 0
        self.resumed_from: list[str] = []
        self.call_id: object = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "GET" and "Last-Event-ID" in request.headers:
            self.resumed_from.append(request.headers["Last-Event-ID"])
            return await self.notes(request, None)
        if request.method == "GET":  # no server-initiated stream offered
            self.gets += 1
            return web.Response(status=405)
        return await super().handle(request)

    async def post(self, request: web.Request) -> web.StreamResponse:
        message = await request.json()
        if message.get("method") == "tools/call":
            return await self.notes(request, message["id"])
        return await super().post(request)

    async def notes(self, request: web.Request, call_id: object) -> web.StreamResponse:
        self.call_id = call_id if call_id is not None else self.call_id
        self.streams += 1
        data, stream = json.dumps(LOG_NOTE).encode(), self.streams
        block = [
            b"id: %d-%d\nevent: message\ndata: %s\n\n" % (stream, n, data)
            for n in range(self.per_stream)
        ]
        if self.result_after is not None and stream > self.result_after:
            result = {"content": [{"type": "text", "text": "7"}], "isError": False}
            done = {"jsonrpc": "2.0", "id": self.call_id, "result": result}
            block.append(b"event: message\ndata: " + json.dumps(done).encode() + b"\n\n")
        return await self.events(request, [b"".join(block)])


def call_tool(base: str, *, timeout: float = 10.0) -> remote.McpTool:
    url = f"{base}/mcp"
    tool = RemoteTool("h__add", "h", "add", "", {}, "read", url, "StreamableHTTP", timeout=timeout)
    return remote.mcp_tool(dataclasses.replace(tool, private_network=True))


async def test_an_answer_resumed_for_ever_is_bounded_in_all() -> None:
    """``TOOL_ANSWER`` holds for the answer over its resumptions: 2,000 notifications a
    stream, so the third stream passes the 4,096th message, and the call fails as the
    unresumed flood does. Before: each resumed stream had an allowance of its own, and the
    server's streams were read, one a second, until the call's timeout (10 s here)."""
    server = Resumed(per_stream=2_000)
    async with serving({"/mcp": server.handle}) as base:
        started = time.monotonic()
        with pytest.raises(ToolError) as caught:
            await call_tool(base).run({}, CTX)
        took = time.monotonic() - started
    seen = (server.streams, server.resumed_from, round(took, 1), caught.value.message[:160])
    assert caught.value.fault is ToolFault.SERVER, seen
    assert f"over {endpoint.TOOL_ANSWER.max_messages} messages in all" in caught.value.message
    assert server.streams == 3 and server.resumed_from == ["1-1999", "2-1999"], seen
    assert took < 8, seen


async def test_an_answer_resumed_within_the_bound_is_read_to_its_result() -> None:
    """Resuming is kept: 1,000 notifications a stream, the result at the end of the third."""
    server = Resumed(per_stream=1_000, result_after=2)
    async with serving({"/mcp": server.handle}) as base:
        answer = await call_tool(base).run({}, CTX)
    assert answer == "7"
    assert server.resumed_from == ["1-999", "2-999"]
