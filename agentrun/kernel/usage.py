"""Token and cost accounting: reading a provider's ``usage`` and estimating it when absent."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from decimal import Decimal
from typing import Any

from agentrun.kernel.limits import Pricing

CHARS_PER_TOKEN = 4
"""Rough English-text density used for estimates (OpenAI's rule of thumb: ~4 characters a token)."""
MESSAGE_OVERHEAD_TOKENS = 4
"""Per-message framing tokens in chat formats (role and separators), per OpenAI's cookbook."""


@dataclasses.dataclass(frozen=True, slots=True)
class Usage:
    """Tokens and cost of one model call or of a whole run; additive."""

    input_tokens: int = 0
    """Prompt tokens, cached ones included."""
    output_tokens: int = 0
    """Completion tokens, reasoning tokens included (all billed at the output price)."""
    cached_input_tokens: int = 0
    """The part of ``input_tokens`` served from the prompt cache."""
    cost_usd: Decimal = Decimal(0)
    """USD, priced from the AgentModel."""
    estimated: bool = False
    """True when some of these counts are estimates because the provider sent no usage."""
    reasoning_tokens: int = 0
    """The part of ``output_tokens`` the model spent reasoning (not in its visible answer)."""

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens (what ``maxTokens`` limits)."""
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cached_input_tokens=self.cached_input_tokens + other.cached_input_tokens,
            cost_usd=self.cost_usd + other.cost_usd,
            estimated=self.estimated or other.estimated,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
        )


def estimate_tokens(messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] = ()) -> int:
    """Estimate the prompt tokens of a chat request: ~4 characters a token plus framing.

    Deliberately simple and slightly high: it gates budgets before a call, and the provider's
    actual count replaces it after. ``tools`` is the OpenAI ``tools`` list, which also counts.
    """
    chars = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            chars += len(content)
        for call in message.get("tool_calls") or ():
            function = call.get("function", {})
            chars += len(function.get("name", "")) + len(function.get("arguments", "")) + 16
    if tools:
        chars += len(json.dumps(tools, separators=(",", ":")))
    return chars // CHARS_PER_TOKEN + MESSAGE_OVERHEAD_TOKENS * (len(messages) + 1)


BOUND_MESSAGE_OVERHEAD = 8
"""Framing tokens per message allowed by ``prompt_token_bound`` (chat formats use 3–4: role
and separator special tokens; doubled for formats not measured)."""
BOUND_TOOL_OVERHEAD = 32
"""Tokens per tool definition allowed on top of its text's count (the provider renders the
definitions into its own text form with per-tool framing)."""


def utf8_bytes(text: str) -> int:
    """UTF-8 length of ``text``; an unpaired surrogate counts 3 bytes (what a provider receives
    once the JSON escape is decoded and replaced by U+FFFD, also 3 bytes)."""
    return len(text.encode("utf-8", "surrogatepass"))


def _schema_tokens(text: str) -> int:
    """Tokens allowed for tool-definition text: one per 4 ASCII characters, one per byte of
    anything else."""
    ascii_chars = len(text.encode("ascii", "ignore"))  # the ASCII characters, counted in C
    return -(-ascii_chars // CHARS_PER_TOKEN) + utf8_bytes(text) - ascii_chars


def prompt_token_bound(messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] = ()) -> int:
    """An upper bound of the prompt tokens a byte-level BPE tokenizer counts for this chat
    request, whatever the script or encoding of the conversation's text.

    Every token of a byte-level BPE (GPT-2, cl100k_base, o200k_base and their kin) stands for
    at least one byte of UTF-8, so a text has at most as many tokens as bytes. The messages
    (goal, instructions, answers, tool calls and results: text nobody vets) count as the
    UTF-8 size of each message as JSON (content, tool calls, ids and names, plus keys and
    quotes, which only add) and ``BOUND_MESSAGE_OVERHEAD`` framing tokens per message and for
    the reply. The tools list, written by the platform (the worker's catalog, tool servers it
    trusts), counts one token per 4 ASCII characters of its JSON, one per byte of anything
    else, and ``BOUND_TOOL_OVERHEAD`` per tool. What it assumes is written in the architecture
    document.
    """
    total = BOUND_MESSAGE_OVERHEAD * (len(messages) + 1)
    if messages:
        # one encoding of the whole list: its items are each message's JSON, joined by a comma
        # and bracketed, so its size less those n + 1 bytes is the sum of the messages' sizes
        text = json.dumps(list(messages), ensure_ascii=False, separators=(",", ":"), default=str)
        total += utf8_bytes(text) - (len(messages) + 1)
    if tools:
        text = json.dumps(list(tools), ensure_ascii=False, separators=(",", ":"), default=str)
        total += _schema_tokens(text) + BOUND_TOOL_OVERHEAD * len(tools)
    return total


MAX_REPORTED_TOKENS = 10_000_000_000
"""Counts above this are not believed (no context window is that large)."""
WINDOW_SLACK = 4
"""How many times the larger of a model's declared context window and a call's prompt bound
one call's reported count may be and still be believed (``most_billable``). A server bills at
most its real window a call (a prompt past it is refused, and output shares it); the slack
leaves room for a window declared smaller than the model's and a provider's hidden template
and tool tokens."""
LEAST_BILLABLE = 1_000_000
"""The count ``most_billable`` believes whatever the declared window: some providers bill
reasoning apart from ``max_tokens`` and the window (tens of thousands of tokens of chain of
thought beside a short answer), and a window may be declared small to keep prompts short. An
absurd report (billions) is still not believed; one believed costs a tenant at most this many
tokens a call."""


def most_billable(*, context_window: int, prompt_bound: int) -> int:
    """The largest token count (prompt, completion, reasoning or total) of one model call that
    a worker believes: ``WINDOW_SLACK`` × the larger of the AgentModel's ``contextWindow`` and
    the call's prompt bound (``prompt_token_bound``), at least ``LEAST_BILLABLE`` and at most
    ``MAX_REPORTED_TOKENS``. A gateway that reports 9,000,000,000 prompt tokens for a
    50-token prompt would otherwise charge the tenant for them."""
    most = max(LEAST_BILLABLE, WINDOW_SLACK * max(context_window, prompt_bound))
    return min(MAX_REPORTED_TOKENS, most)


def implausible_usage(response: Mapping[str, Any], *, most: int) -> str | None:
    """What in ``response``'s ``usage`` no call could bill: the first of its prompt,
    completion, total, reasoning and cached counts above ``most`` (``most_billable``), as
    ``"prompt_tokens 9000000000 > 512000"``; ``None`` when none is. Any number counts, a
    float or one past ``MAX_REPORTED_TOKENS`` too (``_count`` reads neither, so such a total
    or reasoning count was left out unseen while the rest was believed); a bool does not."""
    raw = response.get("usage")
    if not isinstance(raw, Mapping):
        return None
    counts = {
        "prompt_tokens": raw.get("prompt_tokens"),
        "completion_tokens": raw.get("completion_tokens"),
        "total_tokens": raw.get("total_tokens"),
        "reasoning_tokens": _details(raw, "completion_tokens_details").get("reasoning_tokens"),
        "cached_tokens": _details(raw, "prompt_tokens_details").get("cached_tokens"),
    }
    for name, value in counts.items():
        if isinstance(value, int | float) and not isinstance(value, bool) and value > most:
            return f"{name} {value} > {most}"
    return None


def _count(value: Any) -> int | None:
    """A plausible token count, or ``None`` (negative, bool, float, string, absurd)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value <= MAX_REPORTED_TOKENS else None


def _messages(response: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The message of every choice of ``response`` (a provider may send more than asked)."""
    choices = response.get("choices")
    messages = (
        [c.get("message") for c in choices if isinstance(c, Mapping)]
        if isinstance(choices, list)
        else []
    )
    return [m for m in messages if isinstance(m, Mapping)]


REASONING_KEYS = ("reasoning_content", "reasoning")
"""Message fields in which providers return the model's reasoning as text (DeepSeek, vLLM and
llama.cpp: ``reasoning_content``; OpenRouter, Groq and Ollama: ``reasoning``)."""


def completion_texts(message: Mapping[str, Any]) -> list[str]:
    """The texts a model wrote in an assistant ``message``: its content, refusal, reasoning
    (``REASONING_KEYS``, and ``reasoning_details[].text``), and each tool call's name and
    arguments."""
    texts: list[str] = []
    for key in ("content", "refusal", *REASONING_KEYS):
        value = message.get(key)
        if isinstance(value, str):
            texts.append(value)
    details = message.get("reasoning_details")
    for part in details if isinstance(details, list) else ():
        if isinstance(part, Mapping) and isinstance(part.get("text"), str):
            texts.append(part["text"])
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            texts += [str(function.get("name", "")), str(function.get("arguments", ""))]
    return texts


def output_estimate(texts: Sequence[str]) -> int:
    """The output tokens charged for ``texts`` (what a model wrote: content, refusal,
    tool-call names and arguments) when the provider reports no usage: three ASCII characters
    a token (English runs about four), one token per other character (several providers'
    tokenizers count CJK so), plus ``MESSAGE_OVERHEAD_TOKENS`` for the reply's framing. An
    estimate, flagged as such; what a reservation holds is an upper bound
    (``prompt_token_bound`` and the output allowance)."""
    ascii_chars = other = 0
    for text in texts:
        count = len(text.encode("ascii", "ignore"))
        ascii_chars += count
        other += len(text) - count
    return -(-ascii_chars // 3) + other + MESSAGE_OVERHEAD_TOKENS


LEAST_ASCII_CHARS = 16
"""ASCII characters (whitespace and repeats left out) that ``least_tokens`` counts as one
token: more than cl100k_base or o200k_base pack into one token of prose, code or
pretty-printed JSON (at most about 12 characters a token, whitespace included)."""
LEAST_OTHER_CHARS = 8
"""Other characters that ``least_tokens`` counts as one token: more than o200k_base packs into
one of Russian prose (about 5), or any tokenizer in use of CJK, Hindi or Arabic text."""
RUN_CHARS = 64
"""Characters of a run of one repeated character (a ruler, padding) that ``least_tokens``
counts as one: tokenizers pack such runs far denser than prose (up to 48 a token)."""
RUN_MIN = 8
"""The shortest run ``least_tokens`` shrinks so (cl100k_base has one-token rulers of 16)."""
_REPEATS = re.compile(rf"(\S)\1{{{RUN_MIN - 1},}}")
_WHITESPACE = " \t\n\r\f\v"


def _least(ascii_chars: int, other: int) -> int:
    return -(-ascii_chars // LEAST_ASCII_CHARS) + -(-other // LEAST_OTHER_CHARS)


def _shrunk_run(run: re.Match[str]) -> str:
    return run.group(1) * -(-len(run.group(0)) // RUN_CHARS)


def least_tokens(texts: Sequence[str], *, above: int = 0) -> int:
    """The fewest tokens any tokenizer in use counts for ``texts``, or ``above`` if that is
    more: whitespace left out (it merges into the words beside it), a run of one repeated
    character (``RUN_MIN`` or longer) counted one character per ``RUN_CHARS``, then
    ``LEAST_ASCII_CHARS`` ASCII or ``LEAST_OTHER_CHARS`` other characters a token. A
    provider's count below it is a gross under-count (a 60,000-character reply reported as 0
    tokens) and is not believed; an honest count is always above it. The exact pass
    (whitespace and repeats) runs only when the quick bound, every character counted,
    exceeds ``above``: not for an honest count."""
    ascii_chars = other = 0
    for text in texts:
        count = len(text.encode("ascii", "ignore"))
        ascii_chars += count
        other += len(text) - count
    if _least(ascii_chars, other) <= above:
        return above
    ascii_chars = other = 0
    for piece in _pieces(texts):
        dense = _REPEATS.sub(_shrunk_run, piece)
        count = len(dense.encode("ascii", "ignore"))
        ascii_chars += count - sum(dense.count(space) for space in _WHITESPACE)
        other += len(dense) - count
    return max(above, _least(ascii_chars, other))


PIECE_CHARS = 65_536
"""Characters ``least_tokens`` reads in one pass of its regex: each pass holds the GIL, so a
caller in a thread lets the event loop run between pieces (a run cut at a piece's end counts
one character more, at most)."""


def _pieces(texts: Sequence[str]) -> Iterator[str]:
    for text in texts:
        for start in range(0, len(text), PIECE_CHARS):
            yield text[start : start + PIECE_CHARS]


def _details(raw: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    details = raw.get(key)
    return details if isinstance(details, Mapping) else {}


def billed_output(
    *, completion: int, reasoning: int | None, prompt: int, total: int | None
) -> tuple[int, int]:
    """``(output_tokens, reasoning_tokens)`` as billed, from a provider's counts.

    OpenAI counts reasoning inside ``completion_tokens`` (``completion_tokens_details.
    reasoning_tokens`` is a part of it); some OpenAI-compatible servers leave it out of
    ``completion_tokens`` and show it only in ``reasoning_tokens`` or only in ``total_tokens``.
    So: reasoning larger than the completion count is taken as left out (output = completion
    + reasoning); and output is at least ``total − prompt`` when the total says more, the
    difference then counting as reasoning when no reasoning count says otherwise.
    """
    output = completion
    known = reasoning or 0
    if known > completion:
        output = completion + known
    if total is not None and total - prompt > output:
        hidden = total - prompt - output
        output = total - prompt
        if reasoning is None:
            known = hidden
    return output, min(known, output)


TOOLS_UNCOUNTED = 16_384
"""Characters of a request's tool definitions (their strings: names, descriptions, schema
words) that ``prompt_texts`` leaves to the provider's count: each renders them in its own
template, which may drop or shorten parts, so only what lies past this is surely read (a
tool server's megabyte of descriptions reported as 0 prompt tokens)."""


def prompt_texts(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] = ()
) -> list[str]:
    """The texts of a request's ``messages`` (their content, as text or parts, and their tool
    calls) and of its ``tools`` past their first ``TOOLS_UNCOUNTED`` characters (the strings
    of the definitions sent): what ``least_tokens`` counts to bound a provider's reported
    prompt from below."""
    texts: list[str] = []
    definitions = " ".join(_strings(tools))
    if len(definitions) > TOOLS_UNCOUNTED:
        texts.append(definitions[TOOLS_UNCOUNTED:])
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        for part in content if isinstance(content, list) else ():
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                texts.append(part["text"])
        texts += completion_texts({"tool_calls": message.get("tool_calls")})
    return texts


def _strings(value: Any) -> Iterator[str]:
    """Every string in a JSON value, keys included, depth first."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield str(key)
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


@dataclasses.dataclass(frozen=True, slots=True)
class Delivered:
    """Output tokens a streamed response delivered, as the worker counted them: ``floor``, the
    fewest any provider can have billed (every text, reasoning included: ``least_tokens``);
    ``estimate``, its estimate when the provider reported no usage (``output_estimate`` of
    every text, those the message does not keep included; 0: none made)."""

    floor: int = 0
    estimate: int = 0


NOTHING_DELIVERED = Delivered()
"""An answer sent whole: nothing counted as it arrived."""


def _estimated(
    texts: Sequence[str],
    pricing: Pricing,
    prompt_estimate: int,
    max_output_tokens: int | None,
    delivered: Delivered,
) -> Usage:
    """The usage of a response whose counts are missing or not believed (``read_usage``)."""
    output_tokens = max(output_estimate(texts), delivered.estimate)
    if max_output_tokens is not None:
        output_tokens = min(output_tokens, max_output_tokens)
    output_tokens = max(output_tokens, delivered.floor)
    cost = pricing.cost(
        input_tokens=prompt_estimate, cached_input_tokens=0, output_tokens=output_tokens
    )
    return Usage(prompt_estimate, output_tokens, 0, cost, True, 0)


def read_usage(
    response: Mapping[str, Any],
    *,
    pricing: Pricing,
    prompt_estimate: int,
    max_output_tokens: int | None = None,
    prompt_texts: Sequence[str] = (),
    delivered: Delivered = NOTHING_DELIVERED,
) -> Usage:
    """Usage of one chat-completions response, priced.

    Reads ``usage.prompt_tokens``, ``completion_tokens``, ``total_tokens``,
    ``prompt_tokens_details.cached_tokens`` and ``completion_tokens_details.reasoning_tokens``
    (OpenAI API reference, chat completion object); output and reasoning as ``billed_output``
    reads them, all priced as output. Believed only upward: output is at least
    ``least_tokens`` of the returned text and ``delivered.floor`` (what a stream delivered,
    reasoning included), input at least ``least_tokens`` of ``prompt_texts`` (the request's
    messages and tool definitions); cached input at most the prompt as reported, so what the
    floor adds is never priced as cached. Missing or nonsense usage is estimated (``_estimated``,
    flagged ``estimated``): the prompt as ``prompt_estimate`` (the call's upper bound), the
    completion as ``output_estimate`` of the text or ``delivered.estimate`` (everything a
    stream delivered), the larger, at most ``max_output_tokens`` when given (a streamed
    answer: one past it is cut; an answer sent whole could not be, so none is given), never
    below ``delivered.floor``. Every choice's texts count (a provider bills all it sent).
    A caller that knows the call's bounds treats a count past them (``implausible_usage``) as
    nonsense too, and reads the response without its usage.
    """
    raw = response.get("usage")
    raw = raw if isinstance(raw, Mapping) else {}
    texts = [text for message in _messages(response) for text in completion_texts(message)]
    reported_in = _count(raw.get("prompt_tokens"))
    reported_out = _count(raw.get("completion_tokens"))
    if reported_in is None or reported_out is None:  # missing or nonsense: estimate, upward
        return _estimated(texts, pricing, prompt_estimate, max_output_tokens, delivered)
    input_tokens = least_tokens(prompt_texts, above=reported_in)
    output_tokens, reasoning = billed_output(
        completion=reported_out,
        reasoning=_count(_details(raw, "completion_tokens_details").get("reasoning_tokens")),
        prompt=reported_in,
        total=_count(raw.get("total_tokens")),
    )
    output_tokens = max(least_tokens(texts, above=output_tokens), delivered.floor)
    cached = min(
        _count(_details(raw, "prompt_tokens_details").get("cached_tokens")) or 0, reported_in
    )
    cost = pricing.cost(
        input_tokens=input_tokens, cached_input_tokens=cached, output_tokens=output_tokens
    )
    return Usage(input_tokens, output_tokens, cached, cost, False, reasoning)
