"""The refresher keeps the AgentToolServers as last seen within ``BODIES_MEMORY``: each one's
status holds its tools' input schemas and descriptions, as its server listed them, and every
server's object was kept whole for as long as it existed (here 60 servers, each status one
27 KB schema of 9,000 objects: 38 MiB kept; a status at its 512 KiB bound of such schemas,
some 11 MiB each). One forgotten is read again when its discovery is due."""

from __future__ import annotations

import asyncio
import gc
import json
import tracemalloc
from typing import Any

import pytest
from kube_support import FakeKube

from agentrun.operator.toolservers import refresher
from agentrun.operator.toolservers.spec import TOOL_SERVERS
from agentrun.protocol import UrlRule
from agentrun.tools import remote

SERVERS = 60
MEMORY = 4 * 2**20
DENSE = {"type": "object", "x": [{}] * 9_000}
"""An input schema the platform accepts (under 10,000 objects and arrays): 27 KB of JSON,
some 650 KB parsed."""


def server(i: int) -> dict[str, Any]:
    """Server ``i`` as the watch hands it over: parsed from its JSON, each object its own."""
    tool = {"name": "t0", "effect": "read", "description": "d" * 4096, "inputSchema": DENSE}
    body = {
        "metadata": {"name": f"s{i}", "namespace": "team-a", "generation": 1},
        "spec": {"url": "http://tools.example/mcp", "tools": [{"name": "t0"}]},
        "status": {"tools": [tool], "toolCount": 1, "lastRefreshTime": "2026-12-07T00:00:00Z"},
    }
    parsed: dict[str, Any] = json.loads(json.dumps(body))
    return parsed


class Reach:
    async def __call__(self, namespace: str) -> tuple[str, tuple[UrlRule, ...]]:
        return "team-a", (UrlRule("tools.example", "/"),)


async def test_the_servers_as_last_seen_take_bounded_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(refresher, "BODIES_MEMORY", MEMORY)
    tool_servers = refresher.ToolServerRefresher(FakeKube(), reach=Reach())
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(SERVERS):
            tool_servers.observe(server(i))
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < MEMORY + 2 * 2**20, f"kept {kept / 2**20:.0f} MiB of {SERVERS} servers"


async def test_a_server_forgotten_is_read_again_when_due(monkeypatch: pytest.MonkeyPatch) -> None:
    async def discover(endpoint: remote.Endpoint) -> list[remote.Discovered]:
        return [remote.Discovered("t0", "fresh", {"type": "object"})]

    monkeypatch.setattr(remote, "discover", discover)
    monkeypatch.setattr(refresher, "BODIES_MEMORY", MEMORY)
    api = FakeKube()
    tool_servers = refresher.ToolServerRefresher(api, reach=Reach(), clock=lambda: 100.0)
    for i in range(12):
        tool_servers.observe(api.put(TOOL_SERVERS, server(i)))
    api.objects.pop((TOOL_SERVERS, "team-a", "s1"))  # deleted; the watch has not told
    await tool_servers._start_due()
    await asyncio.wait([k.running for k in tool_servers._known.values() if k.running])
    read = {ref.name for verb, ref in api.calls if verb == "get"}
    assert "s0" in read and "s11" not in read  # the first seen forgotten, the last kept
    assert ("team-a", "s1") not in tool_servers._known  # found gone: forgotten
    for i in (0, 11):
        stored = api.find(TOOL_SERVERS, f"s{i}", "team-a") or {}
        assert [t["description"] for t in stored["status"]["tools"]] == ["fresh"]
