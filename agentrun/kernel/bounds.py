"""How much one committed turn may hold, so its event always fits the bus's message cap.

A turn is committed as one message, and NATS refuses a message over its server's
``max_payload`` (1 MiB unless configured). What the model wrote is bounded where a reply is
classified (``decision``: arguments, text, calls per reply). What the tools returned is
bounded here, per turn: ``bound_results`` keeps a turn's results within a byte budget derived
from the cap (``results_budget``: half of it, less what the model's own reply takes), cutting
the result that crosses it and replacing every later one, in call order, by a short
placeholder naming the bytes dropped — each call still gets its one result, under its id.
Sizes are counted as stored: UTF-8 bytes of the text as a JSON string, escapes included.

Should an event still be refused as too large, ``shrink_record`` gives the record to commit
instead: the model's reply becomes a corrective turn that keeps its usage (nothing with an
effect ran in it), and a resume turn keeps every call's result as a placeholder (its effects
did happen). Pure functions of records; the worker measures and commits.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from agentrun.kernel import records
from agentrun.kernel.decision import (
    Decision,
    Final,
    Malformed,
    MalformedCause,
    Refusal,
    ToolCalls,
    clip_text,
    utf8_prefix,
)
from agentrun.kernel.usage import utf8_bytes
from agentrun.kernel.validate import CheckedCall, stored_arguments

MESSAGE_CAP = 1_048_576
"""NATS's default ``max_payload`` in bytes; the worker passes its server's own value."""
RESERVED_BYTES = 65_536
"""Bytes of the cap kept for the rest of a turn's event: the run's summary, the record's keys
and counters, the message headers."""
RESULT_OVERHEAD = 64
"""Bytes counted per result for its stored keys and flags, besides its id, name and content."""
PLACEHOLDER_BYTES = 256
"""Bytes reserved for the placeholder of each result after the one being placed."""
MIN_KEPT_BYTES = 1024
"""A result that would be cut to fewer bytes than this is replaced by a placeholder instead."""
SHRUNK_TEXT_BYTES = 4096
"""Bytes of a refusal or an error message kept when a record is shrunk."""


def clip_result(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` bytes as stored (``stored_bytes``: UTF-8 of the text as
    a JSON string, escapes included — a quote, backslash or newline takes 2, another control
    character 6), never inside a character, with a marker saying how many bytes (UTF-8) were
    dropped so the model knows it saw only part; ``text`` itself when it fits. The marker
    (``[agentrun: result truncated, N more bytes]``, on its own line) comes on top of
    ``limit``. Never raises."""
    if len(text) <= limit // 6:  # cannot exceed the limit even at 6 stored bytes a character
        return text
    head = text[: max(0, limit)]  # every character stores at least one byte
    if len(head) == len(text) and stored_bytes(text) <= limit:
        return text
    low, high = 0, len(head)  # the longest prefix whose stored size fits
    while low < high:
        middle = (low + high + 1) // 2
        if stored_bytes(head[:middle]) <= limit:
            low = middle
        else:
            high = middle - 1
    dropped = len(text[low:].encode("utf-8", "surrogatepass"))
    return text[:low] + f"\n[agentrun: result truncated, {dropped} more bytes]"


def stored_bytes(text: str) -> int:
    """UTF-8 bytes of ``text`` stored as a JSON string, escapes included, quotes not
    (``"``, ``\\`` and ``\\n`` count 2, other control characters 6). Never raises."""
    encoded = json.dumps(text, ensure_ascii=False)
    if encoded.isascii():
        return len(encoded) - 2
    return len(encoded.encode("utf-8", "surrogatepass")) - 2


def results_budget(cap: int, *, reply_bytes: int = 0) -> int:
    """Bytes a turn's tool results may take in its record, for a bus whose messages may hold
    ``cap`` bytes: half the cap (512 KiB at the default cap), and never more than what the
    model's reply (``reply_bytes``, see ``reply_size``) and ``RESERVED_BYTES`` leave."""
    return max(0, min(cap // 2, cap - RESERVED_BYTES - reply_bytes))


def reply_size(record: records.Answered) -> int:
    """Bytes the model's reply takes in ``record`` as stored: its text, each call's raw
    arguments, id and name, and each validated call's arguments or validation error (a held
    call's arguments twice more: the run's summary shows them to the reviewer)."""
    decision = record.decision
    size = stored_bytes(_decision_text(decision))
    if isinstance(decision, ToolCalls):
        size += sum(
            stored_bytes(c.arguments if isinstance(c.arguments, str) else str(c.arguments))
            for c in decision.calls
        )
    held = set(record.held)
    for call in record.calls:
        size += RESULT_OVERHEAD + 2 * (stored_bytes(call.id) + stored_bytes(call.name))
        if isinstance(call, CheckedCall):
            size += stored_bytes(stored_arguments(call)) * (3 if call.id in held else 1)
        else:
            size += stored_bytes(call.error)
    return size


def _decision_text(decision: Decision) -> str:
    match decision:
        case Final(content):
            return content
        case ToolCalls(_, content) | Malformed(_, _, content):
            return content or ""
        case Refusal(text):
            return text


def _cut(text: str, room: int, *, budget: int) -> str:
    """``text`` cut so that it takes at most ``room`` bytes as stored, with a marker naming
    the bytes cut (never inside a character)."""
    data = text.encode("utf-8", "surrogatepass")
    limit = room - 200  # the marker's bytes
    while True:
        kept = utf8_prefix(data, limit)
        cut = len(data) - utf8_bytes(kept)
        marked = (
            f"{kept}\n[agentrun: result cut, {cut} more bytes: this turn's tool results "
            f"reached their cap of {budget} bytes]"
        )
        size = stored_bytes(marked)
        if size <= room or limit <= 0:
            return marked
        limit = limit * room // size - 16  # escapes made it larger: shrink in proportion


def placeholder(size: int, *, budget: int) -> str:
    """The content a dropped result is replaced by: its size, the cap, what to do instead."""
    return (
        f"[agentrun: result dropped, {size} bytes: this turn's tool results passed their cap "
        f"of {budget} bytes. Make fewer tool calls in one turn, or ask for less output]"
    )


def bound_results(
    results: Sequence[records.ToolResult], *, budget: int
) -> tuple[records.ToolResult, ...]:
    """``results`` (one per call, in call order) within ``budget`` bytes as stored: results are
    kept whole in call order while they fit, the one that crosses the budget is cut to what is
    left (with a marker naming the bytes cut; dropped instead if under ``MIN_KEPT_BYTES``),
    and every later one is replaced by a ``placeholder`` (unless it is no longer than one).
    Ids, names, errors and faults are kept, so call-id correlation and the run's counters stay
    intact. ``results`` itself when it fits; placeholders may pass a budget too small to hold
    them (``shrink_record`` is the backstop)."""
    contents = [stored_bytes(r.content) for r in results]
    overheads = [
        RESULT_OVERHEAD + stored_bytes(r.tool_call_id) + stored_bytes(r.name) for r in results
    ]
    if sum(contents) + sum(overheads) <= budget:
        return tuple(results)
    floors = [o + min(c, PLACEHOLDER_BYTES) for c, o in zip(contents, overheads, strict=True)]
    later = sum(floors)  # what the results after the current one need at least
    used, full = 0, False
    bounded: list[records.ToolResult] = []
    for result, size, overhead, floor in zip(results, contents, overheads, floors, strict=True):
        later -= floor
        room = budget - used - overhead - later
        if (full or size > room) and size > PLACEHOLDER_BYTES:
            content = (
                _cut(result.content, room, budget=budget)
                if not full and room >= MIN_KEPT_BYTES
                else placeholder(size, budget=budget)
            )
            result = dataclasses.replace(result, content=content)
            size, full = stored_bytes(content), True
        used += overhead + size
        bounded.append(result)
    return tuple(bounded)


def bound_for_cap(
    results: Sequence[records.ToolResult], *, cap: int, reply: records.Answered | None = None
) -> tuple[records.ToolResult, ...]:
    """``results`` bounded (``bound_results``) for a bus whose messages hold ``cap`` bytes,
    next to the model's ``reply`` (``None`` for a resume turn). Results that cannot take more
    than an eighth of the cap even at 6 bytes a character are returned unmeasured: the
    reply's own caps (text, arguments, calls per reply) leave far more than that, unless its
    text is mostly escapes — which ``shrink_record`` handles."""
    most = sum(6 * (len(r.content) + len(r.tool_call_id) + len(r.name)) for r in results)
    if most + RESULT_OVERHEAD * len(results) <= cap // 8:
        return tuple(results)
    reply_bytes = 0 if reply is None else reply_size(reply)
    return bound_results(results, budget=results_budget(cap, reply_bytes=reply_bytes))


def shrink_record(record: records.TurnRecord, *, size: int, cap: int) -> records.TurnRecord:
    """The record to commit instead of ``record``, whose event was ``size`` bytes, over the
    ``cap`` the bus accepts. A model's reply (``Answered``) becomes ``Malformed(UNSTORABLE)``
    with its usage and any budget ending kept — its tool results are lost, but only ``read``
    calls ran in it (calls with effects are committed before they run) — so the model is
    corrected and the run's counters charge the call; a refusal keeps its first
    ``SHRUNK_TEXT_BYTES``. A summary is recorded as not written. A resume turn keeps one
    placeholder result per call (its calls ran; their effects happened). Error messages are
    cut to ``SHRUNK_TEXT_BYTES``."""
    why = f"the turn's record was {size} bytes, over the {cap} bytes one committed turn may hold"
    budget = results_budget(cap)
    match record:
        case records.Answered(turn, Refusal(text), usage):
            return records.Answered(turn, Refusal(clip_text(text, SHRUNK_TEXT_BYTES)), usage)
        case records.Answered():
            detail = f"{why}; nothing of the reply or its tool results was kept"
            decision = Malformed(MalformedCause.UNSTORABLE, detail)
            return records.Answered(record.turn, decision, record.usage, stopped=record.stopped)
        case records.Summarized():
            return records.Summarized(record.turn, None, record.usage, error=f"{why}; not kept")
        case records.Resumed():
            results = tuple(
                dataclasses.replace(r, content=placeholder(stored_bytes(r.content), budget=budget))
                if stored_bytes(r.content) > PLACEHOLDER_BYTES
                else r
                for r in record.results
            )
            return dataclasses.replace(record, results=results)
        case records.Stopped(turn, ending):
            message = clip_text(ending.message, SHRUNK_TEXT_BYTES)
            return records.Stopped(turn, records.Ending(ending.phase, message))
        case records.ModelFailed(turn, error):
            return records.ModelFailed(turn, clip_text(error, SHRUNK_TEXT_BYTES))
