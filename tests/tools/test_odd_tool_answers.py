"""Odd answers to a tools/call (deep nesting within every bound, in the result or in its
text, bytes that are not UTF-8, an answer for another request id, a huge error message) end
the call promptly with a typed fault or a result, never break the process. An answer under
another request id sent as a JSON body reaches no request: the call ends ``timeout`` (a server
may always stay silent that long); in an event stream the SDK takes it as the request's
answer."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import pytest
from aiohttp import web
from http_support import serving
from mcp_call_support import CallServer, answer

from agentrun.protocol import RemoteTool
from agentrun.tools import ToolContext, ToolError, remote

CTX = ToolContext(namespace="ns", run_name="run", run_uid="run-uid", call_id="call_0_0")


def _result(request_id: object, extra: bytes = b"") -> bytes:
    head = json.dumps({"jsonrpc": "2.0", "id": request_id}).encode()[:-1]
    return (
        head + b',"result":{"content":[{"type":"text","text":"7"}],"isError":false' + extra + b"}}"
    )


ANSWERS = {
    "deep": lambda rid: _result(rid, b',"x":' + b"[" * 20_000 + b"]" * 20_000),
    # text nested past the JSON parser's recursion limit beside structured content: the
    # renderer compares the two (seen: RecursionError out of the tool, a crash)
    "deep-text": lambda rid: _result(rid).replace(
        b'"7"}]', b'"' + b"[" * 100_000 + b"]" * 100_000 + b'"}],"structuredContent":{"a":1}'
    ),
    "not-utf8": lambda rid: _result(rid).replace(b'"7"', b'"\xff\xfe\x80"'),
    "other-id": lambda rid: _result(rid + 1000 if isinstance(rid, int) else "zz"),
    "huge-error": lambda rid: json.dumps(
        {"jsonrpc": "2.0", "id": rid, "error": {"code": -32000, "message": "e" * 7_000_000}}
    ).encode(),
    "error-not-string": lambda rid: json.dumps(
        {"jsonrpc": "2.0", "id": rid, "error": {"code": "x", "message": {"a": [1] * 10}}}
    ).encode(),
}


class Server(CallServer):
    def __init__(self, answer: str, sse: bool) -> None:
        self.answer = answer
        self.sse = sse

    async def answer_call(
        self, request: web.Request, message: dict[str, Any]
    ) -> web.StreamResponse:
        return await answer(request, ANSWERS[self.answer](message["id"]), sse=self.sse)


@pytest.mark.parametrize("sse", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("answer", sorted(ANSWERS))
async def test_an_odd_answer_ends_the_call_promptly(answer: str, sse: bool) -> None:
    server = Server(answer, sse)
    async with serving({"/mcp": server.handle}) as base:
        tool = RemoteTool(
            "h__add", "h", "add", "", {}, "read", f"{base}/mcp", "StreamableHTTP", timeout=10
        )
        tool = dataclasses.replace(tool, private_network=True)
        started = time.monotonic()
        try:
            outcome: object = await remote.mcp_tool(tool).run({}, CTX)
        except ToolError as err:
            outcome = (err.fault, err.message[:200])
        took = time.monotonic() - started
    if answer == "other-id" and not sse:  # routed to no request: the call's timeout, typed
        assert isinstance(outcome, tuple) and outcome[0].value == "timeout", outcome
        return
    assert took < 8, (took, outcome)
    if answer == "deep-text":  # an answer: its text, and the structured content after it
        assert isinstance(outcome, str) and outcome.endswith(']]\n{"a":1}'), outcome[-50:]
