"""Tool-call arguments that an answer sent whole holds as a JSON object (not the string the
OpenAI contract has) are measured and repaired as parsed ones are: a lone surrogate
(``"\\ud800"``, which JSON allows) is replaced, so the turn's event encodes as UTF-8. Before,
measuring them raised on the surrogate, and the call of 30 bytes was dropped as "262145 bytes,
over the 65536-byte cap"."""

from __future__ import annotations

from aiohttp import web

from agentrun import kernel
from agentrun.protocol import events, subjects

from .rawmodel import one_turn, serve

USAGE = b'"usage":{"prompt_tokens":20,"completion_tokens":5,"total_tokens":25}}'


def answer_with(arguments: bytes) -> bytes:
    """A whole answer calling ``calculate`` with ``arguments`` (raw JSON: an object)."""
    return (
        b'{"choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant",'
        b'"tool_calls":[{"id":"call_1","type":"function","function":{"name":"calculate",'
        b'"arguments":' + arguments + b"}}]}}]," + USAGE
    )


async def one_call(body: bytes) -> kernel.Answered:
    """The committed-to-be record of one turn answered with ``body``, checked to encode (the
    turn can commit)."""

    async def whole(request: web.Request) -> web.StreamResponse:
        await request.json()
        return web.Response(body=body, content_type="application/json")

    limits = kernel.Limits(max_tokens=100_000, max_output_tokens=1000)
    async with serve(whole) as url:
        record, state = await one_turn(url, limits=limits, tools=("calculate",))
    assert state.phase is kernel.Phase.RUNNING, state.message
    assert isinstance(record, kernel.Answered)
    assert subjects.dumps(events.record_as_dict(record))
    return record


async def test_object_arguments_with_a_lone_surrogate_are_repaired() -> None:
    record = await one_call(answer_with(b'{"expression":"1+1 \\ud800"}'))
    (call,) = record.calls
    assert isinstance(call, kernel.CheckedCall)
    assert call.arguments["expression"].startswith("1+1 \ufffd")  # as a string's is repaired


async def test_deep_object_arguments_are_a_correction() -> None:
    """The decision keeps them as text: nothing deep reaches the turn's event."""
    depth = 900
    record = await one_call(answer_with(b'{"expression":' + b"[" * depth + b"]" * depth + b"}"))
    (call,) = record.calls
    assert isinstance(call, kernel.InvalidCall) and "nested deeper" in call.error
    assert isinstance(record.decision, kernel.ToolCalls)
    assert all(isinstance(c.arguments, str) for c in record.decision.calls)
