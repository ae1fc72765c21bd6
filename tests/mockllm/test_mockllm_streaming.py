"""Streaming and the provider behaviours budgets are tested against: server-sent chunks with
usage last (or never), a server that answers one JSON body or refuses ``stream: true``, one
that honours or ignores ``max_tokens``, and token counts other than four characters a token.
Driven through the real openai client."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from mockllm_support import conversation

from agentrun.testing import mockllm

MODEL = "gpt-test"


async def streamed(client: openai.AsyncOpenAI, goal: str, **extra: Any) -> list[Any]:
    stream = await client.chat.completions.create(
        model=MODEL, messages=conversation(goal), stream=True, **extra
    )
    return [chunk async for chunk in stream]


def text_of(chunks: list[Any]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


async def test_a_streamed_reply_arrives_in_chunks_with_usage_last(
    client: openai.AsyncOpenAI,
) -> None:
    chunks = await streamed(client, "rectangle", stream_options={"include_usage": True})
    whole = await client.chat.completions.create(model=MODEL, messages=conversation("rectangle"))
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == 120 and chunks[-1].usage.completion_tokens == 30
    assert text_of(chunks) == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for part in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            call = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += part.id or ""
            call["name"] += (part.function and part.function.name) or ""
            call["arguments"] += (part.function and part.function.arguments) or ""
    assert [c["arguments"] for c in calls.values()] == [
        t.function.arguments for t in whole.choices[0].message.tool_calls or []
    ]


async def test_usage_comes_only_when_asked_and_only_from_servers_that_send_it(
    client: openai.AsyncOpenAI,
) -> None:
    assert all(c.usage is None for c in await streamed(client, "rectangle"))
    chunks = await streamed(client, "stream without usage", stream_options={"include_usage": True})
    assert all(c.usage is None for c in chunks)
    assert text_of(chunks) == "no usage chunk at the end"


async def test_one_token_per_cjk_character_in_pieces_of_two(client: openai.AsyncOpenAI) -> None:
    chunks = await streamed(client, "stream cjk", stream_options={"include_usage": True})
    pieces = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert pieces[0] == "長い" and len(pieces) == 6
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12


async def test_a_server_that_does_not_stream_answers_one_body_or_refuses(
    client: openai.AsyncOpenAI, mock: mockllm.MockLLM
) -> None:
    raw = await client.post(
        "/chat/completions",
        body={"model": MODEL, "messages": conversation("stream json"), "stream": True},
        cast_to=object,
    )
    assert isinstance(raw, dict) and raw["choices"][0]["message"]["content"] == "one body"
    with pytest.raises(openai.BadRequestError) as caught:
        await streamed(client, "streaming turned down")
    assert caught.value.param == "stream"


async def test_max_tokens_honoured_cuts_with_length_and_ignored_sends_everything(
    client: openai.AsyncOpenAI,
) -> None:
    cut = await client.chat.completions.create(
        model=MODEL, messages=conversation("honor limit"), max_tokens=3
    )
    assert cut.choices[0].message.content == "abcdefghijkl"
    assert cut.choices[0].finish_reason == "length"
    assert cut.usage is not None and cut.usage.completion_tokens == 3
    whole = await client.chat.completions.create(
        model=MODEL, messages=conversation("ignore limit"), max_tokens=3
    )
    assert whole.choices[0].message.content == "abcdefghijklmnopqrstuvwxyz"
    assert whole.usage is not None and whole.usage.completion_tokens == 20000


async def test_a_client_that_closes_the_stream_is_counted(
    client: openai.AsyncOpenAI, mock: mockllm.MockLLM
) -> None:
    stream = await client.chat.completions.create(
        model=MODEL, messages=conversation("keeps streaming"), stream=True
    )
    async for _ in stream:
        break
    await stream.close()
    for _ in range(50):
        if mock.state.streams_cut:
            break
        await __import__("asyncio").sleep(0.02)
    assert mock.state.streams_cut == 1
