"""A provider that answers a streamed request with one JSON body (it does not stream), ignores
``max_tokens`` and reports no usage cannot be cut: its reply is charged its estimate, however
far past the allowance. (The estimate was capped at the allowance: a 40,000-character answer
to a 128-token allowance was charged 128 output tokens, below the text's floor.)"""

from __future__ import annotations

from aiohttp import web

from agentrun import kernel

from .rawmodel import one_turn, serve

TEXT = "The quick brown fox jumps over the lazy dog while counting sheep. " * 600


async def whole_body(request: web.Request) -> web.Response:
    body = await request.json()
    assert body["max_tokens"] == 128
    return web.json_response(
        {
            "id": "c1",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": TEXT},
                }
            ],
            # no "usage"
        }
    )


async def test_unstreamed_reply_without_usage_is_charged_at_least_its_texts_floor() -> None:
    async with serve(whole_body) as url:
        _record, state = await one_turn(url, limits=kernel.Limits(max_output_tokens=128))
    least = kernel.least_tokens([TEXT])
    assert state.usage.output_tokens >= kernel.output_estimate([TEXT]) > 128
    assert state.usage.output_tokens >= least, (
        f"a {len(TEXT)}-character reply (at least {least} tokens by kernel.least_tokens) was"
        f" charged {state.usage.output_tokens} output tokens"
    )
