"""A tenant's reach is its AgentTenant's to set: an AgentToolServer whose URL the tenant's
``spec.toolServers`` rules do not allow is never contacted (discovery) and its tools never
admitted; one on a private address is refused unless the rule allows private networks; and
``headersFrom`` sends the Secret's listed keys only — as a user drives it, with kubectl, a
real MCP server and the scripted model."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from pathlib import Path

import mcp_support
import pytest
import yaml

from . import test_tenants
from .conftest import E2EStack, run_manifest
from .test_mcp_tools import ready, tool_server, wait_server
from .test_tenants import TenantFactory

pytestmark = pytest.mark.e2e

tenants = test_tenants.tenants
"""The AgentTenant fixture: ``tenants(name, namespaces, **spec)``."""


@pytest.fixture
def mcp(tmp_path: Path) -> Iterator[mcp_support.McpProcess]:
    """A server of the test's own: what reached it is the test's alone."""
    with mcp_support.running(tmp_path) as server:
        yield server


# The servers are named "tools": the E2E-MCP-ADD scenario calls tools__add.


def tenant_name() -> str:
    return f"reach-{uuid.uuid4().hex[:6]}"


def test_a_tool_server_whose_host_the_tenant_does_not_list_is_never_contacted(
    stack_: E2EStack, test_namespace: str, tenants: TenantFactory, mcp: mcp_support.McpProcess
) -> None:
    tenant = tenants(
        tenant_name(), [test_namespace], toolServers={"allow": [{"host": "tools.example.com"}]}
    )
    stack_.apply(test_namespace, tool_server("outside", mcp.url, {"name": "add"}))
    status = wait_server(stack_, test_namespace, "outside", "NotAllowed")
    message = ready(status)["message"]
    assert f"is not allowed by AgentTenant {tenant!r}" in message
    assert "spec.toolServers.allow: tools.example.com/" in message
    assert status["tools"] == []
    stack_.apply(test_namespace, run_manifest("reach-out", "E2E-MCP-ADD", tools=["outside/add"]))
    run = stack_.wait_terminal(test_namespace, "reach-out")
    assert run["terminalReason"] == "invalid_spec"
    assert "spec.tools: outside/add: AgentToolServer 'outside': spec.url: " in run["message"]
    assert mcp.requests() == []  # neither the operator nor a worker ever connected


def test_a_private_address_is_refused_until_the_rule_allows_private_networks(
    stack_: E2EStack, test_namespace: str, tenants: TenantFactory, mcp: mcp_support.McpProcess
) -> None:
    name = tenant_name()
    tenants(name, [test_namespace], toolServers={"allow": [{"host": "127.0.0.1"}]})
    stack_.apply(
        test_namespace, tool_server("tools", mcp.url, {"name": "add"}, refreshInterval="1s")
    )
    status = wait_server(stack_, test_namespace, "tools", "DiscoveryFailed")
    assert "127.0.0.1 is a loopback address" in ready(status)["message"]
    stack_.apply(test_namespace, run_manifest("too-near", "E2E-MCP-ADD", tools=["tools/add"]))
    refused = stack_.wait_terminal(test_namespace, "too-near")
    assert refused["terminalReason"] == "invalid_spec"
    assert "loopback address" in refused["message"]
    assert mcp.requests() == []

    allow = [{"host": "127.0.0.1", "privateNetwork": True}]
    tenants(name, [test_namespace], toolServers={"allow": allow})
    wait_server(stack_, test_namespace, "tools", "Discovered")
    stack_.apply(test_namespace, run_manifest("near", "E2E-MCP-ADD", tools=["tools/add"]))
    run = stack_.wait_terminal(test_namespace, "near")
    assert (run["terminalReason"], run.get("answer")) == ("completed", "2 + 40 = 42"), run
    assert "tools/call" in {r["method"] for r in mcp.requests()}  # the worker's call went


def test_headers_from_sends_the_listed_keys_of_the_secret_and_no_other(
    stack_: E2EStack, test_namespace: str, mcp: mcp_support.McpProcess
) -> None:
    values = {"Authorization": "Bearer listed", "X-Team": "qa", "apiKey": "sk-NEVER-SENT"}
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "tool-auth"},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in values.items()},
    }
    stack_.kubectl("apply", "-n", test_namespace, "-f", "-", input=yaml.safe_dump(secret))
    headers = {"secretRef": {"name": "tool-auth"}, "keys": ["Authorization", "X-Team"]}
    stack_.apply(
        test_namespace, tool_server("tools", mcp.url, {"name": "add"}, headersFrom=headers)
    )
    wait_server(stack_, test_namespace, "tools", "Discovered")
    stack_.apply(test_namespace, run_manifest("authed", "E2E-MCP-ADD", tools=["tools/add"]))
    run = stack_.wait_terminal(test_namespace, "authed")
    assert (run["terminalReason"], run.get("answer")) == ("completed", "2 + 40 = 42"), run
    seen = mcp.requests()
    methods = {r["method"] for r in seen}
    assert {"tools/list", "tools/call"} <= methods  # the operator's discovery, a worker's call
    for request in seen:
        assert request["authorization"] == "Bearer listed", request
        assert "x-team" in request["headers"] and "apikey" not in request["headers"], request

    stale = {"secretRef": {"name": "tool-auth"}}  # written before keys were required
    refused = stack_.kubectl(
        "apply",
        "-n",
        test_namespace,
        "-f",
        "-",
        input=yaml.safe_dump(tool_server("stale", mcp.url, {"name": "add"}, headersFrom=stale)),
        check=False,
    )
    assert refused.returncode != 0 and "spec.headersFrom.keys: Required value" in refused.stderr
