"""A model endpoint is a tenant's peer at worst: what it streams into a worker shared by every
tenant is bounded as a whole, not only message by message. One answer (an event stream or a
JSON body) is read to at most ``answers.MAX_ANSWER_BYTES`` and ``answers.MAX_ANSWER_MESSAGES``
(an ``invalid_response``, charged what it delivered), and what its chunks fold into keeps at
most ``kernel.MAX_CALLS_PER_REPLY`` + 1 tool calls, each id at most
``kernel.PLACEHOLDER_CHARS`` + 1 characters: chunks that carry no output used to be read until
the run's deadline, and tool-call parts that carry only an id were kept without a bound."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from aiohttp import web
from http_support import serving

from agentrun import kernel
from agentrun.metrics import ModelErrorType
from agentrun.worker import answers
from agentrun.worker.delivery import Delivery

from .test_model import failed_call


def test_tool_call_parts_that_carry_only_ids_are_kept_bounded() -> None:
    """10,000 chunks each naming a new tool call by a 4 KiB id and nothing else (no output:
    never cut by the allowance) keep no more calls than the classifier needs to refuse the
    reply, and no id longer than the classifier would keep."""
    delivery = Delivery()
    for index in range(10_000):
        part = {"index": index, "id": "i" * 4096, "type": "function"}
        delivery.add({"choices": [{"index": 0, "delta": {"tool_calls": [part]}}]})
    assert len(delivery.calls) <= kernel.MAX_CALLS_PER_REPLY + 1
    assert max(len(call.id) for call in delivery.calls.values()) <= kernel.PLACEHOLDER_CHARS + 1
    decision = kernel.classify(delivery.completion())
    assert isinstance(decision, kernel.Malformed)
    assert decision.cause is kernel.MalformedCause.TOO_MANY_CALLS


def test_a_bounded_reply_still_keeps_every_call_and_its_id() -> None:
    delivery = Delivery()
    for index in range(3):
        part = {"index": index, "id": f"call-{index}", "function": {"name": "f", "arguments": "{}"}}
        delivery.add({"choices": [{"index": 0, "delta": {"tool_calls": [part]}}]})
    calls = delivery.message()["tool_calls"]
    assert [call["id"] for call in calls] == ["call-0", "call-1", "call-2"]


async def endless(request: web.Request, event: bytes) -> web.StreamResponse:
    """``event`` written for ever (until the client leaves), a thousand at a time."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    burst = event * 1000
    try:
        while True:
            await response.write(burst)
            await asyncio.sleep(0)
    except (ConnectionError, asyncio.CancelledError):
        pass
    return response


EMPTY = b'data: {"choices":[]}\n\n'
"""A chunk that carries no output: never cut by the allowance."""
JUNK = b'data: {"choices":[],"x":"' + b"j" * 16_000 + b'"}\n\n'
"""A chunk of 16 KB that carries no output."""


@pytest.mark.parametrize(
    ("event", "bound"),
    [
        pytest.param(EMPTY, "MAX_ANSWER_MESSAGES", id="many-empty-chunks"),
        pytest.param(JUNK, "MAX_ANSWER_BYTES", id="many-large-chunks"),
    ],
)
async def test_an_endless_stream_without_output_ends_the_call_invalid_response(
    monkeypatch: pytest.MonkeyPatch, event: bytes, bound: str
) -> None:
    """Bounds lowered so the test is quick (the defaults: 262,144 messages, 64 MiB); before
    them the call read on until its deadline (``deadline``, 10 s here)."""
    monkeypatch.setattr(answers, "MAX_ANSWER_MESSAGES", 20_000)
    monkeypatch.setattr(answers, "MAX_ANSWER_BYTES", 8 * 1024 * 1024)

    async def handler(request: web.Request) -> web.StreamResponse:
        return await endless(request, event)

    started = time.monotonic()
    async with serving({"/v1/chat/completions": handler}) as base:
        error = await failed_call(f"{base}/v1")
    assert error.error_type is ModelErrorType.INVALID_RESPONSE, str(error)
    assert "refused unread" in str(error) and "in all" in str(error), str(error)
    assert time.monotonic() - started < 8


async def test_a_long_answer_within_the_bounds_is_read_whole() -> None:
    """4,000 content chunks (about a token each) pass: the bounds are far above a real
    answer's."""
    chunks = [{"choices": [{"index": 0, "delta": {"content": "ab"}}]}] * 4000
    body = b"".join(f"data: {json.dumps(chunk)}\n\n".encode() for chunk in chunks)
    assert len(body) < answers.MAX_ANSWER_BYTES and len(chunks) < answers.MAX_ANSWER_MESSAGES
    assert answers.MAX_ANSWER_BYTES == 64 * 1024 * 1024
    assert answers.MAX_ANSWER_MESSAGES == 262_144


LONG_INT = b'{"choices":[],"x":' + b"1" * 5000 + b"}"
"""Python's JSON parser refuses an integer of over 4,300 digits with a plain ``ValueError``."""
DEEP = b'{"choices":[],"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
"""100,000 nested arrays (200 KB, within every bound): a ``RecursionError`` of the parser."""


@pytest.mark.parametrize("body", [LONG_INT, DEEP], ids=["long-integer", "deep-nesting"])
@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "json-body"])
async def test_an_answer_the_parser_refuses_is_an_invalid_response(
    body: bytes, streamed: bool
) -> None:
    """Before: the parser's ``ValueError`` or ``RecursionError`` escaped the model client; the
    worker took it for a bug, asked the model again and ended the run ``checkpoint_failed``
    with a traceback in its log."""

    async def handler(request: web.Request) -> web.StreamResponse:
        kind = "text/event-stream" if streamed else "application/json"
        response = web.StreamResponse(headers={"Content-Type": kind})
        await response.prepare(request)
        await response.write(b"data: " + body + b"\n\n" if streamed else body)
        await response.write_eof()
        return response

    async with serving({"/v1/chat/completions": handler}) as base:
        error = await failed_call(f"{base}/v1")
    assert error.error_type is ModelErrorType.INVALID_RESPONSE, str(error)
    assert "could not be parsed" in str(error), str(error)


NO_OUTPUT = b'data: {"choices":[]}'
LAST = (
    b'data: {"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}\n\n'
)


@pytest.mark.parametrize(
    "event_end",
    [b"\n\r", b"\r\n\r", b"\r\n\n", b"\r\r"],
    ids=["LF-CR", "CRLF-CR", "CRLF-LF", "CR-CR"],
)
async def test_chunks_however_their_events_end_meet_the_message_bound(
    monkeypatch: pytest.MonkeyPatch, event_end: bytes
) -> None:
    """100,000 chunks carrying no output (2.2 MB), each ended by two line ends the ``openai``
    client reads as an empty line, a ``\\n\\n`` every 1,000; then a real one. Bound lowered to
    20,000 messages. Before: ``\\n\\r`` and ``\\r\\n\\r`` were not counted, and all 100,000
    chunks were parsed and the call answered."""
    monkeypatch.setattr(answers, "MAX_ANSWER_MESSAGES", 20_000)

    async def answer(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        block = (NO_OUTPUT + event_end) * 999 + NO_OUTPUT + b"\n\n"
        for _ in range(100):
            await response.write(block)
        await response.write(LAST)
        await response.write_eof()
        return response

    async with serving({"/v1/chat/completions": answer}) as base:
        error = await failed_call(f"{base}/v1")
    assert error.error_type is ModelErrorType.INVALID_RESPONSE, str(error)
    assert "over 20000 messages in all" in str(error), str(error)
