"""`http_get` against a real local HTTP server: the tenant's URL rules, redirects re-checked,
private addresses refused unless a rule allows them, size and time caps, faults."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import http_support
import pytest
from aiohttp import web
from yarl import URL

from agentrun.kernel import ToolFault
from agentrun.protocol import UrlRule
from agentrun.tools import ToolContext, ToolError, heads, http_get

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
CTX = ToolContext(namespace="ns", run_name="run", run_uid="uid", call_id="c1")


async def _slow(request: web.Request) -> web.Response:
    await asyncio.sleep(30)
    return web.Response(text="late")


def respond(make: Callable[[], web.StreamResponse]) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = make()
        if isinstance(response, web.HTTPException):
            raise response
        return response

    return handler


def _routes() -> web.Application:
    app = web.Application()
    table: dict[str, Callable[[], web.StreamResponse]] = {
        "/api/ok": lambda: web.json_response({"status": "green"}),
        "/api/big": lambda: web.Response(text="y" * (http_get.MAX_BYTES + 500)),
        "/api/png": lambda: web.Response(body=b"\x89PNG\x00", content_type="image/png"),
        "/api/missing": lambda: web.Response(status=404, text="no such thing"),
        "/api/broken": lambda: web.Response(status=503, text="overloaded"),
        "/api/in": lambda: web.HTTPFound("/api/ok"),
        "/api/out": lambda: web.HTTPFound("/admin/secret"),
        "/api/loop": lambda: web.HTTPFound("/api/loop"),
        "/admin/secret": lambda: web.Response(text="never"),
        "/api/headers": lambda: web.Response(text="ok", headers={"Set-Cookie": "session=s3cr3t"}),
    }
    for path, make in table.items():
        app.router.add_get(path, respond(make))
    app.router.add_get("/api/slow", _slow)
    return app


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[int]:
    runner = web.AppRunner(_routes(), shutdown_timeout=0.5)  # cuts `_slow` at the end
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield port
    finally:
        await runner.cleanup()


def fetch(path: str, *, rules: Callable[[int], list[UrlRule]] | None = None) -> str:
    """GET ``http://127.0.0.1:<port><path>`` with the rules (default: /api/ on loopback,
    private network allowed)."""

    async def go() -> str:
        async with serving() as port:
            chosen = rules(port) if rules else [UrlRule(f"127.0.0.1:{port}", "/api/", True)]
            url = path if path.startswith("http") else f"http://127.0.0.1:{port}{path}"
            return await http_get.HttpGet(chosen).run({"url": url}, CTX)

    return asyncio.run(go())


def refused(path: str, **kwargs: Any) -> ToolError:
    with pytest.raises(ToolError) as caught:
        fetch(path, **kwargs)
    return caught.value


def test_an_allowed_url_is_fetched_with_status_type_size_and_body() -> None:
    out = fetch("/api/ok")
    assert out.startswith("HTTP 200 OK, application/json; charset=utf-8, 19 bytes\n\n")
    assert out.endswith('{"status": "green"}')


def test_a_path_outside_the_prefix_is_refused_as_the_models_error() -> None:
    err = refused("/admin/secret")
    assert err.fault is ToolFault.DOMAIN
    assert "is not allowed for this tenant" in err.message and "/api/" in err.message


def test_another_port_or_host_is_refused() -> None:
    err = refused("http://127.0.0.1:1/api/ok")
    assert err.fault is ToolFault.DOMAIN
    assert refused("http://localhost.invalid/api/ok").fault is ToolFault.DOMAIN


def test_dot_segments_and_credentials_are_refused() -> None:
    assert "not allowed" in refused("/api/../admin/secret").message
    err = refused("http://user:pw@127.0.0.1:1/api/ok")
    assert "pw" not in err.message  # never echoed


def test_loopback_is_refused_unless_the_rule_allows_private_networks() -> None:
    err = refused("/api/ok", rules=lambda port: [UrlRule(f"127.0.0.1:{port}", "/api/")])
    assert "127.0.0.1 is a loopback address" in err.message
    assert err.fault is ToolFault.DOMAIN


def test_a_redirect_inside_the_rules_is_followed() -> None:
    assert fetch("/api/in").endswith('{"status": "green"}')


def test_a_redirect_outside_the_rules_is_not_followed() -> None:
    err = refused("/api/out")
    assert "/admin/secret is not allowed" in err.message


def test_endless_redirects_stop() -> None:
    assert "more than 5 redirects" in refused("/api/loop").message


def test_a_large_body_is_cut_and_a_binary_one_not_shown() -> None:
    big = fetch("/api/big")
    assert f"{http_get.MAX_BYTES} bytes (cut at {http_get.MAX_BYTES})" in big.splitlines()[0]
    assert fetch("/api/png").endswith("[binary content, not shown]")


def test_response_headers_are_never_echoed() -> None:
    assert "s3cr3t" not in fetch("/api/headers")


@pytest.mark.parametrize(
    ("path", "fault", "text"),
    [
        pytest.param("/api/missing", ToolFault.REJECTED, "HTTP 404", id="4xx"),
        pytest.param("/api/broken", ToolFault.SERVER, "HTTP 503", id="5xx"),
    ],
)
def test_http_errors_carry_their_fault_and_the_start_of_the_body(
    path: str, fault: ToolFault, text: str
) -> None:
    err = refused(path)
    assert err.fault is fault and text in err.message


def test_a_slow_server_is_cut_at_the_time_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_get, "TIMEOUT_SECONDS", 0.5)
    started = time.monotonic()
    err = refused("/api/slow")
    assert err.fault is ToolFault.TIMEOUT
    assert time.monotonic() - started < 10  # the server would answer after 30 s


def test_a_refused_connection_is_infrastructure() -> None:
    async def go() -> None:
        async with serving() as port:
            pass  # the server is gone once the block ends
        tool = http_get.HttpGet([UrlRule(f"127.0.0.1:{port}", "/", True)])
        await tool.run({"url": f"http://127.0.0.1:{port}/"}, CTX)

    with pytest.raises(ToolError) as caught:
        asyncio.run(go())
    assert caught.value.fault is ToolFault.CONNECTION


@pytest.mark.parametrize(
    ("address", "private", "refused_as"),
    [
        ("8.8.8.8", False, None),
        ("10.1.2.3", False, "private"),
        ("169.254.169.254", False, "link-local"),
        ("::1", False, "loopback"),
        ("::ffff:127.0.0.1", False, "loopback"),
        ("fe80::1", False, "link-local"),
        ("10.1.2.3", True, None),
    ],
)
def test_non_global_addresses_need_an_explicit_allow(
    address: str, private: bool, refused_as: str | None
) -> None:
    why = http_get.check_address(address, private_network=private)
    assert (why is None) if refused_as is None else (why is not None and refused_as in why)


def test_rules_match_host_port_and_path_prefix() -> None:
    rules = [UrlRule("api.example.com", "/v1/"), UrlRule("metrics.local:9090", "/")]
    assert http_get.allowed_by(URL("https://API.example.com/v1/x"), rules) is rules[0]
    assert http_get.allowed_by(URL("https://api.example.com/v2/x"), rules) is None
    assert http_get.allowed_by(URL("http://metrics.local:9090/q"), rules) is rules[1]
    assert http_get.allowed_by(URL("http://metrics.local:9091/q"), rules) is None
    assert http_get.allowed_by(URL("ftp://api.example.com/v1/x"), rules) is None


def heads_then(count: int | None, final: bytes = b"") -> str:
    """GET from a server sending ``count`` informational heads (``None``: without end) and
    then ``final``; loopback allowed."""

    async def go() -> str:
        async with http_support.heads_first(count, final) as base:
            rule = UrlRule(base.removeprefix("http://"), "/", True)
            return await http_get.HttpGet([rule]).run({"url": f"{base}/x"}, CTX)

    return asyncio.run(go())


def test_informational_heads_without_end_fail_the_call_at_once() -> None:
    """Before, aiohttp read ``103 Early Hints`` for as long as they came: the call ended
    ``timeout`` after ``TIMEOUT_SECONDS``, a core busy parsing them all the while."""
    with pytest.raises(ToolError) as caught:
        heads_then(None)
    assert caught.value.fault is ToolFault.CONNECTION, caught.value.message
    assert "over 16 informational (1xx) responses" in caught.value.message


def test_as_many_informational_heads_as_allowed_are_read_past_to_the_answer() -> None:
    final = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi"
    assert heads_then(heads.MAX_INFORMATIONAL, final).endswith("\n\nhi")
    with pytest.raises(ToolError):
        heads_then(heads.MAX_INFORMATIONAL + 1, final)


CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
ENDLESS = {
    "one-byte chunks": b"1\r\nx\r\n" * 4096,
    "behind 60 KB extensions": b"1;e=" + b"a" * 60_000 + b"\r\nx\r\n",
}
"""Chunked bodies sent for ever, a byte a chunk: as they are, and behind a chunk extension the
HTTP parser reads and drops."""


def endless(parts: bytes) -> tuple[str, float, int]:
    """GET a body of ``parts`` sent for ever: the call's result (or its ToolError's fault and
    message), its seconds, and the bytes the server wrote."""
    written: list[int] = []

    async def go() -> str:
        async with http_support.heads_first(
            0, CHUNKED_HEAD, forever=parts, written=written
        ) as base:
            rule = UrlRule(base.removeprefix("http://"), "/", True)
            try:
                return await http_get.HttpGet([rule]).run({"url": f"{base}/x"}, CTX)
            except ToolError as err:
                return f"{err.fault.value}: {err.message}"

    start = time.monotonic()
    result = asyncio.run(go())
    return result, time.monotonic() - start, sum(written)


@pytest.mark.parametrize("parts", ENDLESS.values(), ids=ENDLESS.keys())
def test_a_body_s_framing_is_bounded_on_the_wire(parts: bytes) -> None:
    """Before, the body behind extensions was read until ``TIMEOUT_SECONDS`` (2.9 GB of the
    wire, 7.7 s of a core), and the bare one to its 1 MiB of data (6 MiB of the wire)."""
    result, seconds, written = endless(parts)
    assert result.startswith("connection: http://127.0.0.1:"), result
    assert result.endswith(
        f"the server sent over {http_get.MAX_WIRE_BYTES} bytes on one connection"
    )
    assert seconds < http_get.TIMEOUT_SECONDS / 2
    assert written < 8 * http_get.MAX_WIRE_BYTES  # the refusal, plus what the sockets held


def test_a_long_body_in_real_chunks_is_still_cut_not_refused() -> None:
    result, _, written = endless(b"10000\r\n" + b"y" * 0x10000 + b"\r\n")
    assert result.startswith(f"HTTP 200 OK, text/plain, {http_get.MAX_BYTES} bytes (cut at "), (
        result
    )
    assert written > http_get.MAX_BYTES


def test_a_body_cut_short_is_a_connection_fault_not_a_crash() -> None:
    """A chunked body whose server closes mid-chunk: aiohttp's ``ClientPayloadError`` was not
    mapped, so the runner logged the tool as crashed (``crashed``, a stack trace per call)."""
    with pytest.raises(ToolError) as caught:
        heads_then(0, CHUNKED_HEAD + b"a\r\nonly five")
    assert caught.value.fault is ToolFault.CONNECTION
    assert "ClientPayloadError" in caught.value.message
