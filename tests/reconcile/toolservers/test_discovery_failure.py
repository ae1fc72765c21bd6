"""A discovery that fails by an error none of its branches expects (a bug, a fault of a kind
nobody named) is a failed discovery like any other: logged once naming the server, with its
traceback; the server's ``Ready`` condition says it; the next refresh tries again. (Its task
ended by the error unseen: no status, and asyncio's "Task exception was never retrieved" at
best, when the next refresh dropped the task.)"""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

import pytest
from kube_support import FakeKube

from agentrun import display
from agentrun.operator.toolservers import refresher
from agentrun.operator.toolservers.spec import TOOL_SERVERS
from agentrun.protocol import UrlRule
from agentrun.tools import remote

BODY = {
    "metadata": {"name": "tools", "namespace": "ns", "generation": 1},
    "spec": {
        "url": "http://tools.example/mcp",
        "tools": [{"name": "add"}],
        "refreshInterval": "1m",
    },
}


class FlakyReach:
    """The tenants' port: raises an unexpected error on its first call, then answers."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, namespace: str) -> tuple[str, tuple[UrlRule, ...]]:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("the tenants' index is broken")
        return "team-a", (UrlRule("tools.example", "/"),)


def ready_of(api: FakeKube) -> dict[str, Any]:
    stored = api.find(TOOL_SERVERS, "tools", "ns")
    assert stored is not None and "status" in stored, "no status was written"
    (ready,) = stored["status"]["conditions"]
    return dict(ready)


async def refreshed(tool_servers: refresher.ToolServerRefresher) -> None:
    """Start the due discoveries and wait for them to end, leaving their outcome unretrieved."""
    await tool_servers._start_due()
    running = [k.running for k in tool_servers._known.values() if k.running is not None]
    await asyncio.wait(running)


async def test_an_unexpected_discovery_error_is_logged_shown_and_retried(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def discover(endpoint: remote.Endpoint) -> list[remote.Discovered]:
        return [remote.Discovered("add", "", {"type": "object"})]

    monkeypatch.setattr(remote, "discover", discover)
    loop = asyncio.get_running_loop()
    unretrieved: list[dict[str, Any]] = []
    handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: unretrieved.append(context))
    api, reach, now = FakeKube(), FlakyReach(), [100.0]
    api.put(TOOL_SERVERS, BODY)
    tool_servers = refresher.ToolServerRefresher(api, reach=reach, clock=lambda: now[0])
    tool_servers.observe(BODY)
    try:
        with caplog.at_level(logging.INFO, logger="agentrun"):
            await refreshed(tool_servers)
            errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
            assert any(
                "AgentToolServer ns/tools" in r.getMessage()
                and "RuntimeError: the tenants' index is broken" in r.getMessage()
                for r in errors
            ), [r.getMessage() for r in caplog.records]
            ready = ready_of(api)
            assert (ready["status"], ready["reason"]) == ("False", "DiscoveryFailed")
            assert "the tenants' index is broken" in ready["message"]
            now[0] += 60 * (1 + refresher.JITTER) + 1  # the next refresh
            await refreshed(tool_servers)
            gc.collect()  # the first discovery's task, dropped, is collected
    finally:
        loop.set_exception_handler(handler)
    assert reach.calls == 2
    assert ready_of(api)["reason"] == "Discovered"
    assert unretrieved == []
    assert any("recovered" in r.getMessage() for r in caplog.records)


async def test_an_unexpected_discovery_error_quoting_a_secret_shows_it_redacted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The status (which whoever may read the AgentToolServer sees, the Secret's readers or
    not) and the log never carry a Secret value the operator read (``kube.secret_values`` adds
    each to ``display.KNOWN``), even quoted by an error no branch expects, and even across the
    cut of the status message."""
    secret = "hdr-tenant-a-0123456789abcdef"
    display.KNOWN.add(secret)  # what reading the AgentToolServer's headersFrom Secret does

    async def discover(endpoint: remote.Endpoint) -> list[remote.Discovered]:
        raise RuntimeError("p" * 920 + f" sent 'Authorization: Bearer {secret}'")

    monkeypatch.setattr(remote, "discover", discover)
    api = FakeKube()
    api.put(TOOL_SERVERS, BODY)
    tool_servers = refresher.ToolServerRefresher(api, reach=FlakyReach(), clock=lambda: 100.0)
    tool_servers.observe(BODY)
    await tool_servers.refresh(BODY)  # the tenants' port answers this one (``FlakyReach``)
    await tool_servers.refresh(BODY)
    message = ready_of(api)["message"]
    assert message.startswith("discovery failed: RuntimeError: ppp"), message
    assert secret[:8] not in message and "[redacted]" in message
