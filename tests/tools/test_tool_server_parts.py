"""A tool server's answer sent in chunks of one byte is bounded by what its parts cost: each counts
``endpoint.MIN_PART_BYTES`` at least, and what it took on the wire when more (a chunk extension,
read and dropped by the HTTP parser), so a call so answered fails at once, as one answered with
a message over the bound does (the SDK reports it: a ``server`` fault). Before, the bounds
counted only the bytes the parts carried: 8,388,608 parts for one message, each behind 60 KB of
extension here, parsed on the worker's event loop until the call's timeout, which ended it
``timeout``."""

from __future__ import annotations

import dataclasses
import time

import pytest
from http_support import heads_first

from agentrun.kernel import ToolFault
from agentrun.protocol import RemoteTool
from agentrun.tools import ToolContext, ToolError, remote

CTX = ToolContext(namespace="ns", run_name="run", run_uid="run-uid", call_id="call_0_0")
TIMEOUT = 30.0
"""The call's timeout: what ended it before."""
HEADS = {
    "event-stream": b"text/event-stream",
    "json": b"application/json",
}


@pytest.mark.parametrize("media", HEADS.values(), ids=HEADS.keys())
async def test_an_answer_a_byte_a_chunk_behind_long_extensions_fails_at_once(media: bytes) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: " + media + b"\r\nTransfer-Encoding: chunked\r\n\r\n"
    part = b"1;e=" + b"a" * 60_000 + b"\r\nx\r\n"
    async with heads_first(0, head, forever=part) as base:
        tool = RemoteTool(
            "h__add", "h", "add", "", {}, "read", f"{base}/mcp", "StreamableHTTP", timeout=TIMEOUT
        )
        started = time.monotonic()
        with pytest.raises(ToolError) as raised:
            await remote.mcp_tool(dataclasses.replace(tool, private_network=True)).run({}, CTX)
        took = time.monotonic() - started
    assert raised.value.fault is ToolFault.SERVER, raised.value.message  # the SDK's MCPError
    assert "over 8388608 bytes" in raised.value.message
    assert took < TIMEOUT / 2
