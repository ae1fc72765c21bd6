"""Every request of an MCP session stays under the tenant's rule for its server: the URL's
scheme, host and port, a path under the rule's prefix. An SSE server names the URL its
session's messages go to (its ``endpoint`` event); on a gateway shared by tenants under path
prefixes, one naming another tenant's path would get the session's headers (from its tenant's
Secret) and the tool call sent there. Such a request is never sent: the session ends with a
transport fault saying why, at discovery, on a call of its own and through the pool."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx2
import mcp_support
import pytest
from aiohttp import web
from http_support import serving

from agentrun.kernel import ToolFault
from agentrun.protocol import RemoteTool
from agentrun.protocol.shapes import RemoteToolShape
from agentrun.tools import ToolContext, ToolError, endpoint, reach, remote, sessions

CTX = ToolContext(namespace="ns", run_name="run", run_uid="run-uid", call_id="call_0_0")
SECRET = "Bearer tok-0123456789abcdef-TENANT-A"


def sse_tool(url: str, *, path_prefix: str = "/a/") -> RemoteTool:
    """The tool ``add`` as admitted under tenant A's rule (``127.0.0.1``, ``path_prefix``)."""
    add = RemoteTool("tools__add", "tools", "add", "", {}, "read", url, "SSE", timeout=10.0)
    # the test servers listen on loopback
    return dataclasses.replace(add, private_network=True, path_prefix=path_prefix)


async def tenant_headers() -> dict[str, str]:
    """What tenant A's ``headersFrom`` Secret gives."""
    return {"Authorization": SECRET}


async def call(tool: RemoteTool, *, pooled: bool) -> str:
    pool = sessions.SessionPool() if pooled else None
    try:
        return await remote.mcp_tool(tool, headers=tenant_headers, pool=pool).run(
            {"a": 3, "b": 4}, CTX
        )
    finally:
        if pool is not None:
            await pool.aclose()


@pytest.fixture(scope="module")
def elsewhere(tmp_path_factory: pytest.TempPathFactory) -> Iterator[mcp_support.McpProcess]:
    """An SSE server (the ``mcp`` SDK's own) at ``/a/sse`` whose ``endpoint`` event names
    ``/b/messages/``: tenant B's path on a shared gateway."""
    tmp = tmp_path_factory.mktemp("elsewhere")
    with mcp_support.running(tmp, transport="sse", sse_paths=("/a/sse", "/b/messages/")) as s:
        yield s


@pytest.mark.parametrize("pooled", [False, True], ids=["own-session", "pooled"])
def test_a_call_whose_sse_endpoint_is_outside_the_prefix_is_never_sent(
    elsewhere: mcp_support.McpProcess, pooled: bool
) -> None:
    with pytest.raises(ToolError) as caught:
        asyncio.run(asyncio.wait_for(call(sse_tool(elsewhere.url), pooled=pooled), 8.0))
    err = caught.value
    assert err.fault is ToolFault.TRANSPORT
    assert "OutsideRule" in err.message and "'/b/messages/'" in err.message
    assert "its path is not under /a/" in err.message
    assert elsewhere.requests() == []  # no message, no header, no call reached /b/


def test_discovery_of_such_a_server_fails_saying_why(elsewhere: mcp_support.McpProcess) -> None:
    where = remote.Endpoint(
        elsewhere.url,
        remote.Transport.SSE,
        {"Authorization": SECRET},
        timeout=8.0,
        private_network=True,
        path_prefix="/a/",
    )
    with pytest.raises(remote.RemoteError) as caught:
        asyncio.run(remote.discover(where))
    assert caught.value.fault is ToolFault.TRANSPORT
    assert "is outside the tenant's rule" in caught.value.message
    assert elsewhere.requests() == []


def test_an_sse_endpoint_inside_the_prefix_works(tmp_path: Path) -> None:
    with mcp_support.running(tmp_path, transport="sse", sse_paths=("/a/sse", "/a/msg/")) as s:
        for pooled in (False, True):
            assert asyncio.run(call(sse_tool(s.url), pooled=pooled)) == "7"
        assert {r["path"] for r in s.requests()} == {"/a/msg/"}
        assert {r["authorization"] for r in s.requests()} == {SECRET}


def test_a_config_written_before_the_prefix_keeps_the_whole_origin(tmp_path: Path) -> None:
    """A tool admitted by an older operator has no ``pathPrefix``: its sessions may go
    anywhere on the URL's origin, as they could then."""
    with mcp_support.running(tmp_path, transport="sse") as s:
        wire = json.loads(RemoteToolShape.of(sse_tool(s.url)).model_dump_json(by_alias=True))
        del wire["pathPrefix"]
        old = RemoteToolShape.model_validate(wire).value()
        assert old.path_prefix == "/"
        assert asyncio.run(call(old, pooled=False)) == "7"
        assert {r["path"] for r in s.requests()} == {"/messages/"}  # beside /sse, not under it


@pytest.fixture
async def announcing() -> AsyncIterator[tuple[str, list[str], list[str]]]:
    """A hand-written SSE server at ``/a/sse`` whose ``endpoint`` event names the data given
    (``/a/sse?endpoint=…``), and which records every other request it gets: its base URL,
    the endpoints to announce (a list the test fills) and the paths hit."""
    announce: list[str] = []
    hits: list[str] = []
    done = asyncio.Event()

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(f"event: endpoint\ndata: {announce[-1]}\n\n".encode())
        await done.wait()  # the stream stays open, as a server's does
        return response

    async def anything(request: web.Request) -> web.Response:
        hits.append(request.raw_path)
        return web.Response(status=202)

    app = web.Application()
    app.router.add_get("/a/sse", stream)
    app.router.add_route("*", "/{tail:.*}", anything)
    async with serving(app) as base:
        try:
            yield base, announce, hits
        finally:
            done.set()


TRAVERSALS = [
    pytest.param("/b/messages/?session_id=1", id="another-prefix"),
    pytest.param("/a/../b/messages/", id="dot-dot"),
    pytest.param("/a/%2e%2e/b/messages/", id="encoded-dot-dot"),
    pytest.param("/a/%2E%2e/b/", id="encoded-dot-dot-mixed-case"),
    pytest.param("/a/.%2e/b/", id="half-encoded-dot-dot"),
    pytest.param("/a/%252e%252e/b/", id="double-encoded"),
    pytest.param("/a%2f..%2fb/", id="encoded-slash"),
    pytest.param("/a/..%5cb/", id="encoded-backslash"),
    pytest.param("//{netloc}/b/messages/", id="scheme-relative"),
    pytest.param("/A/messages/", id="case"),
    pytest.param("/ab/messages/", id="prefix-without-its-slash"),
]


@pytest.mark.parametrize("announced", TRAVERSALS)
async def test_no_spelling_of_a_path_outside_the_prefix_is_sent(
    announcing: tuple[str, list[str], list[str]], announced: str
) -> None:
    base, announce, hits = announcing
    announce.append(announced.format(netloc=base.removeprefix("http://")))
    where = remote.Endpoint(
        base + "/a/sse",
        remote.Transport.SSE,
        {"Authorization": SECRET},
        timeout=5.0,
        private_network=True,
        path_prefix="/a/",
    )
    async with asyncio.timeout(4):  # refused at once, not left to time out
        with pytest.raises(remote.RemoteError, match="outside the tenant's rule") as caught:
            await remote.discover(where)
    assert caught.value.fault is ToolFault.TRANSPORT
    assert hits == []


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("https://127.0.0.1:{port}/a/x", id="scheme"),
        pytest.param("http://localhost:{port}/a/x", id="host"),
        pytest.param("http://127.0.0.1:1/a/x", id="port"),
        pytest.param("http://127.0.0.1:{port}/b/x", id="path"),
    ],
)
async def test_the_transport_refuses_any_request_outside_its_bounds_unsent(url: str) -> None:
    hits: list[str] = []

    async def anything(request: web.Request) -> web.Response:
        hits.append(request.raw_path)
        return web.json_response({})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    refused: list[endpoint.OutsideRule] = []
    async with serving(app) as base:
        port = base.rsplit(":", 1)[1]
        bounds = endpoint.Bounds(f"{base}/a/sse", "/a/")
        transport = endpoint.CheckedTransport(
            private_network=True, bounds=bounds, on_refused=refused.append
        )
        async with httpx2.AsyncClient(transport=transport) as http:
            assert (await http.post(f"{base}/a/messages/?id=1", json={})).status_code == 200
            with pytest.raises(endpoint.OutsideRule, match="was not sent"):
                await http.post(url.format(port=port), json={})
    assert hits == ["/a/messages/?id=1"] and len(refused) == 1


@pytest.mark.parametrize(
    ("raw_path", "prefix", "why"),
    [
        ("/a/messages/", "/a/", None),
        ("/a/%7Euser/x%20y", "/a/", None),
        ("/anything", "/", None),
        ("/b/", "/a/", "not under /a/"),
        ("/a/../b", "/a/", ". or .. segment"),
        ("/a/%2E%2E/b", "/a/", ". or .. segment"),
        ("/a/./x", "/a/", ". or .. segment"),
        ("/a%2Fb", "/", "encoded slash or backslash"),
        ("/a/..%5Cb", "/a/", "encoded slash or backslash"),
        ("/a/..\\b", "/a/", "backslash"),
        ("/a/%252E%252E/b", "/a/", "encoded twice"),
    ],
)
def test_a_path_is_under_a_prefix_only_as_every_server_reads_it(
    raw_path: str, prefix: str, why: str | None
) -> None:
    found = reach.outside_prefix(raw_path, prefix)
    assert found is None if why is None else (found is not None and why in found)


@pytest.mark.parametrize(
    "header",
    [
        {"Host": "tenant-b.example"},
        {"X-Forwarded-Host": "tenant-b.example"},
        {"X-Original-URL": "/b/mcp"},
    ],
    ids=["host", "x-forwarded-host", "x-original-url"],
)
async def test_a_header_from_the_secret_cannot_send_the_session_elsewhere(
    header: dict[str, str],
) -> None:
    """A shared gateway (an ingress, a reverse proxy) routes by the ``Host`` header, some by
    ``X-Forwarded-Host`` or ``X-Original-URL``: a ``headersFrom`` key of that name would send
    the session to a virtual host or path the tenant's rule does not allow (tenant B's server
    behind the same address), whatever the URL says. Such a request is never sent."""
    seen: list[dict[str, str]] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.json_response({}, status=404)

    async with serving({"/{tail:.*}": record}) as base:
        where = remote.Endpoint(
            f"{base}/a/mcp",
            remote.Transport.STREAMABLE_HTTP,
            {**header, "Authorization": SECRET},
            timeout=5.0,
            private_network=True,
            path_prefix="/a/",
        )
        with pytest.raises(remote.RemoteError) as caught:
            await remote.discover(where)
    assert seen == [], [h.get("Host") for h in seen]
    assert caught.value.fault is ToolFault.TRANSPORT
    assert "was not sent" in caught.value.message, caught.value.message
