"""A streamed reply whose reasoning arrives in ``reasoning_content`` and which carries no usage
chunk (llama.cpp's server streams so) is charged its estimate of everything delivered, the
reasoning the message does not keep included. (The estimate read the message only: 16,000
characters of reasoning were charged 5 output tokens.)"""

from __future__ import annotations

from aiohttp import web

from agentrun import kernel

from .rawmodel import chunk, one_turn, serve, sse

WORDS = "because the alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu "


async def reasoning_then_answer(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    assert body["stream"] is True
    chunks = [chunk({"role": "assistant"})]
    chunks += [chunk({"reasoning_content": WORDS}) for _ in range(200)]  # ~16,000 chars
    chunks += [chunk({"content": "42"}), chunk(finish="stop")]
    return await sse(request, chunks)  # no usage chunk at all


async def test_streamed_reasoning_without_usage_is_charged_what_was_delivered() -> None:
    async with serve(reasoning_then_answer) as url:
        _record, state = await one_turn(url, limits=kernel.Limits(max_output_tokens=8000))
    delivered_least = kernel.least_tokens([WORDS * 200])  # the fewest any tokenizer counts
    assert state.usage.estimated
    assert state.usage.output_tokens >= kernel.output_estimate(["42", WORDS * 200])
    assert state.usage.output_tokens >= delivered_least, (
        f"200 chunks of reasoning (at least {delivered_least} tokens by the worker's own floor,"
        f" ~{len(WORDS) * 200 // 4} at 4 chars/token) charged only"
        f" {state.usage.output_tokens} output tokens"
    )
