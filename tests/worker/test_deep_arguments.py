"""A streamed tool call whose arguments nest thousands of levels deep (10 kB, within every
byte bound) is a correction, not an error out of the turn (before: ``RecursionError`` from the
argument parser; the run ended ``checkpoint_failed`` on the turn's second failure)."""

from __future__ import annotations

from aiohttp import web

from agentrun import kernel

from .rawmodel import chunk, one_turn, serve, sse

DEPTH = 5000
USAGE = {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25}


async def deep_call(request: web.Request) -> web.StreamResponse:
    await request.json()
    arguments = '{"expression": ' + "[" * DEPTH + "]" * DEPTH + "}"
    call = {"index": 0, "id": "c1", "type": "function"}
    call["function"] = {"name": "calculate", "arguments": arguments}
    chunks = [chunk({"tool_calls": [call]}), chunk(finish="tool_calls")]
    return await sse(request, [*chunks, chunk(choices=False, usage=USAGE)])


async def test_deeply_nested_arguments_are_a_correction() -> None:
    limits = kernel.Limits(max_tokens=100_000, max_output_tokens=4000)
    async with serve(deep_call) as url:
        record, state = await one_turn(url, limits=limits, tools=("calculate",))
    assert state.phase is kernel.Phase.RUNNING, state.message
    (result,) = record.results
    assert result.is_error and "nested deeper than" in result.content
