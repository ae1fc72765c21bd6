"""A streamable HTTP MCP server of the handshake era that answers the handshake itself and
leaves each ``tools/call`` to a subclass: for tests of what a server's answer to a call does
to the client."""

from __future__ import annotations

from typing import Any

from aiohttp import web


class CallServer:
    """Refuses the 2026 ``server/discover`` probe (so the client falls back to the
    handshake), answers ``initialize`` and accepts notifications; every other request is
    ``answer_call``'s."""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method != "POST":
            return web.Response(status=405)
        message = await request.json()
        method = message.get("method")
        if method == "server/discover":
            error = {"code": -32600, "message": "Bad Request: Missing session ID"}
            return web.json_response({"jsonrpc": "2.0", "id": None, "error": error}, status=400)
        if "id" not in message:
            return web.Response(status=202)
        if method == "initialize":
            result = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "hostile", "version": "1"},
            }
            return web.json_response({"jsonrpc": "2.0", "id": message["id"], "result": result})
        return await self.answer_call(request, message)

    async def answer_call(
        self, request: web.Request, message: dict[str, Any]
    ) -> web.StreamResponse:
        raise NotImplementedError


async def answer(request: web.Request, body: bytes, *, sse: bool) -> web.StreamResponse:
    """``body`` (one JSON-RPC message) as a JSON body, or as the one event of an event
    stream (``sse``)."""
    if not sse:
        return web.Response(body=body, headers={"Content-Type": "application/json"})
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b"event: message\ndata: " + body + b"\n\n")
    await response.write_eof()
    return response
