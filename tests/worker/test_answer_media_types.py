"""A body is bounded as an event stream only when its media type is ``text/event-stream``.
Before, ``answers.bounded_answer`` and ``endpoint.CheckedTransport`` bounded a body as an event
stream (each event its own message: ``MAX_MESSAGE_BYTES``, ``MAX_MESSAGE_VALUES``) whenever
its content type *contains* ``text/event-stream``, while the reader decides by other rules:
the worker's ``read_stream`` parses the body as one JSON document whenever the type contains
``json``, the MCP SDK whenever it *starts with* ``application/json``. A peer answering
``Content-Type: application/json; x=text/event-stream`` with one JSON document that has a
blank line (JSON whitespace) every 50,000 values had the whole document parsed however many
values it held: 64 MiB of ``{}`` (some 22 million dicts, gigabytes) from a model endpoint,
16 MiB from a tool server, where ``MAX_MESSAGE_VALUES`` (131,072) was meant to hold."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import pytest
from aiohttp import web
from http_support import serving
from mcp_call_support import CallServer

from agentrun.metrics import ModelErrorType
from agentrun.protocol import RemoteTool
from agentrun.tools import ToolContext, ToolError, endpoint, remote

from .test_model import failed_call

TRICK = "application/json; x=text/event-stream"
VALUES = 500_000
"""JSON values in the body: almost four times ``MAX_MESSAGE_VALUES``."""


def spread(values: int) -> bytes:
    """``values`` empty objects in one JSON array, a blank line after every 50,000 (each
    counts two: its ``{`` and its comma)."""
    parts = []
    for start in range(0, values, 50_000):
        parts.append(b",".join([b"{}"] * min(50_000, values - start)))
    return b"[" + b",\n\n".join(parts) + b"]"


@pytest.mark.parametrize("content_type", ["application/json", TRICK], ids=["plain", "trick"])
async def test_a_model_answer_of_too_many_json_values_is_refused(content_type: str) -> None:
    """Expected (and seen with a plain type): the call ends ``invalid_response``, the answer
    refused unread. Seen with ``TRICK``: the 500,000 values parsed (the call then ends
    ``invalid_response`` only because the parsed answer is no completion)."""
    body = b'{"choices":[],"x":' + spread(VALUES) + b"}"

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=body, headers={"Content-Type": content_type})

    async with serving({"/v1/chat/completions": handler}) as base:
        error = await failed_call(f"{base}/v1")
    assert error.error_type is ModelErrorType.INVALID_RESPONSE, str(error)
    assert "JSON values" in str(error), str(error)


CTX = ToolContext(namespace="ns", run_name="run", run_uid="run-uid", call_id="call_0_0")


class Server(CallServer):
    def __init__(self, content_type: str) -> None:
        self.content_type = content_type

    async def answer_call(
        self, request: web.Request, message: dict[str, Any]
    ) -> web.StreamResponse:
        head = json.dumps({"jsonrpc": "2.0", "id": message["id"]}).encode()[:-1]
        body = (
            head
            + b',"result":{"content":[{"type":"text","text":"7"}],"isError":false,"x":'
            + spread(VALUES)
            + b"}}"
        )
        return web.Response(body=body, headers={"Content-Type": self.content_type})


@pytest.mark.parametrize("content_type", ["application/json", TRICK], ids=["plain", "trick"])
async def test_a_tool_answer_of_too_many_json_values_is_refused(content_type: str) -> None:
    """Expected (and seen with a plain type): the call fails, the answer refused unread.
    Seen with ``TRICK``: the 500,000 values parsed and the call answered ``7``."""
    server = Server(content_type)
    async with serving({"/mcp": server.handle}) as base:
        tool = RemoteTool(
            "h__add", "h", "add", "", {}, "read", f"{base}/mcp", "StreamableHTTP", timeout=20
        )
        tool = dataclasses.replace(tool, private_network=True)
        started = time.monotonic()
        with pytest.raises(ToolError) as caught:
            answer = await remote.mcp_tool(tool).run({}, CTX)
            pytest.fail(f"answered {answer!r} from {VALUES} JSON values")
    assert time.monotonic() - started < 15
    assert caught.value.message, caught.value


_ = endpoint
