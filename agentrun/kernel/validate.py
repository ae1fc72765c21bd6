"""Validate proposed tool calls before anything runs: names, JSON arguments, schemas, ids.

Rules come from how models get tool calls wrong (empty arguments, invalid JSON, mangled
names, missing or duplicate ids) and from the OpenAI tool-calling contract: every
``tool_call_id`` in history must be unique and answered by exactly one tool message.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import jsonschema.protocols

from agentrun.kernel import schemas
from agentrun.kernel.decision import MAX_ARGUMENTS_BYTES, ToolCall, clean_text

MAX_ERRORS_SHOWN = 3


@dataclasses.dataclass(frozen=True, slots=True)
class ToolSchema:
    """What the kernel needs to know about a tool: its JSON Schema and loop-relevant flags."""

    name: str
    parameters: Mapping[str, Any]
    """JSON Schema (2020-12 unless its ``$schema`` says otherwise) of the arguments object,
    applied on the linear-time engine within a work budget (``schemas``)."""
    pollable: bool = False
    """Calls that legitimately repeat (status polls) are exempt from the no-progress breaker."""
    effect: str = "read"
    """``read``, ``idempotent`` or ``write``: a batch holding an ``idempotent`` or ``write`` call
    is committed with the decision before any of its calls runs (``plan.plan_answer``)."""
    validator: jsonschema.protocols.Validator = dataclasses.field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "validator", schemas.validator_for(self.parameters))


@dataclasses.dataclass(frozen=True, slots=True)
class CheckedCall:
    """A call that passed validation: safe to run with ``arguments``."""

    id: str
    name: str
    arguments: Mapping[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class InvalidCall:
    """A call that must not run; ``error`` is the result the model sees."""

    id: str
    name: str
    error: str


def mint_call_id(turn: int, name: str, ordinal: int) -> str:
    """Deterministic id ``<turn>:<tool>:<ordinal>`` for a call whose id is missing or reused."""
    safe = "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in name)[:64] or "tool"
    return f"{turn}:{safe}:{ordinal}"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number (RFC 8259 has no NaN or Infinity)")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text} is out of range for a JSON number")
    return value


_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)


MAX_ARGUMENTS_DEPTH = 64
"""Most nesting of objects and arrays in one call's arguments. Deeper ones get a correction:
arguments nested some hundreds of levels (a few kilobytes, within ``MAX_ARGUMENTS_BYTES``)
raised ``RecursionError`` out of the turn (the run ended ``checkpoint_failed`` after a second
model call), and past ~255 levels the MCP SDK cannot serialize a call: a ``write`` call that
was never sent ended its run ``effect_unknown``."""


class _TooDeep(ValueError):
    def __init__(self) -> None:
        super().__init__(
            f"arguments are nested deeper than {MAX_ARGUMENTS_DEPTH} levels of objects and arrays"
        )


def _strict_loads(text: str) -> Any:
    """``json.loads`` as RFC 8259 reads it: no NaN/Infinity, no overflowing numbers, nested at
    most ``MAX_ARGUMENTS_DEPTH`` levels, and text repaired where an escape left half a
    surrogate pair (``clean_text``). Raises ``ValueError``."""
    try:
        value = _DECODER.decode(text)
    except RecursionError:
        raise _TooDeep() from None
    if schemas.nesting(value, MAX_ARGUMENTS_DEPTH) > MAX_ARGUMENTS_DEPTH:
        raise _TooDeep()
    return _clean(value)


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, dict):
        return {clean_text(k): _clean(v) for k, v in value.items()}
    return value


def _parsed_arguments(raw: Mapping[str, Any]) -> tuple[Mapping[str, Any] | None, str | None]:
    """Arguments the answer held as an object already, or an error: nested too deeply."""
    if schemas.nesting(raw, MAX_ARGUMENTS_DEPTH) > MAX_ARGUMENTS_DEPTH:
        return None, str(_TooDeep())
    return raw, None


def _parse_arguments(raw: Any) -> tuple[Mapping[str, Any] | None, str | None]:
    """Arguments as an object, or an error. No arguments — ``None``, an empty or blank
    string, JSON ``null`` (what servers send for a tool without parameters) — is ``{}``,
    which the tool's schema then accepts or not."""
    if isinstance(raw, Mapping):  # an answer not streamed may hold them parsed
        return _parsed_arguments(raw)
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}, None
    if not isinstance(raw, str):
        return None, f"arguments must be a JSON object, got {type(raw).__name__}"
    try:
        value = _strict_loads(raw)
    except _TooDeep as err:
        return None, str(err)
    except json.JSONDecodeError as err:
        return (
            None,
            f"arguments are not valid JSON: {err.msg} at line {err.lineno} column {err.colno}",
        )
    except ValueError as err:
        return None, f"arguments are not valid JSON: {err}"
    if value is None:
        return {}, None
    if isinstance(value, str):  # double-encoded: a JSON string holding a JSON object
        try:
            value = _strict_loads(value)
        except ValueError as err:
            deep = isinstance(err, _TooDeep)
            return None, str(err) if deep else "arguments are a JSON string, not a JSON object"
    if not isinstance(value, dict):
        return None, f"arguments must be a JSON object, got {type(value).__name__}"
    return value, None


def _schema_errors(schema: ToolSchema, arguments: Mapping[str, Any]) -> str | None:
    try:
        found = schemas.errors(schema.validator, arguments)
    except schemas.WorkExceeded as err:
        return f"the arguments could not be checked against the schema: {err}"
    errors = sorted(found, key=lambda e: list(e.path))
    if not errors:
        return None
    lines = []
    for error in errors[:MAX_ERRORS_SHOWN]:
        where = "/".join(str(p) for p in error.path) or "(root)"
        lines.append(f"{where}: {error.message}")
    return "arguments do not match the schema: " + "; ".join(lines)


def _schema_hint(schema: ToolSchema) -> str:
    return json.dumps(schema.parameters, separators=(",", ":"), sort_keys=True)


def _rekey(calls: Sequence[ToolCall], *, turn: int, used: AbstractSet[str]) -> list[str]:
    batch: set[str] = set()  # ids taken in this batch; ``used`` (the history) is not copied
    ids: list[str] = []
    for ordinal, call in enumerate(calls):
        call_id = call.id
        if not call_id or call_id in batch or call_id in used:
            call_id = mint_call_id(turn, call.name, ordinal)
            while call_id in batch or call_id in used:
                call_id += "_"
        batch.add(call_id)
        ids.append(call_id)
    return ids


def check_calls(
    calls: Sequence[ToolCall],
    *,
    turn: int,
    tools: Mapping[str, ToolSchema],
    used_ids: AbstractSet[str] = frozenset(),
) -> tuple[CheckedCall | InvalidCall, ...]:
    """Validate a batch, keeping the order of the assistant's ``tool_calls``.

    Ids that are missing, or repeated within the batch or the run's history (``used_ids``), are
    re-keyed with ``mint_call_id`` so history holds unique ids. An unknown name gets an error
    listing the available tools; bad JSON or a schema mismatch gets an error naming the problem
    and giving the schema; arguments dropped as oversized (``ToolCall.dropped``) get an error
    naming the cap. Never raises.
    """
    ids = _rekey(calls, turn=turn, used=used_ids)
    checked: list[CheckedCall | InvalidCall] = []
    for call, call_id in zip(calls, ids, strict=True):
        schema = tools.get(call.name)
        if schema is None:
            available = ", ".join(sorted(tools)) or "(none)"
            checked.append(
                InvalidCall(
                    call_id,
                    call.name,
                    f"unknown tool {call.name!r}; available tools: {available}",
                )
            )
            continue
        if call.dropped is not None:
            checked.append(InvalidCall(call_id, call.name, _dropped_error(call.dropped)))
            continue
        arguments, error = _parse_arguments(call.arguments)
        if arguments is not None:
            error = _schema_errors(schema, arguments)
        if error is not None or arguments is None:
            checked.append(
                InvalidCall(
                    call_id, call.name, f"{error}. The tool's schema: {_schema_hint(schema)}"
                )
            )
            continue
        checked.append(CheckedCall(call_id, call.name, arguments))
    return tuple(checked)


def _dropped_error(size: int) -> str:
    return (
        f"the arguments were {size} bytes, over the {MAX_ARGUMENTS_BYTES}-byte cap per call "
        "(or the cap for all calls of one reply); the call did not run. Pass smaller "
        "arguments, or split the work into several calls"
    )


def stored_arguments(call: CheckedCall | InvalidCall) -> str:
    """The ``arguments`` string stored in history: canonical JSON, ``"{}"`` for invalid calls.

    History must only hold valid JSON (servers reject a history that does not).
    """
    if isinstance(call, CheckedCall):
        return json.dumps(call.arguments, separators=(",", ":"), ensure_ascii=False)
    return "{}"
