"""A tool server is tenant code: how often it makes a session's client open a request is
bounded, not only what each answer holds. A handshake-era server (one that gives an
``Mcp-Session-Id``) is sent a GET for its server-initiated stream, which the SDK opens again
each time the server ends it, after the ``retry`` the server names — ``retry: 0`` made a
tight loop of requests (2,893 in 3 s; and an INFO log line each) for as long as the session
lived, in the worker or the operator, which every tenant shares. A session's GETs now start
at least ``endpoint.GET_STREAM_INTERVAL`` seconds apart."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web
from http_support import serving

from agentrun.tools import endpoint, remote

SESSION = "s-1"


class Server:
    """A handshake-era MCP server over streamable HTTP that ends every GET stream at once,
    asking for ``retry: 0``."""

    def __init__(self) -> None:
        self.gets = 0

    async def post(self, request: web.Request) -> web.Response:
        message = await request.json()
        method = message.get("method")
        if method == "server/discover":  # the 2026 probe: refused as a handshake-era server
            error = {"code": -32600, "message": "Bad Request: Missing session ID"}
            body = {"jsonrpc": "2.0", "id": None, "error": error}
            return web.json_response(body, status=400)
        if "id" not in message:
            return web.Response(status=202)
        if method == "initialize":
            result = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "looping", "version": "1"},
            }
        else:
            result = {"tools": []}
        reply = {"jsonrpc": "2.0", "id": message["id"], "result": result}
        return web.json_response(reply, headers={"Mcp-Session-Id": SESSION})

    async def get(self, request: web.Request) -> web.StreamResponse:
        self.gets += 1
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"retry: 0\n\n")
        await response.write_eof()
        return response

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "GET":
            return await self.get(request)
        if request.method == "POST":
            return await self.post(request)
        return web.Response(status=200)  # DELETE: the session's end


async def test_a_server_that_ends_its_stream_at_once_is_not_asked_again_in_a_loop() -> None:
    server = Server()
    async with serving({"/mcp": server.handle}) as base:
        where = remote.Endpoint(
            f"{base}/mcp", remote.Transport.STREAMABLE_HTTP, {}, timeout=10.0, private_network=True
        )
        async with endpoint.open_session(where) as client:
            started = time.monotonic()
            await client.list_tools()
            await asyncio.sleep(3.0)
            held = time.monotonic() - started
    assert 1 <= server.gets <= 1 + held / endpoint.GET_STREAM_INTERVAL, (server.gets, held)
