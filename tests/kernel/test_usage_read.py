"""What ``read_usage`` believes of a provider's ``usage`` and what it estimates instead: a
count is an integer from 0 to ``MAX_REPORTED_TOKENS`` (both included); anything else (negative,
a bool, a float, a string, absurd) makes the call's usage estimated from the prompt's bound and
the reply's text, capped at the ``max_tokens`` the call sent."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from agentrun import kernel
from agentrun.kernel.usage import MAX_REPORTED_TOKENS

PRICES = kernel.Pricing(Decimal(1), Decimal(0), Decimal(2))  # USD per million tokens
REPLY = {"choices": [{"message": {"role": "assistant", "content": "word " * 400}}]}
"""A reply whose text estimates at far more than 5 output tokens."""


SILENT = {"choices": [{"message": {"role": "assistant", "content": ""}}]}
"""A reply with no text: no floor under its reported output."""


def read(
    usage: Any, *, max_output_tokens: int | None = None, reply: dict[str, Any] = REPLY
) -> kernel.Usage:
    return kernel.read_usage(
        {**reply, "usage": usage},
        pricing=PRICES,
        prompt_estimate=77,
        max_output_tokens=max_output_tokens,
    )


@pytest.mark.parametrize("count", [0, 1, MAX_REPORTED_TOKENS], ids=["zero", "one", "largest"])
def test_a_count_from_zero_to_the_largest_believed_is_read_as_reported(count: int) -> None:
    usage = read({"prompt_tokens": count, "completion_tokens": count}, reply=SILENT)
    assert (usage.input_tokens, usage.output_tokens, usage.estimated) == (count, count, False)
    assert (usage.cached_input_tokens, usage.reasoning_tokens) == (0, 0)


@pytest.mark.parametrize(
    ("content", "floor"),
    [("word " * 400, 334), ("長" * 600, 300), ("", 0)],
    ids=["ascii-six-a-token", "other-two-a-token", "no-text"],
)
def test_reported_output_below_the_text_returned_is_charged_the_texts_floor(
    content: str, floor: int
) -> None:
    """A provider reporting fewer output tokens than the text it sent can hold (0 for 2,000
    characters) is not believed: the reply is charged the text's lower bound, priced."""
    reply = {"choices": [{"message": {"role": "assistant", "content": content}}]}
    usage = read({"prompt_tokens": 10, "completion_tokens": 0}, reply=reply)
    assert (usage.output_tokens, usage.estimated) == (floor, False)
    assert usage.cost_usd == PRICES.cost(
        input_tokens=10, cached_input_tokens=0, output_tokens=floor
    )
    honest = read({"prompt_tokens": 10, "completion_tokens": 500}, reply=reply)
    assert honest.output_tokens == 500  # an honest count above the floor is read as reported


@pytest.mark.parametrize(
    "count",
    [-1, MAX_REPORTED_TOKENS + 1, True, 3.0, "3", None],
    ids=["negative", "absurd", "bool", "float", "string", "null"],
)
def test_a_count_that_is_not_believed_makes_the_usage_estimated(count: Any) -> None:
    for usage in ({"prompt_tokens": count, "completion_tokens": 3},
                  {"prompt_tokens": 3, "completion_tokens": count}):  # fmt: skip
        read_back = read(usage)
        assert read_back.estimated and read_back.input_tokens == 77
        assert (read_back.cached_input_tokens, read_back.reasoning_tokens) == (0, 0)


def test_an_estimate_is_capped_at_the_max_tokens_the_call_sent() -> None:
    uncapped = read(None)
    assert uncapped.estimated and uncapped.output_tokens > 5
    capped = read(None, max_output_tokens=5)
    assert (capped.input_tokens, capped.output_tokens, capped.estimated) == (77, 5, True)
    assert capped.cost_usd == (Decimal(77) + Decimal(5) * 2) / 1_000_000


def test_cached_tokens_reported_beyond_the_prompt_are_the_prompt() -> None:
    usage = read(
        {
            "prompt_tokens": 10,
            "completion_tokens": 1,
            "prompt_tokens_details": {"cached_tokens": 99},
        }
    )
    assert (usage.input_tokens, usage.cached_input_tokens) == (10, 10)


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning", "reasoning_details"])
def test_reasoning_returned_in_the_message_counts_toward_the_output_floor(field: str) -> None:
    text = "think " * 1_000  # 6,000 ASCII characters: at least 1,000 tokens
    value: Any = (
        [{"type": "reasoning.text", "text": text}] if field == "reasoning_details" else text
    )
    reply = {"choices": [{"message": {"role": "assistant", "content": "", field: value}}]}
    usage = read({"prompt_tokens": 10, "completion_tokens": 1}, reply=reply)
    assert usage.output_tokens == 1_000


def test_the_prompt_and_what_a_stream_delivered_floor_the_reported_counts() -> None:
    """A provider reporting 0 prompt tokens for a prompt of 600,000 characters, or 1 output
    token for a stream that delivered 1,001 (reasoning included, which the message does not
    keep), is charged the floors."""
    usage = kernel.read_usage(
        {**SILENT, "usage": {"prompt_tokens": 0, "completion_tokens": 1}},
        pricing=PRICES,
        prompt_estimate=250_000,
        prompt_floor=kernel.output_floor(kernel.prompt_texts([{"content": "x" * 600_000}])),
        delivered_floor=1_001,
    )
    assert (usage.input_tokens, usage.output_tokens) == (100_000, 1_001)
