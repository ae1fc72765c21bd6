"""Classify a raw chat-completions response into a typed decision, before anything runs.

The model proposes; this module only says *what kind* of proposal it is. Validation of tool
names and arguments is ``validate``'s job; deciding the phase is ``loop``'s.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any


class MalformedCause(enum.StrEnum):
    """Why a response is not a usable decision (each becomes a corrective turn)."""

    NO_CHOICE = "no_choice"
    """The response has no ``choices[0].message`` object."""
    EMPTY_TOOL_CALLS = "empty_tool_calls"
    """``finish_reason: tool_calls`` with no calls."""
    EMPTY = "empty"
    """Neither content nor tool calls: an empty final answer is not an answer."""
    TRUNCATED = "truncated"
    """``finish_reason: length``: output cut off by the token limit; never run or store it."""
    INVALID_TOOL_CALLS = "invalid_tool_calls"
    """Tool calls whose names or arguments failed validation (set by ``validate``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ToolCall:
    """One proposed call, as the model wrote it (untrusted)."""

    id: str | None
    """The model's ``tool_call_id``; may be missing or repeated."""
    name: str
    """The tool name as written (may be unknown or mangled)."""
    arguments: Any
    """The raw ``function.arguments`` (normally a JSON string; anything is possible)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Final:
    """A final answer in prose (or JSON, when the run has an output schema)."""

    content: str


@dataclasses.dataclass(frozen=True, slots=True)
class ToolCalls:
    """One or more tool calls, with any text the model wrote alongside."""

    calls: tuple[ToolCall, ...]
    content: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class Refusal:
    """The model declined (``message.refusal`` or a content filter): the run ends ``refused``."""

    text: str


@dataclasses.dataclass(frozen=True, slots=True)
class Malformed:
    """Not a usable decision; the loop answers with a corrective turn."""

    cause: MalformedCause
    detail: str
    content: str | None = None


Decision = Final | ToolCalls | Refusal | Malformed


def clean_text(value: str) -> str:
    """``value`` as valid Unicode: lone surrogates (half an emoji) become U+FFFD.

    A lone surrogate cannot be encoded as UTF-8, so it would make the turn uncommittable and
    the next request unsendable; it is replaced at the door instead.
    """
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return value


def _text(value: Any) -> str | None:
    return clean_text(value) if isinstance(value, str) else None


def _read_calls(raw: Any) -> tuple[ToolCall, ...]:
    calls: list[ToolCall] = []
    for item in raw if isinstance(raw, list) else ():
        item = item if isinstance(item, Mapping) else {}
        function = item.get("function")
        function = function if isinstance(function, Mapping) else {}
        arguments = function.get("arguments")
        calls.append(
            ToolCall(
                id=_text(item.get("id")) or None,
                name=clean_text(str(function.get("name") or "")),
                arguments=clean_text(arguments) if isinstance(arguments, str) else arguments,
            )
        )
    return tuple(calls)


def _filtered_categories(choice: Mapping[str, Any]) -> str:
    """The categories a content filter flagged in a choice (Azure OpenAI's
    ``content_filter_results``: ``{category: {filtered: bool, severity}}``), comma-separated."""
    results = choice.get("content_filter_results")
    flagged = sorted(
        clean_text(str(name))
        for name, verdict in (results.items() if isinstance(results, Mapping) else ())
        if isinstance(verdict, Mapping) and verdict.get("filtered") is True
    )
    return ", ".join(flagged) or "unspecified category"


def classify(response: Mapping[str, Any]) -> Decision:
    """Sort a chat-completions response (the JSON object) into a ``Decision``.

    Rules, in order (shape per the OpenAI API reference, chat completion object):
    a non-empty ``refusal`` → ``Refusal``; ``finish_reason: length`` → ``Malformed(TRUNCATED)``
    (arguments cut mid-way are never run); any tool calls → ``ToolCalls`` whatever the
    ``finish_reason`` says (decide on the calls, not the label); ``finish_reason: tool_calls``
    with none → ``Malformed(EMPTY_TOOL_CALLS)``; ``content_filter`` → ``Refusal`` (partial text
    that got through a filter is no answer); blank content → ``Malformed(EMPTY)``; otherwise
    ``Final``. Text with lone surrogates is repaired (``clean_text``). Never raises.
    """
    choices = response.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    message = choice.get("message") if isinstance(choice, Mapping) else None
    if not isinstance(message, Mapping):
        return Malformed(MalformedCause.NO_CHOICE, "the response has no choices[0].message")
    assert isinstance(choice, Mapping)
    finish = choice.get("finish_reason")
    content = _text(message.get("content"))
    refusal = _text(message.get("refusal"))
    if refusal is not None and refusal.strip():
        return Refusal(refusal)
    calls = _read_calls(message.get("tool_calls"))
    if finish == "length":
        what = f"{len(calls)} tool call(s)" if calls else "the answer"
        return Malformed(
            MalformedCause.TRUNCATED,
            f"the output hit the token limit in the middle of {what}; nothing was run",
            content,
        )
    if calls:
        return ToolCalls(calls, content if content and content.strip() else None)
    if finish == "content_filter":  # what got through the filter is not an answer
        return Refusal(
            "the provider's content filter stopped the output: " + _filtered_categories(choice)
        )
    if finish == "tool_calls":
        return Malformed(
            MalformedCause.EMPTY_TOOL_CALLS,
            "finish_reason was tool_calls but the response holds no tool calls",
            content,
        )
    if not content or not content.strip():
        return Malformed(MalformedCause.EMPTY, "the response has neither content nor tool calls")
    return Final(content)
