"""Discovery holds an AgentToolServer's session to its tenant's rule: an SSE server whose
``endpoint`` event names a path outside the rule's prefix (another tenant's, on a shared
gateway) gets no request there, and its ``Ready`` condition says why."""

from __future__ import annotations

import asyncio
import copy
import threading
from pathlib import Path
from typing import Any

import mcp_support
import pytest
from checks_support import counting_checks, ended_before_another
from kube_support import FakeKube

from agentrun.operator.platform.fairwork import FairWork
from agentrun.operator.toolservers import refresher
from agentrun.operator.toolservers.spec import TOOL_SERVERS
from agentrun.protocol import UrlRule
from agentrun.tools import remote


async def discovered(server: mcp_support.McpProcess, *, prefix: str) -> dict[str, Any]:
    """The ``Ready`` condition discovery writes for ``server`` under the rule
    ``127.0.0.1:<port>`` + ``prefix`` (private network: it listens on loopback)."""
    body = {
        "metadata": {"name": "tools", "namespace": "ns", "generation": 1},
        "spec": {"url": server.url, "transport": "SSE", "tools": [{"name": "add"}]},
    }

    async def rules(namespace: str) -> tuple[str, tuple[UrlRule, ...]]:
        return "team-a", (UrlRule(f"127.0.0.1:{server.port}", prefix, private_network=True),)

    api = FakeKube()
    api.put(TOOL_SERVERS, body)
    await refresher.ToolServerRefresher(api, reach=rules).refresh(body)
    stored = api.find(TOOL_SERVERS, "tools", "ns")
    assert stored is not None
    (ready,) = stored["status"]["conditions"]
    return dict(ready)


@pytest.mark.parametrize(
    ("message_path", "reason"),
    [("/b/messages/", "DiscoveryFailed"), ("/a/messages/", "Discovered")],
    ids=["outside-the-prefix", "inside-the-prefix"],
)
async def test_discovery_keeps_an_sse_session_under_the_rules_prefix(
    tmp_path: Path, message_path: str, reason: str
) -> None:
    with mcp_support.running(tmp_path, transport="sse", sse_paths=("/a/sse", message_path)) as s:
        ready = await discovered(s, prefix="/a/")
        posted = {r["path"] for r in s.requests()}
    assert ready["reason"] == reason
    if reason == "DiscoveryFailed":
        assert "'/b/messages/' is outside the tenant's rule" in ready["message"]
        assert "its path is not under /a/" in ready["message"]
        assert posted == set()
    else:
        assert posted == {"/a/messages/"}


HEAVY = {"allOf": [{}] * 1200}
"""An input schema whose first check takes most of the schemas' work budget."""


async def test_a_servers_input_schemas_take_the_check_threads_one_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check threads (``FairWork``) are shared by every tenant's schema checks (admission
    too) and hold a check to its end: a discovery's 128 allowlisted tools checked as one piece
    held a thread for all their schemas (new ones at every refresh: a server answers what it
    likes), and another tenant's run waited that long to be admitted. Each input schema is its
    own turn; another party's check waits for one at most."""
    tools = [f"t{i}" for i in range(8)]
    found = [
        remote.Discovered(name, "", {**copy.deepcopy(HEAVY), "title": f"refresh-{name}"})
        for name in tools
    ]

    async def discover(endpoint: remote.Endpoint) -> list[remote.Discovered]:
        return found

    async def rules(namespace: str) -> tuple[str, tuple[UrlRule, ...]]:
        return "team-a", (UrlRule("tools.example", "/"),)

    monkeypatch.setattr(remote, "discover", discover)
    body = {
        "metadata": {"name": "tools", "namespace": "ns", "generation": 1},
        "spec": {"url": "http://tools.example/mcp", "tools": [{"name": n} for n in tools]},
    }
    api = FakeKube()
    api.put(TOOL_SERVERS, body)
    first = threading.Event()
    started, done = counting_checks(monkeypatch, hold_first=first)
    checks = FairWork(threads=1)
    refreshing = asyncio.create_task(
        refresher.ToolServerRefresher(api, reach=rules, checks=checks).refresh(body)
    )
    try:
        behind = await ended_before_another(checks, "team-b", first, started, done)
        await refreshing
    finally:
        refreshing.cancel()
        checks.close()
    stored = api.find(TOOL_SERVERS, "tools", "ns")
    assert stored is not None and stored["status"]["toolCount"] == len(tools)
    assert behind == 1, f"another party's check ran after {behind} of the {len(tools)} schemas"
