"""Faults and loud failures: scripted HTTP errors, unmatched requests, exhausted scripts."""

from __future__ import annotations

import openai
import pytest
from mockllm_support import conversation

from agentrun.testing import mockllm

MODEL = "gpt-test"


async def test_429_once_then_the_retry_succeeds_with_retry_after(
    client: openai.AsyncOpenAI,
) -> None:
    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(model=MODEL, messages=conversation("rate limit"))
    assert caught.value.status_code == 429
    assert caught.value.response.headers["retry-after"] == "2"
    assert caught.value.code == "mock_fault"
    completion = await client.chat.completions.create(
        model=MODEL, messages=conversation("rate limit")
    )
    assert completion.choices[0].message.content == "after the retry"


async def test_fault_times_count_per_conversation(client: openai.AsyncOpenAI) -> None:
    for goal in ("rate limit A", "rate limit B"):
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(model=MODEL, messages=conversation(goal))
    for goal in ("rate limit A", "rate limit B"):
        await client.chat.completions.create(model=MODEL, messages=conversation(goal))


async def test_retrying_client_gets_through_a_single_429(mock: mockllm.MockLLM) -> None:
    async with openai.AsyncOpenAI(base_url=mock.base_url, api_key="test", max_retries=1) as c:
        # Retry-After of 2 s is honoured by the SDK (it caps honoured delays at 60 s).
        completion = await c.chat.completions.create(
            model=MODEL, messages=conversation("rate limit")
        )
    assert completion.choices[0].message.content == "after the retry"
    times = [r.time for r in mock.state.requests]
    assert len(times) == 2 and times[1] - times[0] >= 1.9


async def test_always_500_never_recovers(client: openai.AsyncOpenAI) -> None:
    for _ in range(3):
        with pytest.raises(openai.InternalServerError) as caught:
            await client.chat.completions.create(model=MODEL, messages=conversation("server down"))
        assert caught.value.status_code == 500


async def test_no_matching_scenario_is_a_400_naming_the_message(
    client: openai.AsyncOpenAI,
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model=MODEL, messages=conversation("juggle"))
    assert caught.value.code == "no_scenario_match"
    assert "'juggle'" in caught.value.message


async def test_past_the_script_with_after_error_is_a_400_naming_the_scenario(
    client: openai.AsyncOpenAI,
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(
            model=MODEL, messages=conversation("short script", turns=1)
        )
    assert caught.value.code == "scenario_exhausted"
    assert "'short'" in caught.value.message


async def test_requests_are_recorded_with_arrival_time_scenario_and_turn(
    client: openai.AsyncOpenAI, mock: mockllm.MockLLM
) -> None:
    before = __import__("time").time()
    await client.chat.completions.create(model=MODEL, messages=conversation("rectangle"))
    await client.chat.completions.create(model=MODEL, messages=conversation("rectangle", turns=1))
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(model=MODEL, messages=conversation("juggle"))
    recorded = await client.get(
        mock.base_url.removesuffix("/v1") + "/_mock/requests", cast_to=object
    )
    entries = recorded["requests"]  # type: ignore[index]
    assert [(e["index"], e["scenario"], e["turn"], e["status"]) for e in entries] == [
        (0, "rectangle", 0, 200),
        (1, "rectangle", 1, 200),
        (2, None, None, 400),
    ]
    assert before <= entries[0]["time"] <= entries[1]["time"]
    assert entries[1]["body"]["messages"][1] == {"role": "user", "content": "rectangle"}
    assert entries[0]["model"] == MODEL

    only = await client.get(
        mock.base_url.removesuffix("/v1") + "/_mock/requests?scenario=rectangle", cast_to=object
    )
    assert len(only["requests"]) == 2  # type: ignore[index]


async def test_reset_forgets_requests_and_fault_counts(
    client: openai.AsyncOpenAI, mock: mockllm.MockLLM
) -> None:
    with pytest.raises(openai.RateLimitError):
        await client.chat.completions.create(model=MODEL, messages=conversation("rate limit"))
    await client.post(mock.base_url.removesuffix("/v1") + "/_mock/reset", cast_to=object)
    assert list(mock.state.requests) == []
    with pytest.raises(openai.RateLimitError):
        await client.chat.completions.create(model=MODEL, messages=conversation("rate limit"))
