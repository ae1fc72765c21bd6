"""Classify a raw chat-completions response into a typed decision, before anything runs.

The model proposes; this module only says *what kind* of proposal it is. Validation of tool
names and arguments is ``validate``'s job; deciding the phase is ``loop``'s.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping
from typing import Any

from agentrun.kernel.usage import utf8_bytes


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
    OVERSIZED = "oversized"
    """A final answer longer than ``MAX_CONTENT_BYTES``: never stored whole, never an answer."""
    TOO_MANY_CALLS = "too_many_calls"
    """More tool calls in one reply than ``MAX_CALLS_PER_REPLY``: none of them runs."""
    UNSTORABLE = "unstorable"
    """The turn's record would not fit the bus's message cap even with its tool results
    bounded (``bounds.shrink_record``): nothing of the reply is kept but its usage."""


MAX_ARGUMENTS_BYTES = 65_536
"""Most UTF-8 bytes of one tool call's ``arguments``; longer ones are dropped (the call becomes
an error result) so a turn's committed record stays well under the bus's 1 MiB message cap."""
MAX_BATCH_ARGUMENTS_BYTES = 262_144
"""Most UTF-8 bytes of all the ``arguments`` of one response; calls past it are dropped too."""
MAX_CONTENT_BYTES = 131_072
"""Most UTF-8 bytes of assistant text (content or refusal) kept; the rest is cut. A final
answer over it is ``Malformed(OVERSIZED)``."""
PLACEHOLDER_CHARS = 256
"""Characters of dropped arguments kept in the record, for audit; also the longest tool name
and call id kept (a longer id is replaced by a minted one, see ``validate.check_calls``)."""
MAX_CALLS_PER_REPLY = 128
"""Most tool calls one reply may make; a reply with more is ``Malformed(TOO_MANY_CALLS)``, so
the calls, their results and the run's summary of one turn stay within the bus's message cap
(each call is stored with its id, name, arguments and result)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ToolCall:
    """One proposed call, as the model wrote it (untrusted)."""

    id: str | None
    """The model's ``tool_call_id``; may be missing or repeated."""
    name: str
    """The tool name as written (may be unknown or mangled)."""
    arguments: Any
    """The raw ``function.arguments`` (normally a JSON string; anything is possible); a
    bounded placeholder when ``dropped`` is set."""
    dropped: int | None = None
    """UTF-8 bytes of arguments dropped for exceeding ``MAX_ARGUMENTS_BYTES`` (or the batch's
    ``MAX_BATCH_ARGUMENTS_BYTES``); such a call never runs (``validate`` makes it an error)."""


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
    """``value`` as valid Unicode: a lone surrogate (half an emoji) becomes U+FFFD, once for
    each byte of its three-byte UTF-8 form (Python's ``replace`` decoding of it).

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


def clip_text(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes (never inside a character), followed by a
    marker naming the bytes cut; ``text`` itself when it fits."""
    if len(text) <= limit // 4:  # fits even at 4 bytes a character
        return text
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    kept = utf8_prefix(data, limit)
    return kept + f"\n[agentrun: cut, {len(data) - utf8_bytes(kept)} more bytes]"


def utf8_prefix(data: bytes, limit: int) -> str:
    """The longest whole characters at the start of ``data`` (UTF-8, an unpaired surrogate
    encoded as three bytes: Python's ``surrogatepass``) that take at most ``limit`` bytes (none
    for ``limit`` ≤ 0), decoded: a cut backs off to the start of the character it would split
    and drops nothing else."""
    end = max(0, min(limit, len(data)))
    while 0 < end < len(data) and data[end] & 0xC0 == 0x80:  # a continuation byte
        end -= 1
    return data[:end].decode("utf-8", "surrogatepass")


NULL_BYTES = len(b"null")
"""The bytes of a call without arguments, stored as JSON's ``null``."""


def _arguments_size(arguments: Any) -> int:
    """UTF-8 bytes of arguments as ``_arguments_text`` leaves them and they are stored: text,
    or none (``NULL_BYTES``); a value it could not write as JSON (nested past the stack, or of
    no JSON type) is ``MAX_BATCH_ARGUMENTS_BYTES`` + 1, so the caps drop it."""
    if arguments is None:
        return NULL_BYTES
    if isinstance(arguments, str):
        return len(arguments.encode("utf-8", "surrogatepass"))
    return MAX_BATCH_ARGUMENTS_BYTES + 1


def _arguments_text(arguments: Any) -> Any:
    """Arguments as the JSON text the OpenAI contract has: an object or another value (an
    answer sent whole may hold one) as its JSON, so it is measured, parsed, bounded and
    repaired as text is, and stored as text; a value that cannot be written as JSON (nested
    past the stack, or of no JSON type) as it is, which the size cap then drops. ``None``
    stays ``None``."""
    if arguments is None or isinstance(arguments, str):
        return arguments
    try:
        return json.dumps(arguments, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return arguments


def _call_id(value: Any) -> str | None:
    """The model's call id, or ``None`` (a minted id replaces it) when missing, empty or longer
    than ``PLACEHOLDER_CHARS``."""
    text = _text(value)
    return text if text and len(text) <= PLACEHOLDER_CHARS else None


def _read_calls(raw: Any) -> tuple[ToolCall, ...]:
    """The calls of ``tool_calls``; arguments over ``MAX_ARGUMENTS_BYTES``, or past
    ``MAX_BATCH_ARGUMENTS_BYTES`` for the batch, are replaced by a placeholder (``dropped``)."""
    calls: list[ToolCall] = []
    total = 0
    for item in raw if isinstance(raw, list) else ():
        item = item if isinstance(item, Mapping) else {}
        function = item.get("function")
        function = function if isinstance(function, Mapping) else {}
        arguments = _arguments_text(function.get("arguments"))
        size = _arguments_size(arguments)
        dropped: int | None = None
        if size > MAX_ARGUMENTS_BYTES or total + size > MAX_BATCH_ARGUMENTS_BYTES:
            dropped = size
            head = arguments if isinstance(arguments, str) else type(arguments).__name__
            arguments = clean_text(head[:PLACEHOLDER_CHARS]) + f"…[{size} bytes dropped]"
        else:
            total += size
        calls.append(
            ToolCall(
                id=_call_id(item.get("id")),
                name=clean_text(str(function.get("name") or ""))[:PLACEHOLDER_CHARS],
                arguments=clean_text(arguments) if isinstance(arguments, str) else arguments,
                dropped=dropped,
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
    ``Final``. Text with lone surrogates is repaired (``clean_text``). Model output is bounded
    so a committed turn never outgrows the bus's message cap: text is cut at
    ``MAX_CONTENT_BYTES`` (a final answer over it is ``Malformed(OVERSIZED)``), tool call
    arguments past ``MAX_ARGUMENTS_BYTES`` / ``MAX_BATCH_ARGUMENTS_BYTES`` are dropped
    (``ToolCall.dropped``), a reply with more than ``MAX_CALLS_PER_REPLY`` calls is
    ``Malformed(TOO_MANY_CALLS)`` (unless it was cut off: ``TRUNCATED``). Never raises.
    """
    choices = response.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    message = choice.get("message") if isinstance(choice, Mapping) else None
    if not isinstance(message, Mapping):
        return Malformed(MalformedCause.NO_CHOICE, "the response has no choices[0].message")
    assert isinstance(choice, Mapping)
    finish = choice.get("finish_reason")
    content = _text(message.get("content"))
    whole = content
    content = None if content is None else clip_text(content, MAX_CONTENT_BYTES)
    refusal = _text(message.get("refusal"))
    refusal = None if refusal is None else clip_text(refusal, MAX_CONTENT_BYTES)
    if refusal is not None and refusal.strip():
        return Refusal(refusal)
    calls = _calls_decision(message.get("tool_calls"), finish=finish, content=content)
    if calls is not None:
        return calls
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
    return _answer(content, whole)


def _calls_decision(raw: Any, *, finish: Any, content: str | None) -> Decision | None:
    """The decision of a reply by its ``tool_calls`` and ``finish_reason`` (``None`` when it
    holds no call and was not cut off): ``Malformed(TRUNCATED)`` when cut off, then
    ``Malformed(TOO_MANY_CALLS)`` past ``MAX_CALLS_PER_REPLY``, else ``ToolCalls``."""
    count = len(raw) if isinstance(raw, list) else 0
    if finish == "length":
        what = f"{count} tool call(s)" if count else "the answer"
        return Malformed(
            MalformedCause.TRUNCATED,
            f"the output hit the token limit in the middle of {what}; nothing was run",
            content,
        )
    if count > MAX_CALLS_PER_REPLY:
        return Malformed(
            MalformedCause.TOO_MANY_CALLS,
            f"the reply holds {count} tool calls, over the {MAX_CALLS_PER_REPLY} one reply "
            "may make; none of them was run",
            content,
        )
    calls = _read_calls(raw)
    if calls:
        return ToolCalls(calls, content if content and content.strip() else None)
    return None


def _answer(content: str | None, whole: str | None) -> Decision:
    """The final answer ``content`` (cut from ``whole`` when over ``MAX_CONTENT_BYTES``)."""
    if not content or not content.strip():
        return Malformed(MalformedCause.EMPTY, "the response has neither content nor tool calls")
    if content is not whole:
        return Malformed(
            MalformedCause.OVERSIZED,
            f"the answer is {len(str(whole).encode())} bytes, over the {MAX_CONTENT_BYTES}-byte "
            "cap; it was cut and not accepted",
            content[:PLACEHOLDER_CHARS] + "…",
        )
    return Final(content)
