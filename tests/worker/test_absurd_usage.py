"""A provider or gateway reporting more tokens than one call could bill (a count past
``kernel.WINDOW_SLACK`` × the larger of the AgentModel's ``contextWindow`` and the prompt's
bound, and past ``LEAST_BILLABLE``: ``kernel.most_billable``) is not believed: the call's
usage is estimated from what was sent and delivered, flagged ``estimated``, and the worker
logs a warning naming the count. Before, 9,000,000,000 prompt tokens reported for a
fifty-token prompt charged the run and its tenant $9,000, stopping every run of the tenant for
the rest of its window."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from aiohttp import web

from agentrun import kernel
from agentrun.worker import turn

from .rawmodel import chunk, one_turn, serve, sse

WINDOW = 32_000
"""The scripted model's ``contextWindow`` (rawmodel)."""
LIMITS = kernel.Limits(max_tokens=100_000_000, max_output_tokens=1000)


@pytest.fixture(autouse=True)
def _nothing_said_yet() -> None:
    """Each test's run starts with nothing logged about it (``turn._TOLD_IMPLAUSIBLE``)."""
    turn._TOLD_IMPLAUSIBLE.clear()


def answering(usage: dict[str, Any]) -> Any:
    async def handler(request: web.Request) -> web.StreamResponse:
        await request.json()
        return await sse(request, [chunk({"content": "hi"}, finish="stop", usage=usage)])

    return handler


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": 9_000_000_000, "completion_tokens": 5, "total_tokens": 9_000_000_005},
        {"prompt_tokens": 50, "completion_tokens": 9_000_000_000},
        {"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 9_000_000_000},
        {
            "prompt_tokens": 50,
            "completion_tokens": 5,
            "completion_tokens_details": {"reasoning_tokens": 9_000_000_000},
        },
    ],
    ids=["prompt", "completion", "total", "reasoning"],
)
async def test_a_count_no_call_could_bill_is_estimated_not_charged(
    usage: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="agentrun.worker.turn"):
        async with serve(answering(usage)) as url:
            _record, state = await one_turn(url, limits=LIMITS)
    assert state.usage.estimated
    assert state.usage.input_tokens < WINDOW and state.usage.output_tokens <= 1000
    assert state.usage.cost_usd < 1
    assert "reported usage no call could bill" in caplog.text
    assert "9000000000 > 1000000" in caplog.text  # the least most_billable, past 4 x 32,000


async def test_a_large_count_a_call_could_bill_is_believed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Thirty times the declared window, under a million tokens: a window declared smaller
    than the model's, or a reasoning model's thought; believed and charged, nothing logged."""
    usage = {"prompt_tokens": 30 * WINDOW, "completion_tokens": 5}
    with caplog.at_level(logging.WARNING, logger="agentrun.worker.turn"):
        async with serve(answering(usage)) as url:
            _record, state = await one_turn(url, limits=LIMITS)
    assert not state.usage.estimated
    assert (state.usage.input_tokens, state.usage.output_tokens) == (30 * WINDOW, 5)
    assert "no call could bill" not in caplog.text


async def test_a_count_past_even_the_largest_believed_is_estimated_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A reasoning count of 2 × 10¹⁰ beside believable prompt and completion counts: the
    call is estimated and the count named, as one of 9 × 10⁹ is (before, it was left out
    unseen and the rest believed)."""
    usage = {
        "prompt_tokens": 50,
        "completion_tokens": 5,
        "completion_tokens_details": {"reasoning_tokens": 20_000_000_000},
    }
    with caplog.at_level(logging.WARNING, logger="agentrun.worker.turn"):
        async with serve(answering(usage)) as url:
            _record, state = await one_turn(url, limits=LIMITS)
    assert state.usage.estimated
    assert "reasoning_tokens 20000000000 > 1000000" in caplog.text


async def test_a_model_repeating_implausible_usage_is_logged_once_a_run_and_cut_short(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A tenant's model reporting a 4,000-digit count at every call: each call is estimated,
    but the warning is written once for the run, its count cut to 200 characters (before, a
    warning of 4 KB at every call of every run of that model)."""
    huge = int("9" * 4000)
    usage = {"prompt_tokens": 50, "completion_tokens": huge}
    with caplog.at_level(logging.WARNING, logger="agentrun.worker.turn"):
        async with serve(answering(usage)) as url:
            for _ in range(3):
                _record, state = await one_turn(url, limits=LIMITS)
                assert state.usage.estimated
    said = [r.getMessage() for r in caplog.records if "no call could bill" in r.getMessage()]
    assert len(said) == 1, said
    assert len(said[0]) < 600, len(said[0])
