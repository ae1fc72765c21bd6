"""Discovery holds an AgentToolServer's session to its tenant's rule: an SSE server whose
``endpoint`` event names a path outside the rule's prefix (another tenant's, on a shared
gateway) gets no request there, and its ``Ready`` condition says why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mcp_support
import pytest
from kube_support import FakeKube

from agentrun.operator.toolservers import refresher
from agentrun.operator.toolservers.spec import TOOL_SERVERS
from agentrun.protocol import UrlRule


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
