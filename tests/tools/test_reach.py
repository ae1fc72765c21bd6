"""Where a tool may connect, against a real MCP server (the ``mcp`` SDK's own, on loopback):
an address its tenant's rule does not allow is refused before anything is sent — at
discovery, on a call of its own and through the worker's session pool — and a host is
resolved once, the connection going to the address checked (no second DNS answer)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from typing import Any

import httpx2
import mcp_support
import pytest
from yarl import URL

from agentrun.kernel import ToolFault
from agentrun.protocol import RemoteTool, UrlRule
from agentrun.tools import ToolContext, ToolError, endpoint, reach, remote, sessions

CTX = ToolContext(namespace="ns", run_name="run", run_uid="run-uid", call_id="call_0_0")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[mcp_support.McpProcess]:
    with mcp_support.running(tmp_path_factory.mktemp("mcp")) as started:
        yield started


def admitted(url: str, *, private_network: bool) -> RemoteTool:
    return RemoteTool(
        name="tools__add",
        server="tools",
        tool="add",
        description="",
        parameters={"type": "object"},
        effect="read",
        url=url,
        transport="StreamableHTTP",
        timeout=10.0,
        private_network=private_network,
    )


def posts(server: mcp_support.McpProcess) -> int:
    return len(server.requests())


def test_discovery_of_a_loopback_server_is_refused_unless_private_networks_are_allowed(
    server: mcp_support.McpProcess,
) -> None:
    before = posts(server)
    with pytest.raises(remote.RemoteError) as caught:
        asyncio.run(remote.discover(remote.Endpoint(server.url, timeout=5.0)))
    assert "refused by the tenant's rules" in caught.value.message
    assert "127.0.0.1 is a loopback address" in caught.value.message
    assert posts(server) == before  # nothing reached the server
    found = asyncio.run(remote.discover(remote.Endpoint(server.url, private_network=True)))
    assert "add" in {d.name for d in found}


@pytest.mark.parametrize("pooled", [False, True], ids=["own-session", "worker-pool"])
def test_a_call_to_a_refused_address_is_never_sent(
    server: mcp_support.McpProcess, pooled: bool
) -> None:
    async def call(private_network: bool) -> str:
        pool = sessions.SessionPool() if pooled else None
        try:
            tool = remote.mcp_tool(admitted(server.url, private_network=private_network), pool=pool)
            return await tool.run({"a": 2, "b": 40}, CTX)
        finally:
            if pool is not None:
                await pool.aclose()

    before = [r for r in server.requests() if r["method"] == "tools/call"]
    with pytest.raises(ToolError) as caught:
        asyncio.run(call(False))
    assert caught.value.fault is ToolFault.CONNECTION
    assert caught.value.unsent  # known never sent: safe for a write, no effect_unknown
    assert [r for r in server.requests() if r["method"] == "tools/call"] == before
    assert asyncio.run(call(True)) == "42"


def test_a_host_is_resolved_once_and_the_checked_address_is_the_one_connected(
    server: mcp_support.McpProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name that answers a loopback address first and anything else after (DNS rebinding)
    is connected to the address that was checked: the backend never asks again."""
    port = URL(server.url).port
    assert port is not None
    lookups: list[str] = []
    real = asyncio.BaseEventLoop.getaddrinfo

    async def rebinding(self: Any, host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "tools.rebind.test":
            lookups.append(host)
            if len(lookups) > 1:  # a second answer would point elsewhere
                raise AssertionError("resolved twice")
            return await real(self, "127.0.0.1", *args, **kwargs)
        return await real(self, host, *args, **kwargs)

    monkeypatch.setattr(asyncio.BaseEventLoop, "getaddrinfo", rebinding)
    url = str(URL(server.url).with_host("tools.rebind.test"))

    async def fetch() -> int:
        transport = endpoint.CheckedTransport(private_network=True)
        async with httpx2.AsyncClient(transport=transport) as client:
            answer = await client.get(url)  # any answer proves the connection was made
            return answer.status_code

    assert asyncio.run(fetch()) < 500
    assert lookups == ["tools.rebind.test"]


@pytest.mark.parametrize(
    ("address", "private"),
    [("127.0.0.1", True), ("10.1.2.3", True), ("169.254.169.254", True), ("::1", True)],
)
def test_non_global_addresses_need_the_rules_private_network(address: str, private: bool) -> None:
    assert reach.check_address(address, private_network=False) is not None
    assert reach.check_address(address, private_network=private) is None
    assert reach.check_address("::ffff:127.0.0.1", private_network=False) is not None


@pytest.mark.parametrize(
    "address",
    [
        "64:ff9b::a9fe:a9fe",  # NAT64 well-known prefix → 169.254.169.254 (cloud metadata)
        "64:ff9b::a00:1",  # NAT64 → 10.0.0.1
        "64:ff9b::7f00:1",  # NAT64 → 127.0.0.1
        "64:ff9b:1::a9fe:a9fe",  # local-use NAT64: an internal gateway
        "2002:a9fe:a9fe::1",  # 6to4 → 169.254.169.254
        "2002:a00:1::1",  # 6to4 → 10.0.0.1
        "::ffff:0:a00:1",  # IPv4-translated → 10.0.0.1
        "::a00:1",  # IPv4-compatible → 10.0.0.1
        "fec0::1",  # site-local
        "2600::5efe:a9fe:a9fe",  # ISATAP under a global prefix → 169.254.169.254
        "2600::200:5efe:a00:1",  # ISATAP, universal bit set → 10.0.0.1
        "5f00::1",  # SRv6 segment identifier
        "3fff::1",  # documentation
        "ff02::1",  # multicast
    ],
)
def test_an_ipv6_address_carrying_a_private_ipv4_is_judged_as_that_address(address: str) -> None:
    """A NAT64 gateway, a 6to4 relay or a translator takes these to the IPv4 address they
    carry: the whole kind is judged by it, not by the standard library's ``is_global``."""
    assert reach.check_address(address, private_network=False) is not None
    assert reach.check_address(address, private_network=True) is None


@pytest.mark.parametrize("address", ["64:ff9b::808:808", "2002:808:808::1", "::ffff:8.8.8.8"])
def test_an_ipv6_address_carrying_a_global_ipv4_is_allowed(address: str) -> None:
    assert reach.check_address(address, private_network=False) is None


def test_a_refused_connection_is_an_httpx_connect_error(server: mcp_support.McpProcess) -> None:
    async def fetch() -> None:
        transport = endpoint.CheckedTransport(private_network=False)
        async with httpx2.AsyncClient(transport=transport) as client:
            await client.get(server.url)

    with pytest.raises(httpx2.ConnectError, match="loopback address"):
        asyncio.run(fetch())


def test_rules_match_host_port_and_path_exactly() -> None:
    rules = (UrlRule("tools.svc:8000", "/mcp"), UrlRule("[::1]"))
    assert reach.allowed_by(URL("http://tools.svc:8000/mcp"), rules) is rules[0]
    assert reach.allowed_by(URL("http://TOOLS.svc.:8000/mcp/x"), rules) is rules[0]
    for url in (
        "http://tools.svc:8001/mcp",
        "http://tools.svc:8000/other",
        "http://evil.tools.svc:8000/mcp",
        "http://user:pw@tools.svc:8000/mcp",
        "http://tools.svc:8000/mcp/../admin",
        "http://tools.svc:8000/mcp/..%5Cadmin",
        "http://tools.svc:8000/mcp%2F..%2Fadmin",
        "http://tools.svc:8000/mcp/%252e%252e/admin",
        "ftp://tools.svc:8000/mcp",
    ):
        assert reach.allowed_by(URL(url), rules) is None, url
    assert reach.allowed_by(URL("http://[::1]:9000/mcp"), rules) is rules[1]


def test_the_rule_goes_with_the_session_key() -> None:
    """Two runs whose rules differ never share a session."""
    one = remote.Endpoint("http://h/mcp", private_network=True)
    assert one.identity() != dataclasses.replace(one, private_network=False).identity()
    assert one.identity() != dataclasses.replace(one, path_prefix="/mcp").identity()
