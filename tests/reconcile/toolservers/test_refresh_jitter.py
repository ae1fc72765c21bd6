"""AgentToolServers made together do not keep refreshing together: each server's next
discovery is due ``spec.refreshInterval`` after its last plus up to a tenth of it, drawn anew
at each discovery (before, 50 servers made in one ``kubectl apply`` were discovered in the same
tick at every interval, for as long as they lived)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kube_support import FakeKube

from agentrun.operator.toolservers import refresher
from agentrun.operator.toolservers.spec import TOOL_SERVERS
from agentrun.protocol import UrlRule
from agentrun.tools import remote

SERVERS = 50
INTERVAL = 100.0


def server(index: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"tools-{index}", "namespace": "ns", "generation": 1},
        "spec": {"url": "http://tools.example/mcp", "refreshInterval": "100s"},
    }


async def allowed(namespace: str) -> tuple[str, tuple[UrlRule, ...]]:
    return "team-a", (UrlRule("tools.example", "/"),)


async def due_at(tool_servers: refresher.ToolServerRefresher, at: float) -> int:
    """How many discoveries start when the refresher looks at ``at`` (each let end)."""
    before = {key: known.running for key, known in tool_servers._known.items()}
    await tool_servers._start_due()
    started = [
        known.running
        for key, known in tool_servers._known.items()
        if known.running is not None and known.running is not before[key]
    ]
    if started:
        await asyncio.wait(started)
    return len(started)


async def test_servers_made_together_are_discovered_apart_at_the_next_intervals(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def discover(endpoint: remote.Endpoint) -> list[remote.Discovered]:
        return [remote.Discovered("add", "", {"type": "object"})]

    monkeypatch.setattr(remote, "discover", discover)
    api, now = FakeKube(), [1000.0]
    tool_servers = refresher.ToolServerRefresher(api, reach=allowed, clock=lambda: now[0])
    for index in range(SERVERS):
        api.put(TOOL_SERVERS, server(index))
        tool_servers.observe(server(index))
    assert await due_at(tool_servers, now[0]) == SERVERS  # each new one at once
    counts: list[int] = []
    while now[0] < 1000.0 + 3.5 * INTERVAL:  # the refresher's ticks for three intervals more
        now[0] += refresher.TICK
        counts.append(await due_at(tool_servers, now[0]))
    assert sum(counts) == 3 * SERVERS  # each server three times
    assert max(counts) < SERVERS / 2, f"a tick started {max(counts)} of {SERVERS} discoveries"
