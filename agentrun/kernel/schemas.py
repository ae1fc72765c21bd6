"""JSON Schemas and regular expressions written by users and tool servers, checked in bounded
time: a linear-time regular-expression engine and a work budget per validation.

What belongs here: the one way a user's or a tool server's schema or pattern is compiled and
applied — ``spec.output.schema`` against an answer (``output``), an MCP tool's ``inputSchema``
against call arguments (``validate``), an AgentEval's ``answer.jsonSchema`` and
``answer.pattern`` (the operator's grading) — and the checks admission makes before any of
them is used (``schema_problem``, ``pattern_problem``). What does not: where the schema comes
from or what a failure ends (the callers).

Why. Python's ``re`` backtracks: ``^(a+)+$`` against 30 characters takes seconds, 40 take
hours, and a JSON Schema ``pattern`` runs inside the process's event loop. Here every pattern
(``pattern``, ``patternProperties``, and the property matching ``additionalProperties`` and
``unevaluatedProperties`` do) runs on RE2 (``google-re2``), whose matching time is linear in
the text; RE2 refuses what needs backtracking (backreferences, lookahead, lookbehind), and
such a pattern is refused at admission, naming the field. ``uniqueItems`` is checked by
hashing a canonical form (jsonschema compares every pair of unhashable items: quadratic).
Remote ``$ref`` URIs are never fetched (an empty registry: jsonschema's default fetches them
with ``urllib``, blocking, from a URI the schema's author chose); one that does not resolve
within the schema is a validation error.

Bounded work. Even linear steps add up (nested ``anyOf`` re-validates an instance once per
branch, per level), so a validation counts its steps — one per keyword applied, plus the
text a pattern scans, the items ``uniqueItems`` hashes and the text of each error's message
(which quotes the instance) — and gives up past ``WORK_LIMIT``
(``WorkExceeded``). The count is deterministic: a turn replayed from the run's events
(``history.fold``) decides exactly as the worker that committed it, on any machine under any
load, which a clock-based deadline could not promise. The steps are weighted by what they
cost (a ``$ref``, an error passed up), so the costliest shapes found — nested ``anyOf`` over
``$ref``, thousands of ``patternProperties`` — give up after about 0.5 s of CPU on a loaded
2-core machine, and an ordinary answer at the 128 KiB cap fits with room to spare. The worker
and the operator run validations of untrusted schemas off their event loops (a thread), so
even that time does not stall other tenants' work.

The dialect is the schema's ``$schema`` (draft 3 to 2020-12), 2020-12 when absent, as
``jsonschema.validators.validator_for`` picks it. ``format`` is an annotation, never asserted
(no format checker is passed), so ``format: regex`` compiles nothing.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import itertools
import json
import math
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import attrs
import jsonschema
import jsonschema.exceptions
import jsonschema.protocols
import jsonschema.validators
import re2
import referencing
import referencing.exceptions

from agentrun.kernel.decision import clean_text

WORK_LIMIT = 200_000
"""Steps one validation may take (``WorkExceeded`` past it): at most about 0.5 s of CPU."""
MAX_SCHEMA_BYTES = 65_536
"""Most bytes of a user's or a tool server's schema as compact JSON (UTF-8): what admission
accepts for ``spec.output.schema``, an eval's ``answer.jsonSchema`` and a tool's
``inputSchema``."""
MAX_SCHEMA_DEPTH = 32
"""Most nesting of objects and arrays in a schema (deeper ones recurse past Python's stack in
the validator)."""
MAX_SCHEMA_CONTAINERS = 10_000
"""Most JSON objects and arrays in a schema, counted everywhere, the data of ``const``,
``enum``, ``default`` and ``examples`` too. A schema's bytes do not bound its memory once
parsed: ``{"const": [{}, {}, ...]}`` is about 24 times larger as Python objects than as
JSON (an empty object is 3 bytes of JSON, about 72 bytes parsed), so 64 KiB hold 21 000
of them. OpenAI's structured outputs accept "up to 5000 object properties total, with up to
10 levels of nesting": each of 5 000 properties is one schema object, and what surrounds them
(an object's ``properties`` map and ``required`` list, ``items``, an ``enum``) takes fewer
objects and arrays again, so 10 000 refuse no schema a model provider takes (64 KiB holds
fewer), while one schema parsed stays under about 2 MB."""
MAX_PATTERN_CHARS = 1_024
"""Longest pattern accepted (RE2 also bounds a pattern's compiled size by ``PATTERN_MEMORY``)."""
PATTERN_MEMORY = 1 << 20
"""Bytes of memory RE2 may use for one compiled pattern (its ``max_mem``): a pattern whose
program is larger (``a{1000}{1000}``) is refused as too large."""
REF_STEPS = 16
"""Steps one ``$ref`` (``$dynamicRef``, ``$recursiveRef``) counts: resolving it and entering the
schema it names."""
ERROR_STEPS = 3
"""Steps one validation error counts at each level it crosses (a ``ValidationError`` and its
path bookkeeping; ``anyOf`` collects every error of every failed branch)."""
TEXT_STEP = 4_096
"""Characters of text a pattern scans per counted step."""
MESSAGE_STEP = 128
"""Characters of a validation error's message counted as one step, once, where the error is
made: jsonschema writes the instance's ``repr`` into most messages as it makes them (a
60,000-item array of 120 KB is 180 KB of text, 3.6 ms), so ``anyOf`` over a ``$ref`` to
another ``anyOf`` made 90,000 such messages before ``WorkExceeded`` (205 s of CPU for a 13 KB
schema); a step is about 2.5 µs, and ``repr`` writes about 50 characters a µs."""
MAX_ERRORS = 100
"""Errors one validation collects before it stops looking (a message shows a few)."""
MESSAGE_CHARS = 300
"""Characters of one validation error's message kept (jsonschema quotes the whole instance);
the middle is cut."""
_DATA_KEYWORDS = frozenset({"const", "default", "enum", "examples"})
"""Keywords whose values are data, not schemas: a ``pattern`` key inside them is not one."""


class PatternRefused(ValueError):
    """A regular expression the linear engine does not take: not valid RE2 syntax, a
    backreference or lookaround (RE2 has neither), over ``MAX_PATTERN_CHARS``, or compiling to
    more than ``PATTERN_MEMORY``."""


class WorkExceeded(Exception):
    """A validation took more than ``WORK_LIMIT`` steps (or nested past the interpreter's
    stack); it is abandoned and counts as failed."""


def _options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # RE2 writes parse errors to stderr otherwise
    options.max_mem = PATTERN_MEMORY
    return options


_OPTIONS = _options()


@functools.lru_cache(maxsize=1024)
def compile_pattern(pattern: str) -> Any:
    """``pattern`` compiled by RE2 (UTF-8, Perl classes; JSON Schema's ECMA 262 dialect as far
    as RE2 shares it: classes, anchors, counted repetition up to 1000, named groups).

    Raises ``PatternRefused`` naming why (RE2's own message: ``invalid perl operator: (?=``,
    ``invalid escape sequence: \\1``, ``pattern too large - compile failed``).
    """
    if len(pattern) > MAX_PATTERN_CHARS:
        raise PatternRefused(f"longer than {MAX_PATTERN_CHARS} characters")
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as err:
        reason = err.args[0] if err.args else err
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise PatternRefused(str(reason)) from None


def pattern_problem(pattern: str) -> str | None:
    """Why the linear engine refuses ``pattern`` (for an admission message), or ``None``."""
    try:
        compile_pattern(pattern)
    except PatternRefused as err:
        return _refusal(pattern, err)
    return None


def _refusal(pattern: str, err: PatternRefused) -> str:
    shown = pattern if len(pattern) <= 80 else pattern[:79] + "…"
    return (
        f"{shown!r} is not a regular expression the linear-time engine accepts (RE2 syntax: "
        f"no backreferences or lookaround): {err}"
    )


def search(pattern: str, text: str) -> bool:
    """Whether ``pattern`` matches somewhere in ``text`` (``re.search``'s rule, as JSON
    Schema's ``pattern`` is applied), in time linear in ``text``; counted against the running
    validation's budget. A lone surrogate in ``text`` (a JSON ``\\ud800`` escape of half a pair,
    which a model's answer may hold) is matched as ``decision.clean_text`` repairs it: RE2 reads
    UTF-8, which cannot encode one. Raises ``PatternRefused``."""
    _spend(1 + len(text) // TEXT_STEP)
    return compile_pattern(pattern).search(clean_text(text)) is not None


# --- the work budget -------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class _Meter:
    """Steps left to the validation running in this context."""

    left: int
    limit: int


_METER: contextvars.ContextVar[_Meter | None] = contextvars.ContextVar("schema_work", default=None)


def _spend(steps: int) -> None:
    meter = _METER.get()
    if meter is None:
        return
    meter.left -= steps
    if meter.left < 0:
        raise WorkExceeded(f"the check took more than {meter.limit} steps")


def errors(
    validator: jsonschema.protocols.Validator, instance: Any, *, limit: int = WORK_LIMIT
) -> tuple[jsonschema.exceptions.ValidationError, ...]:
    """The errors of ``instance`` against ``validator``'s schema, in jsonschema's order, the
    first ``MAX_ERRORS`` of them, each message cut at ``MESSAGE_CHARS``; within ``limit``
    steps. Empty when the instance is valid.

    Raises ``WorkExceeded`` past the limit (or when the instance or schema nests past the
    interpreter's stack).
    """
    token = _METER.set(_Meter(limit, limit))
    try:
        found = tuple(itertools.islice(validator.iter_errors(instance), MAX_ERRORS))
    except RecursionError:
        raise WorkExceeded("the check nested too deeply") from None
    finally:
        _METER.reset(token)
    for error in found:
        _cut(error)
    return found


def _cut(error: jsonschema.exceptions.ValidationError) -> None:
    """Shorten the message to ``MESSAGE_CHARS``, keeping its end (jsonschema puts the quoted
    instance first and the rule broken last: ``'aaa…' does not match '^x$'``)."""
    text = error.message
    if len(text) > MESSAGE_CHARS:
        tail = MESSAGE_CHARS // 3
        error.message = text[: MESSAGE_CHARS - tail - 1] + "…" + text[-tail:]
    for inner in error.context or ():
        _cut(inner)


def validator_for(schema: Mapping[str, Any] | bool) -> jsonschema.protocols.Validator:
    """A validator of ``schema`` on the linear engine, counting its work, with no remote
    ``$ref`` retrieval. ``schema`` should have passed ``schema_problem``."""
    base = jsonschema.validators.validator_for(schema, jsonschema.Draft202012Validator)
    validator: jsonschema.protocols.Validator = _linear(base)(schema, registry=_REGISTRY)
    return validator


_REGISTRY: referencing.Registry[Any] = referencing.Registry()
"""No retrieval: a ``$ref`` resolves within the schema (and the drafts' own meta-schemas)."""


# --- keywords on the linear engine ----------------------------------------------------------

_Keyword = Callable[[Any, Any, Any, Any], Iterator[jsonschema.exceptions.ValidationError]]


def _counted(
    keyword: _Keyword, validator: Any, value: Any, instance: Any, schema: Any
) -> Iterator[jsonschema.exceptions.ValidationError]:
    """``keyword`` applied, counting a step and ``ERROR_STEPS`` per error it passes up, and
    each new error's message (``_charge``) (bound to each keyword with ``functools.partial``,
    so the counting runs at each application)."""
    _spend(1)
    for error in keyword(validator, value, instance, schema):
        _charge(error)
        yield error


def _charge(error: jsonschema.exceptions.ValidationError) -> None:
    """Count ``ERROR_STEPS`` for ``error`` passing up a level, and its message's characters
    (``MESSAGE_STEP``) the first time it passes one: where it was made."""
    steps = ERROR_STEPS
    if not getattr(error, "_charged", False):
        error._charged = True  # type: ignore[attr-defined]
        steps += len(error.message) // MESSAGE_STEP
    _spend(steps)


def _ref_counted(
    keyword: _Keyword, validator: Any, value: Any, instance: Any, schema: Any
) -> Iterator[jsonschema.exceptions.ValidationError]:
    """A reference keyword applied, counted (``REF_STEPS``: resolving one costs several
    keywords' work), with an unresolvable reference as a validation error."""
    _spend(REF_STEPS)
    try:
        for error in keyword(validator, value, instance, schema):
            _charge(error)
            yield error
    except referencing.exceptions.Unresolvable as err:
        yield jsonschema.exceptions.ValidationError(
            f"the schema's reference {value!r} does not resolve within the schema ({err})"
        )


def _pattern(validator: Any, pattern: Any, instance: Any, schema: Any) -> Any:
    if not validator.is_type(instance, "string"):
        return
    try:
        if not search(pattern, instance):
            yield jsonschema.exceptions.ValidationError(f"{instance!r} does not match {pattern!r}")
    except PatternRefused as err:
        yield jsonschema.exceptions.ValidationError(_refusal(pattern, err))


def _pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) -> Any:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            try:
                matched = search(pattern, key)
            except PatternRefused as err:
                yield jsonschema.exceptions.ValidationError(_refusal(pattern, err))
                return
            if matched:
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _matches_any(patterns: Iterable[str], key: str) -> bool:
    try:
        return any(search(pattern, key) for pattern in patterns)
    except PatternRefused:
        return False  # ``patternProperties`` reports the pattern itself


def _additional(instance: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """The properties neither ``properties`` nor ``patternProperties`` covers."""
    named = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    return [k for k in instance if k not in named and not _matches_any(patterns, k)]


def _additional_properties(validator: Any, extra: Any, instance: Any, schema: Any) -> Any:
    if not validator.is_type(instance, "object"):
        return
    extras = _additional(instance, schema)
    if validator.is_type(extra, "object"):
        for key in extras:
            yield from validator.descend(instance[key], extra, path=key)
    elif not extra and extras:
        shown = ", ".join(repr(k) for k in sorted(extras))
        if "patternProperties" in schema:
            patterns = ", ".join(repr(p) for p in sorted(schema["patternProperties"]))
            yield jsonschema.exceptions.ValidationError(
                f"{shown} {'does' if len(extras) == 1 else 'do'} not match any of the regexes: "
                f"{patterns}"
            )
        else:
            verb = "was" if len(extras) == 1 else "were"
            yield jsonschema.exceptions.ValidationError(
                f"Additional properties are not allowed ({shown} {verb} unexpected)"
            )


def _valid(validator: Any, instance: Any, schema: Any) -> bool:
    return next(validator.descend(instance, schema), None) is None


def _resolved(validator: Any, schema: Mapping[str, Any], keyword: str) -> Iterator[Any]:
    ref = schema.get(keyword)
    if not isinstance(ref, str):
        return
    try:
        resolved = validator._resolver.lookup(ref)  # jsonschema's own finder does the same
    except referencing.exceptions.Unresolvable:
        return  # the reference keyword itself reports it
    yield validator.evolve(schema=resolved.contents, _resolver=resolved.resolver)


def _evaluated_keys(validator: Any, instance: Mapping[str, Any], schema: Any) -> set[str]:
    """The properties of ``instance`` some keyword of ``schema`` evaluates (JSON Schema
    2020-12, "unevaluatedProperties"), as jsonschema's finder computes them, patterns on
    RE2. ``$recursiveRef`` (2019-09) is followed like ``$ref``. A boolean schema evaluates
    none (``true`` makes no annotation: ``{"allOf": [true], "unevaluatedProperties": false}``
    leaves every property unevaluated)."""
    _spend(1)
    if not isinstance(schema, Mapping):
        return set()
    keys: set[str] = set()
    for keyword in ("$ref", "$dynamicRef", "$recursiveRef"):
        for inner in _resolved(validator, schema, keyword):
            keys |= _evaluated_keys(inner, instance, inner.schema)
    properties = schema.get("properties")
    if isinstance(properties, Mapping):
        keys |= properties.keys() & instance.keys()
    for keyword in ("additionalProperties", "unevaluatedProperties"):
        if (subschema := schema.get(keyword)) is not None:
            keys |= {k for k, v in instance.items() if _valid(validator, v, subschema)}
    patterns = list(schema.get("patternProperties", {}))
    keys |= {k for k in instance if _matches_any(patterns, k)}
    for subschema in _applied(validator, instance, schema):
        keys |= _evaluated_keys(validator, instance, subschema)
    return keys


def _applied(validator: Any, instance: Mapping[str, Any], schema: Mapping[str, Any]) -> list[Any]:
    """The in-place subschemas of ``schema`` that apply to ``instance``: its
    ``dependentSchemas`` of present properties, the valid branches of ``allOf``, ``oneOf`` and
    ``anyOf``, and ``if`` with ``then`` or ``else``."""
    found = [s for name, s in (schema.get("dependentSchemas") or {}).items() if name in instance]
    for keyword in ("allOf", "oneOf", "anyOf"):
        found += [s for s in schema.get(keyword, ()) if _valid(validator, instance, s)]
    if "if" in schema:
        if _valid(validator, instance, schema["if"]):
            found += [schema["if"], *([schema["then"]] if "then" in schema else [])]
        elif "else" in schema:
            found.append(schema["else"])
    return found


def _unevaluated_properties(validator: Any, extra: Any, instance: Any, schema: Any) -> Any:
    if not validator.is_type(instance, "object"):
        return
    evaluated = _evaluated_keys(validator, instance, schema)
    # the keys valid under ``extra`` are among the evaluated already; each left is checked
    # again all the same, so the steps counted stay those a replayed turn counted
    bad = [
        key
        for key in instance
        if key not in evaluated and not _valid(validator, instance[key], extra)
    ]
    if not bad:
        return
    verb = "was" if len(bad) == 1 else "were"
    shown = ", ".join(repr(k) for k in sorted(bad))
    if extra is False:
        message = f"Unevaluated properties are not allowed ({shown} {verb} unexpected)"
    else:
        message = (
            "Unevaluated properties are not valid under the given schema "
            f"({shown} {verb} unevaluated and invalid)"
        )
    yield jsonschema.exceptions.ValidationError(message)


def _canonical(value: Any) -> str:
    """A text equal for two JSON values exactly when JSON Schema calls them equal: ``1`` and
    ``1.0`` alike, ``true`` and ``1`` not, objects whatever their key order."""
    return json.dumps(_normal(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _normal(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, list | tuple):
        return [_normal(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _normal(v) for k, v in value.items()}
    return value


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Any:
    if not unique or not validator.is_type(instance, "array"):
        return
    seen: set[str] = set()
    for item in instance:
        key = _canonical(item)
        _spend(1 + len(key) // TEXT_STEP)
        if key in seen:
            yield jsonschema.exceptions.ValidationError(f"{instance!r} has non-unique elements")
            return
        seen.add(key)


_LINEAR: dict[str, _Keyword] = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "unevaluatedProperties": _unevaluated_properties,
    "uniqueItems": _unique_items,
}
_REFERENCES = frozenset({"$ref", "$dynamicRef", "$recursiveRef"})


@functools.cache
def _linear(base: type[Any]) -> Any:
    """``base`` (a jsonschema draft's validator class) with the linear keywords, every keyword
    counted, unresolvable references as errors, and every subschema it descends into checked
    the same way.

    jsonschema's ``evolve`` (which ``descend`` and every applicator call) picks the class of a
    subschema that names its dialect (``$schema``) afresh from jsonschema's own registry: a
    ``$ref`` to the root, a ``$recursiveRef``, or an embedded resource with its own ``$schema``
    went on on the draft's plain class, uncounted and backtracking (``^(a+)+$`` behind
    ``{"$ref": "#"}`` took seconds for 24 characters; a 2019-09 ``anyOf`` over
    ``$recursiveRef`` ran minutes without ``WorkExceeded``). Here the dialect it picks is kept,
    on its linear class."""
    keywords: dict[str, _Keyword] = {}
    for name, keyword in base.VALIDATORS.items():
        own = _LINEAR.get(name, keyword)
        keywords[name] = functools.partial(_ref_counted if name in _REFERENCES else _counted, own)
    linear = jsonschema.validators.extend(base, validators=keywords)  # type: ignore[no-untyped-call]
    _PLAIN_EVOLVE[linear] = linear.evolve
    linear.evolve = _evolve
    return linear


_PLAIN_EVOLVE: dict[type[Any], Callable[..., Any]] = {}
"""The classes ``_linear`` made, each with jsonschema's own ``evolve`` of it."""


def _evolve(self: Any, **changes: Any) -> Any:
    """A linear validator's ``evolve``: jsonschema's, then on the linear class of the dialect
    it picked (the same class unless the new schema names another ``$schema``)."""
    evolved = _PLAIN_EVOLVE[type(self)](self, **changes)
    return evolved if type(evolved) in _PLAIN_EVOLVE else _on_linear(evolved)


def _on_linear(plain: Any) -> Any:
    """``plain`` (a validator of a jsonschema draft's own class) as the same validator on that
    draft's linear class: the same schema, resolver, registry and format checker."""
    kind: Any = type(plain)
    fields = attrs.fields(kind)
    return _linear(kind)(**{f.alias: getattr(plain, f.name) for f in fields if f.init})


# --- admission checks -----------------------------------------------------------------------


def schema_problem(schema: Any, *, max_bytes: int = MAX_SCHEMA_BYTES) -> str | None:
    """Why ``schema`` cannot be used as a user's or a tool server's JSON Schema, or ``None``:
    not an object (or boolean), over ``max_bytes`` as compact JSON, nested deeper than
    ``MAX_SCHEMA_DEPTH``, holding more than ``MAX_SCHEMA_CONTAINERS`` objects and arrays, a
    ``pattern`` or ``patternProperties`` key the linear engine refuses (``at
    /properties/code/pattern: …``), or invalid against its draft's meta-schema. The message
    names the place inside the schema; the caller prefixes the field."""
    if not isinstance(schema, Mapping | bool):
        return f"must be a JSON Schema object, not {type(schema).__name__}"
    size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False).encode())
    if size > max_bytes:
        return f"{size} bytes as JSON, over the {max_bytes}-byte limit"
    depth = _depth(schema)
    if depth > MAX_SCHEMA_DEPTH:
        return f"nested {depth} levels deep, over the limit of {MAX_SCHEMA_DEPTH}"
    count = containers(schema)
    if count > MAX_SCHEMA_CONTAINERS:
        return f"{count} JSON objects and arrays, over the limit of {MAX_SCHEMA_CONTAINERS}"
    for where, pattern in _patterns(schema, ""):
        problem = pattern_problem(pattern)
        if problem is not None:
            return f"at {where}: {problem}"
    return _meta_problem(schema)


def known_problem(schema: Any) -> str | None:
    """``schema_problem``, decided once per distinct schema within ``MAX_SCHEMA_BYTES`` (the
    last ``KNOWN_VERDICTS`` remembered, by their canonical JSON): the same schema comes back
    again and again — a queued run's config built at every pass of its queue, an Agent at
    every re-list of the watch, a tool server at every refresh — and its check takes up to a
    second of CPU. Thread-safe (callers run it off the event loop)."""
    if not isinstance(schema, Mapping | bool):
        return schema_problem(schema)
    text = json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    if len(text) > MAX_SCHEMA_BYTES:
        return schema_problem(schema)  # names the size; not worth remembering
    return _verdict(text)


KNOWN_VERDICTS = 256
"""Schemas ``known_problem`` remembers (their text: 16 MiB at most)."""


@functools.lru_cache(maxsize=KNOWN_VERDICTS)
def _verdict(text: str) -> str | None:
    return schema_problem(json.loads(text))


def _depth(value: Any, limit: int = MAX_SCHEMA_DEPTH) -> int:
    """Nesting of objects and arrays, iteratively (a deep value must not exhaust the stack),
    counted to ``limit`` + 1 at most (a deeper value is not walked further)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, Mapping):
            children: Iterable[Any] = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, level)
        if level <= limit:
            stack.extend((child, level + 1) for child in children)
    return deepest


def nesting(value: Any, limit: int) -> int:
    """Nesting of objects and arrays in a JSON value (a scalar: 0), counted to ``limit`` + 1
    at most, without recursion."""
    return _depth(value, limit)


def _nodes(value: Any) -> Iterator[Any]:
    """``value`` and every key and value inside it, iteratively (a deep value must not exhaust
    the stack)."""
    stack = [value]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, Mapping):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def containers(value: Any) -> int:
    """JSON objects and arrays in ``value`` (itself included), data keywords' values too."""
    return sum(1 for node in _nodes(value) if isinstance(node, Mapping | list))


def footprint(value: Any) -> int:
    """Bytes ``value`` takes as parsed JSON in memory, about (``sys.getsizeof`` of it and of
    every key and value inside it; a value shared by two places counted twice): what a cache
    weighs the JSON it keeps by."""
    return sum(sys.getsizeof(node) for node in _nodes(value))


def _patterns(schema: Any, where: str) -> Iterator[tuple[str, str]]:
    """Every ``pattern`` value and ``patternProperties`` key of ``schema``, with its JSON
    Pointer; data (``const``, ``enum``, ``default``, ``examples``) is not searched."""
    if isinstance(schema, list):
        for index, item in enumerate(schema):
            yield from _patterns(item, f"{where}/{index}")
        return
    if not isinstance(schema, Mapping):
        return
    for key, value in schema.items():
        here = f"{where}/{_pointer(str(key))}"
        if key in _DATA_KEYWORDS:
            continue
        if key == "pattern" and isinstance(value, str):
            yield here, value
        elif key == "patternProperties" and isinstance(value, Mapping):
            yield from ((f"{here}/{_pointer(str(p))}", str(p)) for p in value)
        yield from _patterns(value, here)


def _pointer(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _meta_problem(schema: Mapping[str, Any] | bool) -> str | None:
    """Why ``schema`` fails its draft's meta-schema (formats not asserted: its patterns were
    checked on RE2 already), counted like any validation."""
    base = jsonschema.validators.validator_for(schema, jsonschema.Draft202012Validator)
    meta = jsonschema.validators.validator_for(base.META_SCHEMA, default=base)
    checker = _linear(meta)(meta.META_SCHEMA, registry=_REGISTRY)
    try:
        found = errors(checker, schema)
    except WorkExceeded as err:
        return f"checking it against its draft's meta-schema gave up: {err}"
    error = jsonschema.exceptions.best_match(iter(found))
    if error is None:
        return None
    return f"at {error.json_path}: {error.message}"
