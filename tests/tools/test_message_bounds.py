"""Tool servers are tenants' code: no message one sends is read past ``MAX_MESSAGE_BYTES``
into the operator's or a worker's memory — a JSON body, or one event of an event stream —
while a long stream of small events (a long-lived SSE session) reads on."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gzip
import json
from collections.abc import AsyncIterator
from inspect import signature
from typing import Any

import httpx2
import pytest
from aiohttp import web
from http_support import serving
from mcp_call_support import CallServer, answer

from agentrun.kernel import ToolFault
from agentrun.protocol import RemoteTool
from agentrun.tools import ToolContext, ToolError, endpoint, remote

LIMIT = 64 * 1024
CTX = ToolContext(namespace="ns", run_name="run", run_uid="run-uid", call_id="call_0_0")


@pytest.fixture
async def server() -> AsyncIterator[str]:
    async def huge_json(request: web.Request) -> web.Response:
        return web.Response(
            body=b'{"x":"' + b"a" * (4 * LIMIT) + b'"}', content_type="application/json"
        )

    async def many_events(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        event = b"event: message\r\ndata: " + b"b" * (LIMIT // 4) + b"\r\n\r\n"
        for _ in range(40):  # ten times the limit in all, each event a quarter of it
            await response.write(event)
        await response.write_eof()
        return response

    async def huge_event(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: small\n\n")
        for _ in range(16):  # one event of four times the limit, written in pieces
            await response.write(b"data: " + b"c" * (LIMIT // 4) + b"\n")
        await response.write(b"\n")
        await response.write_eof()
        return response

    routes = {"/json": huge_json, "/events": many_events, "/event": huge_event}
    async with serving(routes) as base:
        yield base


def client() -> httpx2.AsyncClient:
    transport = endpoint.CheckedTransport(private_network=True, max_message_bytes=LIMIT)
    return httpx2.AsyncClient(transport=transport)


@pytest.mark.parametrize("path", ["/json", "/event"], ids=["json-body", "one-event"])
async def test_a_message_over_the_limit_is_not_read_whole(server: str, path: str) -> None:
    async with client() as http:
        with pytest.raises(endpoint.MessageTooLarge, match=f"over {LIMIT} bytes"):
            if path == "/json":
                await http.post(server + path, json={})
            else:
                await http.get(server + path)


async def test_many_small_events_read_on_past_the_limit_in_all(server: str) -> None:
    async with client() as http:
        response = await http.get(server + "/events")
    assert response.status_code == 200 and len(response.content) > 10 * LIMIT


async def test_a_compressed_body_is_refused_before_it_is_decoded() -> None:
    """8 MiB of gzip are gigabytes once decoded: no content coding is asked for, and one sent
    anyway is refused, not decoded past the bound."""
    bomb = gzip.compress(b"{" + b" " * (32 * LIMIT) + b"}")

    async def gzipped(request: web.Request) -> web.Response:
        assert request.headers.get("Accept-Encoding") == "identity"
        return web.Response(
            body=bomb, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}
        )

    async with serving({"/gz": gzipped}) as base, client() as http:
        with pytest.raises(endpoint.MessageTooLarge, match="content coding 'gzip'"):
            await http.post(base + "/gz", json={})


async def test_blank_lines_reset_no_count_outside_an_event_stream() -> None:
    """In a JSON body ``\\n\\n`` is whitespace, not a message boundary."""

    async def spaced(request: web.Request) -> web.Response:
        body = b'{"x": "' + b"a\\n\\n" * (LIMIT // 2) + b'"}'
        return web.Response(body=body, content_type="application/json")

    async with serving({"/spaced": spaced}) as base, client() as http:
        with pytest.raises(endpoint.MessageTooLarge):
            await http.post(base + "/spaced", json={})


@pytest.mark.parametrize("status", [301, 302, 307, 308])
async def test_a_redirect_is_an_error_never_followed(status: int) -> None:
    """The MCP SDK follows a same-origin redirect itself: the transport refuses any, so a
    server cannot send the session to a path outside the tenant's rule."""
    seen: list[str] = []

    async def moved(request: web.Request) -> web.Response:
        return web.Response(status=status, headers={"Location": "/elsewhere"})

    async def elsewhere(request: web.Request) -> web.Response:
        seen.append(request.path)
        return web.json_response({})

    async with (
        serving({"/mcp": moved, "/elsewhere": elsewhere}) as base,
        httpx2.AsyncClient(
            transport=endpoint.CheckedTransport(private_network=True), follow_redirects=True
        ) as http,
    ):
        with pytest.raises(endpoint.Redirected, match=f"HTTP {status}"):
            await http.post(base + "/mcp", json={})
    assert seen == []


SECRET = "tok-0123456789abcdef-SECRET"


async def echo_credentials(request: web.Request) -> web.Response:
    """An MCP endpoint answering every JSON-RPC request with an error quoting its token."""
    body = await request.json()
    if not isinstance(body, dict) or body.get("id") is None:
        return web.Response(status=202)
    token = request.headers.get("Authorization", "").removeprefix("Bearer ")
    error = {"code": -32000, "message": f"invalid credentials {token}"}
    return web.json_response({"jsonrpc": "2.0", "id": body["id"], "error": error})


def credentialed(base: str) -> endpoint.Endpoint:
    """The endpoint ``<base>/mcp``, sent ``Authorization: Bearer SECRET``."""
    return endpoint.Endpoint(
        base + "/mcp",
        headers={"Authorization": f"Bearer {SECRET}"},
        timeout=5.0,
        private_network=True,
    )


async def test_a_server_quoting_its_credentials_is_redacted_from_what_it_causes() -> None:
    """A tenant's server echoing the header a Secret gave it (the whole value, or the token
    alone): neither the operator's discovery failure (the AgentToolServer's status) nor a
    worker's tool error (the model, the run's events) carries it."""
    async with serving({"/mcp": echo_credentials}) as base:
        where = credentialed(base)
        with pytest.raises(remote.RemoteError) as caught:
            await remote.discover(where)
    assert SECRET not in caught.value.message and "[redacted]" in caught.value.message
    assert where.redact(f"Bearer {SECRET} and {SECRET}") == "[redacted] and [redacted]"


async def echo_credentials_late(request: web.Request) -> web.Response:
    """As ``echo_credentials``, the token quoted after a preamble that puts it across the
    300 characters of the server's words an error keeps."""
    body = await request.json()
    if not isinstance(body, dict) or body.get("id") is None:
        return web.Response(status=202)
    token = request.headers.get("Authorization", "").removeprefix("Bearer ")
    error = {"code": -32000, "message": "p" * 260 + f" invalid credentials {token}"}
    return web.json_response({"jsonrpc": "2.0", "id": body["id"], "error": error})


async def test_a_quoted_credential_cut_by_the_bound_of_a_message_leaves_no_part_of_it() -> None:
    """The server's words are cut to their bound after the credentials are taken out, not
    before: a token the cut splits would otherwise no longer match and its first part would
    reach the status, the model and the run's events."""
    async with serving({"/mcp": echo_credentials_late}) as base:
        where = credentialed(base)
        with pytest.raises(remote.RemoteError) as caught:
            await remote.discover(where)
        admitted = RemoteTool("s__t", "s", "t", "", {"type": "object"}, "read", where.url, "", 5.0)
        tool = remote.McpTool(remote.spec_of(admitted), "t", where, server="s")
        with pytest.raises(ToolError) as called:
            await tool.run({}, CTX)
    for message in (caught.value.message, str(called.value)):
        assert SECRET[:8] not in message, message
        assert "invalid credentials" in message


VALUES = endpoint.MAX_MESSAGE_VALUES


@pytest.mark.parametrize("value", [b"{}", b"0.5", b'"ab"'], ids=["objects", "floats", "strings"])
async def test_a_message_of_too_many_json_values_is_refused_unparsed(value: bytes) -> None:
    """A few bytes each on the wire, a Python object each once parsed: a JSON body, or one
    event of a stream written in pieces, holding more values than the bound is refused before
    anything parses it; a stream of events each under it reads on."""
    many = b"[" + (value + b",") * VALUES + value + b"]"  # well under the byte limit

    async def json_body(request: web.Request) -> web.Response:
        return web.Response(body=b'{"x":' + many + b"}", content_type="application/json")

    async def one_event(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for start in range(0, len(many), 4096):  # one event, in many reads
            await response.write(b"data: " + many[start : start + 4096] + b"\n")
        await response.write(b"\n")
        return response

    async def small_events(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        event = b"data: [" + (value + b",") * (VALUES // 4) + value + b"]\n\n"
        for _ in range(8):  # twice the bound in all, each event a quarter of it
            await response.write(event)
        return response

    routes = {"/json": json_body, "/event": one_event, "/events": small_events}
    async with (
        serving(routes) as base,
        httpx2.AsyncClient(transport=endpoint.CheckedTransport(private_network=True)) as http,
    ):
        for path in ("/json", "/event"):
            with pytest.raises(endpoint.MessageTooLarge, match=f"over {VALUES} JSON values"):
                await http.post(base + path, json={})
        response = await http.get(base + "/events")
    assert response.status_code == 200 and response.content.count(value) > 2 * VALUES


BIG_TEXT = "r" * 2_000_000
"""A tool's result of 2 MB: within ``MAX_MESSAGE_BYTES``, over the MCP SDK's default 1 MiB
an event."""


def answer_to(message: dict[str, Any], text: str = BIG_TEXT) -> bytes:
    if message.get("method") == "initialize":
        result: dict[str, object] = {
            "protocolVersion": message["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "big", "version": "1"},
        }
    else:
        result = {"content": [{"type": "text", "text": text}], "isError": False}
    return json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}).encode()


class BigResults(CallServer):
    """A streamable HTTP server answering a call with ``BIG_TEXT``, as a JSON body or as one
    event of an event stream (``sse``)."""

    def __init__(self, sse: bool) -> None:
        self.sse = sse

    async def answer_call(
        self, request: web.Request, message: dict[str, Any]
    ) -> web.StreamResponse:
        return await answer(request, answer_to(message), sse=self.sse)


def big_tool(url: str, transport: str) -> remote.McpTool:
    tool = RemoteTool("h__big", "h", "big", "", {}, "read", url, transport, timeout=10)
    return remote.mcp_tool(dataclasses.replace(tool, private_network=True))


@pytest.mark.parametrize("sse", [False, True], ids=["json", "event-stream"])
async def test_a_2_mb_result_is_cut_and_delivered_whatever_the_body(sse: bool) -> None:
    """A streamable HTTP server's result as a JSON body or as an event: the SDK is given the
    same 8 MiB a message. Before: the event failed at the SDK's own 1 MiB (a ``server``
    fault) where the JSON body was cut and delivered."""
    async with serving({"/mcp": BigResults(sse).handle}) as base:
        answer = await big_tool(f"{base}/mcp", "StreamableHTTP").run({}, CTX)
    assert answer.startswith("rrrr")


class SseBigResults:
    """An SSE server answering a call with ``text`` on its one stream."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.answers: asyncio.Queue[bytes] = asyncio.Queue()

    async def stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"event: endpoint\ndata: /messages/?session_id=s1\n\n")
        while request.transport is not None and not request.transport.is_closing():
            with contextlib.suppress(TimeoutError):
                answer = await asyncio.wait_for(self.answers.get(), 0.05)
                await response.write(b"event: message\ndata: " + answer + b"\n\n")
        return response

    async def post(self, request: web.Request) -> web.Response:
        message = await request.json()
        if "id" in message:
            await self.answers.put(answer_to(message, self.text))
        return web.Response(status=202)


async def test_an_sse_server_event_over_the_sdks_limit_fails_saying_so() -> None:
    """An SSE server's events are held to the MCP SDK's 1 MiB (``SSE_EVENT_BYTES``), the
    SDK's transport taking no other: a 2 MB result fails naming the bound, as any message
    over a bound does; under it, it is delivered."""
    for text, fails in [(BIG_TEXT, True), ("r" * 1_000_000, False)]:
        server = SseBigResults(text)
        async with serving({"/sse": server.stream, "/messages/": server.post}) as base:
            tool = big_tool(f"{base}/sse", "SSE")
            if not fails:
                assert (await tool.run({}, CTX)).startswith("rrrr")
                continue
            with pytest.raises(ToolError) as caught:
                await tool.run({}, CTX)
        bound = f"StreamTooLarge: the tool server sent a message over {endpoint.SSE_EVENT_BYTES}"
        assert bound in caught.value.message, caught.value.message
        assert caught.value.fault is ToolFault.TRANSPORT


def test_the_sdks_sse_transport_still_holds_its_events_to_sse_event_bytes() -> None:
    """When the SDK's SSE transport takes a limit, give it ``MAX_MESSAGE_BYTES`` as the
    streamable HTTP one is given, and drop ``SSE_EVENT_BYTES``."""
    from mcp.client import sse
    from mcp.shared import _httpx_utils

    assert not {"max_event_size", "max_sse_event_size"} & set(signature(sse.sse_client).parameters)
    default = signature(_httpx_utils.sse_within_origin).parameters["max_event_size"].default
    assert default == endpoint.SSE_EVENT_BYTES


async def test_an_event_stream_is_read_as_utf8_whatever_charset_it_names() -> None:
    """As the bound counts its events. Before, the MCP SDK read a stream named
    ``charset=utf-16`` in UTF-16, where ``\\n\\n`` is no empty line (and two line ends are
    four bytes): events parsed that the bound never saw end, or the other way."""

    async def named_utf16(request: web.Request) -> web.StreamResponse:
        kind = "text/event-stream; charset=utf-16"
        response = web.StreamResponse(headers={"Content-Type": kind})
        await response.prepare(request)
        await response.write(b"data: 1\n\ndata: 2\n\n")
        return response

    async with (
        serving({"/events": named_utf16}) as base,
        client() as http,
        http.stream("GET", base + "/events") as response,
    ):
        events = [event.data async for event in httpx2.EventSource(response)]
    assert response.headers["content-type"] == "text/event-stream"
    assert events == ["1", "2"]
