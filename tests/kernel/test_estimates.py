"""What the kernel counts when it must count itself (``agentrun.kernel.usage``): the prompt
estimate of a chat request (~4 characters a token, 16 characters per tool call's framing, the
tools' compact JSON, 4 tokens per message and 4 for the reply), the texts a model wrote in an
assistant message whatever its shape, and the output tokens charged for them when the provider
reports none. Values pinned by hand from those rules."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from agentrun.kernel.usage import (
    MESSAGE_OVERHEAD_TOKENS,
    Usage,
    billed_output,
    completion_texts,
    estimate_tokens,
    output_estimate,
    prompt_token_bound,
)


def test_the_prompt_estimate_counts_contents_calls_and_tools_by_its_rules() -> None:
    assert estimate_tokens([]) == 4  # the reply's framing alone
    assert estimate_tokens([{"role": "user", "content": "x" * 40}]) == 10 + 8
    assert estimate_tokens([{"role": "user", "content": "x" * 43}]) == 10 + 8  # rounded down
    assistant = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "abcd", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "ef"}},
            {"id": "c3", "type": "function"},
        ],
    }
    # (4 + 2 + 16) + (2 + 0 + 16) + (0 + 0 + 16) = 56 characters: 14 tokens, 2 messages + 1
    assert estimate_tokens([{"role": "user", "content": ""}, assistant]) == 14 + 12
    tools = [{"type": "function", "function": {"name": "t"}}]  # 45 characters compact
    assert estimate_tokens([{"role": "user", "content": "x"}], tools) == (1 + 45) // 4 + 8
    # where one more character crosses a token: the tools come on top of the messages, and a
    # call's framing is 16 characters exactly
    assert estimate_tokens([{"role": "user", "content": "xxx"}], tools) == 12 + 8
    one_call = {"role": "assistant", "tool_calls": [{"function": {"name": "abc"}}]}
    assert estimate_tokens([one_call]) == (3 + 16) // 4 + 8
    assert estimate_tokens([{"role": "user", "content": ["not", "text"]}]) == 8


def test_the_texts_a_model_wrote_are_its_content_refusal_and_each_calls_name_and_arguments() -> (
    None
):
    message: dict[str, Any] = {
        "content": "hello",
        "refusal": "no",
        "tool_calls": [
            {"function": {"name": "f", "arguments": '{"a": 1}'}},
            {"function": {"name": "g"}},
            {"function": {"arguments": "x"}},
            {"function": "not an object"},
            "not a call",
            {"no function": True},
            {"function": {"name": 7, "arguments": None}},
        ],
    }
    assert completion_texts(message) == [
        "hello",
        "no",
        "f",
        '{"a": 1}',
        "g",
        "",
        "",
        "x",
        "7",
        "None",
    ]
    assert completion_texts({"content": ["parts"], "refusal": 3, "tool_calls": "f"}) == []
    assert completion_texts({}) == []


def test_reasoning_details_count_only_their_texts() -> None:
    """OpenRouter's ``reasoning_details`` hold encrypted or summarised reasoning too: only the
    entries with a string ``text`` are texts the model wrote."""
    message = {
        "reasoning_details": [
            {"type": "reasoning.encrypted", "data": "gAAAAB"},
            {"type": "reasoning.text", "text": "first"},
            "not a detail",
            {"type": "reasoning.text", "text": None},
        ]
    }
    assert completion_texts(message) == ["first"]


def test_the_output_estimate_is_three_ascii_characters_or_one_other_a_token_plus_framing() -> None:
    assert output_estimate([]) == 4
    assert output_estimate([""]) == 4
    assert output_estimate(["abc"]) == 1 + 4
    assert output_estimate(["abcd"]) == 2 + 4  # rounded up
    assert output_estimate(["ab", "cd"]) == 2 + 4  # counted over all the texts
    assert output_estimate(["日本語"]) == 3 + 4
    assert output_estimate(["a日b"]) == 1 + 1 + 4


def test_the_prompt_bound_counts_each_messages_json_bytes_and_the_tools_by_their_rules() -> None:
    assert prompt_token_bound([]) == 8  # the reply's framing alone
    user = {"role": "user", "content": "héllo"}  # {"role":"user","content":"héllo"}: 34 bytes
    assert prompt_token_bound([user]) == 8 * 2 + 34
    assert prompt_token_bound([user, user]) == 8 * 3 + 2 * 34
    odd = {"role": "tool", "content": Decimal("1.5")}  # not JSON: written as its str()
    assert prompt_token_bound([odd]) == 8 * 2 + len('{"role":"tool","content":"1.5"}')
    tool = {"type": "function", "function": {"name": "é"}}  # in a list: 44 ASCII characters, é
    assert prompt_token_bound([], [tool]) == 8 + (11 + 2) + 32
    assert prompt_token_bound([], [tool, tool]) == 8 + (22 + 4) + 64  # 87 ASCII characters
    odd_tool = {"n": Decimal("1.5")}  # [{"n":"1.5"}]: 13 characters, 4 tokens
    assert prompt_token_bound([], [odd_tool]) == 8 + 4 + 32


def test_usage_adds_every_count_and_is_estimated_if_either_part_is() -> None:
    first = Usage(10, 5, 2, Decimal("0.1"), estimated=False, reasoning_tokens=1)
    second = Usage(1, 2, 3, Decimal("0.01"), estimated=True, reasoning_tokens=4)
    assert first + second == Usage(11, 7, 5, Decimal("0.11"), estimated=True, reasoning_tokens=5)
    assert (first + first).estimated is False


def test_other_characters_are_counted_over_every_text() -> None:
    assert output_estimate(["é", "ü€"]) == 3 + MESSAGE_OVERHEAD_TOKENS
    assert output_estimate(["abc", "é", "abcd", "€"]) == 3 + 2 + MESSAGE_OVERHEAD_TOKENS


def test_billed_output_reads_each_provider_s_counts_at_their_boundaries() -> None:
    # reasoning equal to the completion is inside it (OpenAI), not left out of it
    assert billed_output(completion=50, reasoning=50, prompt=10, total=60) == (50, 50)
    assert billed_output(completion=50, reasoning=51, prompt=10, total=None) == (101, 51)
    # a total that says no more than prompt + completion adds nothing, even below it
    assert billed_output(completion=50, reasoning=None, prompt=10, total=60) == (50, 0)
    assert billed_output(completion=50, reasoning=None, prompt=10, total=45) == (50, 0)
    assert billed_output(completion=50, reasoning=None, prompt=10, total=70) == (60, 10)
