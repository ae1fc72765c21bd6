"""MCP tool servers end to end: an AgentToolServer applied with kubectl is discovered by the
operator, its tools are called by the workers for AgentRuns that name them, and what is not
granted is never called."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp_support
import pytest
import yaml

from agentrun.protocol import RemoteTool
from agentrun.tools import ToolContext, remote

from .conftest import E2EStack, run_manifest

pytestmark = pytest.mark.e2e


def tool_server(name: str, url: str, *tools: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentToolServer",
        "metadata": {"name": name},
        "spec": {"url": url, "tools": list(tools), **spec},
    }


def server_status(stack_: E2EStack, namespace: str, name: str) -> dict[str, Any]:
    result = stack_.kubectl("get", "agenttoolserver", name, "-n", namespace, "-o", "json")
    status: dict[str, Any] = json.loads(result.stdout).get("status") or {}
    return status


def ready(status: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})


def wait_server(
    stack_: E2EStack, namespace: str, name: str, reason: str, *, timeout: float = 30
) -> dict[str, Any]:
    end = time.monotonic() + timeout
    status: dict[str, Any] = {}
    while time.monotonic() < end:
        status = server_status(stack_, namespace, name)
        if ready(status).get("reason") == reason:
            return status
        time.sleep(0.25)
    raise AssertionError(f"AgentToolServer {name} never got {reason}: {status}")


def grow_tool_list(url: str) -> None:
    """Call the test server's ``grow`` tool (it then lists ``extra`` too)."""
    tool = RemoteTool(
        "grow", "flaky", "grow", "", {}, "read", url, "StreamableHTTP", 10.0, private_network=True
    )
    ctx = ToolContext(namespace="ns", run_name="test", run_uid="test", call_id="grow")
    assert asyncio.run(remote.mcp_tool(tool).run({}, ctx)) == "grown"


@pytest.fixture(scope="module")
def mcp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[mcp_support.McpProcess]:
    with mcp_support.running(tmp_path_factory.mktemp("mcp")) as server:
        yield server


def test_a_tool_server_is_discovered_and_its_granted_tool_called_by_a_run(
    stack_: E2EStack, test_namespace: str, mcp: mcp_support.McpProcess
) -> None:
    stack_.apply(
        test_namespace,
        tool_server(
            "tools",
            mcp.url,
            {"name": "add"},
            {"name": "count", "effect": "write"},
            {"name": "slow"},
        ),
    )
    status = wait_server(stack_, test_namespace, "tools", "Discovered")
    assert [t["name"] for t in status["tools"]] == ["add", "count", "slow"]
    assert status["toolCount"] == 3 and status["lastRefreshTime"]
    add_schema = status["tools"][0]["inputSchema"]
    assert add_schema["properties"]["a"]["type"] == "integer"
    table = stack_.kubectl("get", "agenttoolservers", "-n", test_namespace).stdout
    assert "Discovered" in table and mcp.url in table

    # the goal names the namespace: the model's log holds other tests' E2E-MCP-ADD runs too
    goal = f"E2E-MCP-ADD {test_namespace}"
    stack_.apply(test_namespace, run_manifest("mcp-add", goal, tools=["tools/add"]))
    run = stack_.wait_terminal(test_namespace, "mcp-add")
    assert (run["terminalReason"], run["answer"]) == ("completed", "2 + 40 = 42"), run
    requests = [r for r in stack_.mock_requests() if goal in str(r["body"])]
    (offered,) = requests[0]["body"]["tools"]
    assert offered["function"]["name"] == "tools__add"
    assert offered["function"]["parameters"] == add_schema  # the model sees the real schema
    results = [m for m in requests[-1]["body"]["messages"] if m["role"] == "tool"]
    assert results[0]["content"] == "42"
    assert results[1]["content"].startswith("ERROR: ")  # tools__count: not the run's tool
    assert "sneaky" not in mcp.counts()  # ...and never called


def test_a_tool_the_tenant_does_not_grant_is_refused_before_the_run_starts(
    stack_: E2EStack, mcp: mcp_support.McpProcess
) -> None:
    namespace = f"mcp-tenant-{uuid.uuid4().hex[:6]}"
    tenant = f"mcp-{uuid.uuid4().hex[:6]}"
    stack_.kubectl("create", "namespace", namespace)
    manifest = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentTenant",
        "metadata": {"name": tenant},
        "spec": {
            "namespaces": [namespace],
            "allowedTools": ["tools/add", "calculate"],
            "toolServers": {"allow": [{"host": "127.0.0.1", "privateNetwork": True}]},
        },
    }
    stack_.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))
    try:
        stack_.apply(namespace, tool_server("tools", mcp.url, {"name": "add"}, {"name": "count"}))
        wait_server(stack_, namespace, "tools", "Discovered")
        stack_.apply(namespace, run_manifest("greedy", "E2E-MCP-ADD", tools=["tools/count"]))
        run = stack_.wait_terminal(namespace, "greedy")
        assert run["terminalReason"] == "invalid_spec"
        assert "tools/count not allowed by AgentTenant" in run["message"]
    finally:
        stack_.kubectl("delete", "agenttenant", tenant, "--ignore-not-found", check=False)
        stack_.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


SECOND = ("mcp-restart", 1)
"""The model request of the restart scenario's second turn (scenario name, turn index)."""


def test_a_run_completes_across_a_restart_of_its_tool_server(
    stack_: E2EStack, test_namespace: str, tmp_path: Path
) -> None:
    # a handshake-era server: its sessions have ids, which a restart forgets (HTTP 404)
    with mcp_support.running(tmp_path, era="legacy") as again:
        stack_.apply(
            test_namespace,
            tool_server("again", again.url, {"name": "add"}, {"name": "count", "effect": "write"}),
        )
        wait_server(stack_, test_namespace, "again", "Discovered")
        tools = ["again/add", "again/count", "sleep"]
        stack_.apply(test_namespace, run_manifest("restart", "E2E-MCP-RESTART", tools=tools))
        # the model is asked for the second turn once the first call's answer is in: the
        # server's own log shows the call when it arrives, and a restart then would cut it
        end = time.monotonic() + 30
        while not [r for r in stack_.mock_requests() if (r["scenario"], r["turn"]) == SECOND]:
            assert time.monotonic() < end, "the first call's result never reached the model"
            time.sleep(0.1)
        again.restart()  # while the run's second turn sleeps
        run = stack_.wait_terminal(test_namespace, "restart")
        assert (run["terminalReason"], run["answer"]) == ("completed", "recovered"), run
        assert again.counts() == {"after-restart": 1}  # the write happened exactly once
        requests = [r for r in stack_.mock_requests() if "E2E-MCP-RESTART" in str(r["body"])]
        results = [m["content"] for m in requests[-1]["body"]["messages"] if m["role"] == "tool"]
        assert results[0] == "3" and results[-2] == "7"
        assert results[-1].startswith("after-restart=1 key=")


def test_a_changing_list_a_lost_server_and_a_tool_that_stays_down(
    stack_: E2EStack, test_namespace: str, tmp_path: Path
) -> None:
    with mcp_support.running(tmp_path) as flaky:
        stack_.apply(
            test_namespace,
            tool_server(
                "flaky", flaky.url, {"name": "add"}, {"name": "extra"}, refreshInterval="1s"
            ),
        )
        status = wait_server(stack_, test_namespace, "flaky", "ToolsMissing")
        assert "does not offer extra" in ready(status)["message"]
        grow_tool_list(flaky.url)  # the server grows the allowlisted tool: a refresh finds it
        wait_server(stack_, test_namespace, "flaky", "Discovered")
    # the server is gone: the last good list is kept, and a run may still be admitted with it
    status = wait_server(stack_, test_namespace, "flaky", "RefreshFailed")
    assert [t["name"] for t in status["tools"]] == ["add", "extra"]
    stack_.apply(test_namespace, run_manifest("down", "E2E-MCP-DOWN", tools=["flaky/add"]))
    run = stack_.wait_terminal(test_namespace, "down", timeout=90)
    assert run["terminalReason"] == "tool_unavailable", run
    assert "flaky__add failed for infrastructure reasons" in run["message"]
    assert run["usage"]["steps"] == 3  # three turns in a row, each after its retries


def test_a_run_waiting_for_its_tool_servers_discovery_is_queued_and_holds_up_nobody(
    stack_: E2EStack, test_namespace: str
) -> None:
    """Finding 6: the wait for an AgentToolServer's first discovery was an ERROR log line every
    2 s. Now the run shows Queued (Admitted=False, reason ToolServerPending) with a Queued
    Event, and a run applied after it in the same tenant starts meanwhile."""
    with socket.socket() as hole:  # accepts connections, never answers: discovery hangs
        hole.bind(("127.0.0.1", 0))
        hole.listen()
        url = f"http://127.0.0.1:{hole.getsockname()[1]}/mcp"
        server = tool_server("slowdisc", url, {"name": "add"}, timeouts={"discovery": "20s"})
        stack_.apply(test_namespace, server)
        stack_.apply(
            test_namespace, run_manifest("waits", "E2E-MCP-ADD waits", tools=["slowdisc/add"])
        )
        stack_.apply(test_namespace, run_manifest("goes", f"E2E-429 goes {test_namespace}"))
        waiting = stack_.wait_for(
            test_namespace,
            "waits",
            lambda s: any(
                c.get("reason") == "ToolServerPending" for c in s.get("conditions") or []
            ),
            timeout=15,
        )
        assert waiting["phase"] == "Queued" and "not discovered yet" in waiting["message"]
        assert stack_.wait_terminal(test_namespace, "goes")["terminalReason"] == "completed"
        events = json.loads(
            stack_.kubectl("get", "events", "-n", test_namespace, "-o", "json").stdout
        )["items"]
        queued = [
            e for e in events if e["involvedObject"]["name"] == "waits" and e["reason"] == "Queued"
        ]
        assert queued and "ToolServerPending" in queued[0]["message"]
        assert queued[0]["type"] == "Normal"
    # once discovery fails (nothing answered), the run cannot run: it ends naming the field
    ended = stack_.wait_terminal(test_namespace, "waits", timeout=60)
    assert ended["terminalReason"] == "invalid_spec" and "slowdisc" in ended["message"]
