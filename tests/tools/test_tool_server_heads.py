"""A tool server may send informational (1xx) heads before an answer, but not without end:
past ``heads.MAX_INFORMATIONAL`` of them the request fails a transport fault naming them, at
once, on a call and at discovery. Before, ``httpcore2`` read ``103 Early Hints`` for as long
as they came: a tenant's server sending them at network speed kept a core of the worker or
the operator (shared by every tenant) parsing heads until the call's or the discovery's
timeout, up to minutes, and the call then ended ``timeout``."""

from __future__ import annotations

import dataclasses
import time

import pytest
from http_support import heads_first

from agentrun.kernel import ToolFault
from agentrun.protocol import RemoteTool
from agentrun.tools import ToolContext, ToolError, endpoint, remote

CTX = ToolContext(namespace="ns", run_name="run", run_uid="run-uid", call_id="call_0_0")
TIMEOUT = 30.0
"""The call's and the discovery's timeout: what ended them before."""
WHY = "sent over 16 informational"


@pytest.mark.parametrize("transport", ["StreamableHTTP", "SSE"])
async def test_a_call_answered_with_heads_without_end_fails_at_once(transport: str) -> None:
    async with heads_first(None) as base:
        tool = RemoteTool(
            "h__add", "h", "add", "", {}, "read", f"{base}/mcp", transport, timeout=TIMEOUT
        )
        started = time.monotonic()
        with pytest.raises(ToolError) as raised:
            await remote.mcp_tool(dataclasses.replace(tool, private_network=True)).run({}, CTX)
        took = time.monotonic() - started
    assert raised.value.fault is ToolFault.TRANSPORT, raised.value.message
    assert WHY in raised.value.message
    assert took < TIMEOUT / 2


async def test_discovery_of_a_server_sending_heads_without_end_fails_saying_why() -> None:
    async with heads_first(None) as base:
        point = remote.Endpoint(
            f"{base}/mcp",
            endpoint.Transport.STREAMABLE_HTTP,
            {},
            timeout=TIMEOUT,
            private_network=True,
        )
        with pytest.raises(remote.RemoteError, match=WHY):
            await remote.discover(point)
