"""Tool servers are tenants' code: no message one sends is read past ``MAX_MESSAGE_BYTES``
into the operator's or a worker's memory — a JSON body, or one event of an event stream —
while a long stream of small events (a long-lived SSE session) reads on."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx2
import pytest
from aiohttp import web

from agentrun.tools import endpoint

LIMIT = 64 * 1024


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

    app = web.Application()
    app.router.add_post("/json", huge_json)
    app.router.add_get("/events", many_events)
    app.router.add_get("/event", huge_event)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


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
