"""A streamed reply that carries its output in a second choice (``choices[1]``: a provider
answering ``n > 1`` whatever was asked, or a gateway fanning out) is counted, cut and charged
as the first choice's output is: the provider bills every choice it sent. (Reading
``choices[0]`` only, the cut never moved: the run took the whole 39,000 tokens, 19 times its
cap, and without a usage chunk was charged 5.)"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from agentrun import kernel

from .rawmodel import chunk, one_turn, serve, sse

PIECE = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
PIECES = 2000  # 156,000 characters in choices[1]: ~39,000 tokens at four characters a token

SENT = PIECES * len(PIECE) // 4


def two_choice_chunks() -> list[dict[str, Any]]:
    """ "ok" in the first choice, then ``PIECES`` chunks whose output is in a second one."""
    chunks = [chunk({"role": "assistant", "content": "ok"})]
    for _ in range(PIECES):
        two = chunk({})
        two["choices"] = [
            {"index": 0, "delta": {}, "finish_reason": None},
            {"index": 1, "delta": {"content": PIECE}, "finish_reason": None},
        ]
        chunks.append(two)
    return [*chunks, chunk(finish="stop")]


async def two_choices(request: web.Request) -> web.StreamResponse:
    await request.json()
    usage = {"prompt_tokens": 20, "completion_tokens": SENT, "total_tokens": 20 + SENT}
    return await sse(request, [*two_choice_chunks(), chunk(choices=False, usage=usage)])


async def test_output_in_a_second_choice_is_cut_at_the_allowance() -> None:
    limits = kernel.Limits(max_tokens=2000, max_output_tokens=1000)
    async with serve(two_choices) as url:
        _record, state = await one_turn(url, limits=limits)
    # cut once the least count passed the allowance, charged at the usual density: the run
    # ends at its cap with the one call's overrun, a fraction of what the server would send
    assert state.phase is kernel.Phase.TOKEN_BUDGET_EXHAUSTED, state.message
    assert state.usage.estimated
    assert 1000 < state.usage.output_tokens <= 1000 * kernel.LEAST_ASCII_CHARS // 4 + 8 < SENT


async def two_choices_no_usage(request: web.Request) -> web.StreamResponse:
    await request.json()
    return await sse(request, two_choice_chunks())


async def test_output_in_a_second_choice_without_usage_is_charged() -> None:
    limits = kernel.Limits(max_tokens=2000, max_output_tokens=1000)
    async with serve(two_choices_no_usage) as url:
        _record, state = await one_turn(url, limits=limits)
    delivered = kernel.least_tokens([PIECE * PIECES])
    assert state.usage.output_tokens >= min(delivered, 1000), (
        f"{PIECES} chunks of output delivered in choices[1] (at least {delivered} tokens),"
        f" charged {state.usage.output_tokens} output tokens"
    )
