"""The model adapter retries as the ``openai`` client does, within the run's deadline.

Against the scripted model server over real HTTP: a 429 with ``Retry-After`` is waited out and
retried, a 400 is never retried, and a model that keeps failing is cut at the run's deadline.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from agentrun.testing import mockllm, scenario
from agentrun.worker.model import ChatRequest, ModelClient, ModelError, RetryPolicy

SCRIPT = """
scenarios:
  - name: rate-limited-once
    match: {goal: "rate limit"}
    turns:
      - content: "after the retry"
        fault: {status: 429, times: 1, retry_after: 0.6}
  - name: always-500
    match: {goal: "server down"}
    turns:
      - fault: {status: 500}
  - name: bad-request
    match: {goal: "bad request"}
    turns:
      - fault: {status: 400}
"""


@pytest.fixture
async def mock() -> AsyncIterator[mockllm.MockLLM]:
    async with mockllm.MockLLM(scenario.parse_scenarios(SCRIPT)) as server:
        yield server


async def ask(
    mock: mockllm.MockLLM, goal: str, *, seconds_left: float = 30.0, retries: int = 4
) -> str:
    model = ModelClient(RetryPolicy(max_retries=retries))
    try:
        request = ChatRequest(
            base_url=mock.base_url,
            api_key="",
            model="scripted",
            messages=[{"role": "user", "content": goal}],
            tools=[],
            max_output_tokens=100,
        )
        answer = await model.complete(request, deadline=time.time() + seconds_left)
    finally:
        await model.close()
    content = answer["choices"][0]["message"]["content"]
    assert isinstance(content, str)
    return content


async def test_a_rate_limited_call_waits_its_retry_after_and_gets_through(
    mock: mockllm.MockLLM,
) -> None:
    assert await ask(mock, "rate limit") == "after the retry"
    times = [r.time for r in mock.state.requests]
    assert len(times) == 2 and times[1] - times[0] >= 0.55


async def test_a_bad_request_is_not_retried(mock: mockllm.MockLLM) -> None:
    with pytest.raises(ModelError, match="HTTP 400"):
        await ask(mock, "bad request")
    assert len(mock.state.requests) == 1


async def test_a_model_that_keeps_failing_gives_up_after_its_retries(
    mock: mockllm.MockLLM,
) -> None:
    with pytest.raises(ModelError, match="HTTP 500"):
        await ask(mock, "server down", retries=1)
    assert len(mock.state.requests) == 2


async def test_retries_stop_at_the_runs_deadline(mock: mockllm.MockLLM) -> None:
    started = time.monotonic()
    with pytest.raises(ModelError, match="deadline passed"):
        await ask(mock, "server down", seconds_left=1.2, retries=50)
    assert 1.1 < time.monotonic() - started < 3.0
    assert 1 < len(mock.state.requests) < 50


async def test_no_call_starts_after_the_deadline(mock: mockllm.MockLLM) -> None:
    with pytest.raises(ModelError, match="deadline passed"):
        await ask(mock, "rate limit", seconds_left=-1)
    assert not mock.state.requests
