"""What one streamed chat completion delivered: its chunks folded into one response, and
the output delivered so far counted, so the model adapter can cut it at the call's allowance.

What belongs here: folding ``chat.completion.chunk`` objects (OpenAI API reference, "The chat
completion chunk object") into the ``chat.completion`` shape the kernel classifies
(``Delivery``, pure: no I/O), the counts of delivered output the cut compares with the
allowance (``delivered_tokens``) and a cut or abandoned response is charged
(``charged_tokens``), and the worker's own keys on the folded response. What does not:
reading the stream (``stream``), the HTTP client's bounds on an answer (``answers``), the
request and its errors (``model``), budgets (the kernel's allowance, the ledger's hold).

Two counts. A provider that honours ``max_tokens`` stops at the allowance by its own
tokenizer; the cut must not come before that, so it compares a count that does not run ahead
of a real tokenizer's: the content-bearing chunks (streaming servers send at least one token
per chunk; OpenAI's and llama.cpp's send one) or ``kernel.least_tokens``'s rates, sixteen
ASCII characters a token plus eight other characters a token (English runs 4–5 characters a
cl100k token, Russian about 5 an o200k token, CJK one or two), whichever is larger. A
response cut there — its provider ignored ``max_tokens`` — is charged at the usual density
(``charged_tokens``: four ASCII characters or one other character a token, at least the
chunks), which may pass what was held for it: that call's overrun ends the run with its cap's
reason and is counted in ``agentrun_budget_overrun_tokens_total``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from agentrun import kernel

CUT_KEY = "x_agentrun_cut"
"""Set on a response the worker cut: the output tokens it is charged (``charged_tokens``).
Not an OpenAI field: nothing but the worker reads it (the kernel classifies the rest)."""
DELIVERED_KEY = "x_agentrun_delivered"
"""Set on every streamed response: the least a provider can have billed for the output it
delivered (``Delivery.least_tokens``, reasoning included), whatever its usage says."""
ESTIMATE_KEY = "x_agentrun_estimate"
"""Set on a streamed response that reported no usage: its output tokens estimated from
everything it delivered (``kernel.output_estimate`` of the message's texts and of those it
does not keep: reasoning, choices not asked for), what ``kernel.read_usage`` charges at
least when it must estimate."""
CUT_FINISH_REASON = "length"
"""The finish reason of a response the worker cut: what a provider says when it stops at
``max_tokens`` (the kernel asks for a shorter reply, or the run ends at its cap)."""


FOLDED_DELTA_KEYS = frozenset({"role", "content", "refusal", "tool_calls"})
"""Delta fields folded into the message (the others are only counted)."""
NOT_OUTPUT_KEYS = frozenset({"role", "id", "type", "index", "format", "signature"})
"""Fields of a delta's other parts that name or sign output rather than carry it."""


def _texts(value: Any) -> list[str]:
    """The non-empty strings in ``value`` (a delta field's JSON) outside ``NOT_OUTPUT_KEYS``:
    output a provider streams in a field of its own — the reasoning of ``reasoning_content``
    (DeepSeek, vLLM, llama.cpp), ``reasoning`` (OpenRouter, Groq, Ollama) or
    ``reasoning_details`` (OpenRouter), a legacy ``function_call``, an audio transcript —
    is output tokens the provider bills, so the cut and an abandoned call's charge count it,
    whatever the field is called. Walked with a stack of its own, in order: a value nested as
    deep as the JSON parser takes would pass the interpreter's recursion limit here."""
    texts: list[str] = []
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if item:
                texts.append(item)
        elif isinstance(item, Mapping):
            pending.extend(reversed([v for k, v in item.items() if k not in NOT_OUTPUT_KEYS]))
        elif isinstance(item, list):
            pending.extend(reversed(item))
    return texts


@dataclasses.dataclass(slots=True)
class _Call:
    id: str = ""
    name: list[str] = dataclasses.field(default_factory=list)
    arguments: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(slots=True)
class Delivery:
    """What one streamed response delivered so far (mutable; one per call)."""

    content: list[str] = dataclasses.field(default_factory=list)
    refusal: list[str] = dataclasses.field(default_factory=list)
    calls: dict[int, _Call] = dataclasses.field(default_factory=dict)
    finish_reason: str | None = None
    usage: Mapping[str, Any] | None = None
    """The provider's ``usage`` (the final chunk's, with ``stream_options.include_usage``)."""
    id: str | None = None
    chunks: int = 0
    """Chunks that carried output (text, a tool call's part, reasoning or any other output
    field: ``_texts``)."""
    ascii_chars: int = 0
    other_chars: int = 0
    cut: bool = False
    """The worker stopped reading before the provider finished (the allowance was reached)."""
    unfolded: list[str] = dataclasses.field(default_factory=list)
    """Output texts the message does not keep (reasoning and other fields: ``_texts``; every
    text of a choice other than the first, which a provider bills though n is 1)."""

    def add(self, chunk: Any) -> None:
        """Fold one ``chat.completion.chunk`` (parsed JSON; anything else is ignored)."""
        if not isinstance(chunk, Mapping):
            return
        if isinstance(chunk.get("id"), str):
            self.id = chunk["id"]
        usage = chunk.get("usage")
        if isinstance(usage, Mapping):
            self.usage = usage
        choices = chunk.get("choices")
        carried = False
        for position, choice in enumerate(choices if isinstance(choices, list) else ()):
            if not isinstance(choice, Mapping):
                continue
            delta = choice.get("delta")
            if choice.get("index", position) != 0:  # a choice not asked for (n is 1): billed
                carried = self._add_unfolded(delta) or carried
                continue
            if isinstance(choice.get("finish_reason"), str):
                self.finish_reason = choice["finish_reason"]
            if isinstance(delta, Mapping):
                carried = self._add_delta(delta) or carried
        if carried:
            self.chunks += 1

    def _add_unfolded(self, value: Any) -> bool:
        """Count the output texts of ``value`` that the message does not keep (``_texts``);
        True if it carried any."""
        texts = _texts(value)
        for text in texts:
            self.unfolded.append(text)
            self._count(text)
        return bool(texts)

    def _add_delta(self, delta: Mapping[str, Any]) -> bool:
        """Fold a delta; True if it carried output."""
        carried = False
        for key, parts in (("content", self.content), ("refusal", self.refusal)):
            text = delta.get(key)
            if isinstance(text, str) and text:
                parts.append(text)
                self._count(text)
                carried = True
        calls = delta.get("tool_calls")
        for part in calls if isinstance(calls, list) else ():
            if isinstance(part, Mapping):
                carried = self._add_call(part) or carried
        for key, value in delta.items():
            if key not in FOLDED_DELTA_KEYS:
                carried = self._add_unfolded(value) or carried
        return carried

    def _add_call(self, part: Mapping[str, Any]) -> bool:
        """Fold one part of a tool call; True if it carried output. At most
        ``kernel.MAX_CALLS_PER_REPLY`` + 1 calls are kept (enough for the classifier to refuse
        the reply: parts of further calls are counted, not kept) and an id at most
        ``kernel.PLACEHOLDER_CHARS`` + 1 characters (a longer one is replaced anyway): an id
        carries no output, so nothing else would bound what a stream of them keeps."""
        position = self._position(part)
        call = self.calls.get(position)
        if call is None:
            call = _Call()
            if len(self.calls) <= kernel.MAX_CALLS_PER_REPLY:
                self.calls[position] = call
        if isinstance(part.get("id"), str):
            call.id = part["id"][: kernel.PLACEHOLDER_CHARS + 1]
        function = part.get("function")
        if not isinstance(function, Mapping):
            return False
        carried = False
        for key, parts in (("name", call.name), ("arguments", call.arguments)):
            text = function.get(key)
            if isinstance(text, str) and text:
                parts.append(text)
                self._count(text)
                carried = True
        return carried

    def _position(self, part: Mapping[str, Any]) -> int:
        """The call a part belongs to: its ``index``; without one (providers that leave it
        out), the last call when the part repeats that call's id, a new call when it names one
        (another id, or a function name), else the last call, whose arguments it continues."""
        index = part.get("index")
        if isinstance(index, int):
            return index
        function = part.get("function")
        named = isinstance(function, Mapping) and function.get("name")
        ident = part.get("id")
        if self.calls:
            last = max(self.calls)
            if (
                isinstance(ident, str)
                and ident
                and ident[: kernel.PLACEHOLDER_CHARS + 1] == (self.calls[last].id)
            ):
                return last
            if not ident and not named:
                return last
        return max(self.calls, default=-1) + 1

    def _count(self, text: str) -> None:
        if text.isascii():  # most chunks: no encoding needed
            self.ascii_chars += len(text)
            return
        ascii_chars = len(text.encode("ascii", "ignore"))
        self.ascii_chars += ascii_chars
        self.other_chars += len(text) - ascii_chars

    @property
    def delivered_tokens(self) -> int:
        """Output tokens delivered, counted so as not to run ahead of a real tokenizer's
        count (what the cut compares with the allowance): the content-bearing chunks, or
        ``kernel.LEAST_ASCII_CHARS`` ASCII characters a token plus ``LEAST_OTHER_CHARS``
        other characters a token (the rates of ``kernel.least_tokens``), whichever is
        larger."""
        ascii_tokens = -(-self.ascii_chars // kernel.LEAST_ASCII_CHARS)
        return max(self.chunks, ascii_tokens + -(-self.other_chars // kernel.LEAST_OTHER_CHARS))

    @property
    def charged_tokens(self) -> int:
        """Output tokens a response cut mid-way (or abandoned) is charged: the content-bearing
        chunks, or four ASCII characters a token plus one per other character, whichever is
        larger — the usual density, never below ``delivered_tokens``."""
        return max(self.chunks, -(-self.ascii_chars // 4) + self.other_chars)

    def message(self) -> dict[str, Any]:
        """The assistant message delivered so far."""
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self.content) if self.content else None,
            "refusal": "".join(self.refusal) if self.refusal else None,
        }
        if self.calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": "".join(call.name), "arguments": "".join(call.arguments)},
                }
                for _, call in sorted(self.calls.items())
            ]
        return message

    def completion(self) -> dict[str, Any]:
        """The response as one ``chat.completion`` object: the usage the provider reported
        (none when it sent none: then ``ESTIMATE_KEY``). A cut response has finish reason
        ``length``, no usage, and ``CUT_KEY`` holding ``charged_tokens`` (what it is charged
        as output). ``DELIVERED_KEY`` holds ``least_tokens``."""
        finish = CUT_FINISH_REASON if self.cut else (self.finish_reason or "stop")
        completion: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion",
            "choices": [{"index": 0, "message": self.message(), "finish_reason": finish}],
            "usage": None if self.cut else self.usage,
        }
        if self.cut:
            completion[CUT_KEY] = self.charged_tokens
        elif self.usage is None:
            texts = kernel.completion_texts(completion["choices"][0]["message"]) + self.unfolded
            completion[ESTIMATE_KEY] = kernel.output_estimate(texts)
        completion[DELIVERED_KEY] = self.least_tokens
        return completion

    @property
    def least_tokens(self) -> int:
        """The fewest output tokens any provider can have billed for what was delivered: each
        chunk that carried output is a token at least, and the texts the message does not keep
        (reasoning) count their ``kernel.least_tokens`` (the message's own texts are counted
        from the message)."""
        return max(self.chunks, kernel.least_tokens(self.unfolded))
