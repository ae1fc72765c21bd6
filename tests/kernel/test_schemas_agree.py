"""The linear keywords agree with jsonschema's own (agentrun.kernel.schemas): on patterns both
engines accept, ``pattern``, ``patternProperties``, ``additionalProperties``,
``unevaluatedProperties`` (through ``$ref``, ``allOf``/``anyOf``/``oneOf``, ``if``/``then``/
``else`` and ``dependentSchemas``) and ``uniqueItems`` give the same errors, with the same
messages where jsonschema's are deterministic, as the stock validator of the same draft.

The stock validator is the reference the module's docstring promises to match ("as
jsonschema's finder computes them, patterns on RE2"); generated schemas and instances reach the
branches no hand-written example thought of."""

from __future__ import annotations

import re
from typing import Any

import jsonschema
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agentrun.kernel import schemas

PATTERNS = ["^a", "b$", "^[xy]+$", "c", "^$"]
"""Patterns RE2 and Python's re read alike (no class, anchor or escape they differ on)."""
KEYS = ["a", "ab", "b", "xy", "c", "ca", ""]
"""Property names: each matches some of ``PATTERNS`` and not others."""

leaf = st.sampled_from(
    [
        {},
        True,
        False,
        {"type": "integer"},
        {"type": "string"},
        {"minimum": 2},
        {"pattern": "^a"},
        {"$ref": "#/$defs/small"},
    ]
)


def _object_keywords(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {},
        optional={
            "properties": st.dictionaries(st.sampled_from(KEYS), inner, max_size=3),
            "patternProperties": st.dictionaries(st.sampled_from(PATTERNS), inner, max_size=2),
            "additionalProperties": inner,
            "unevaluatedProperties": inner,
            "allOf": st.lists(inner, min_size=1, max_size=2),
            "anyOf": st.lists(inner, min_size=1, max_size=2),
            "oneOf": st.lists(inner, min_size=1, max_size=2),
            "if": inner,
            "then": inner,
            "else": inner,
            "dependentSchemas": st.dictionaries(st.sampled_from(KEYS), inner, max_size=2),
            "uniqueItems": st.booleans(),
            "items": inner,
            "$ref": st.just("#/$defs/open"),
        },
    )


subschemas = st.recursive(leaf, _object_keywords, max_leaves=8)
scalars = st.none() | st.booleans() | st.integers(-1, 3) | st.sampled_from([1.0, "a", "ab", ""])
instances = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=4)
    ),
    max_leaves=10,
)
DEFS = {
    "small": {"maximum": 2, "patternProperties": {"^x": {"type": "string"}}},
    "open": {"properties": {"b": {}}, "additionalProperties": {"type": "integer"}},
}

UNORDERED = {"unevaluatedProperties"}
"""Keywords whose stock message lists the keys in the order errors were found (once per error
of a key), not sorted: their messages are compared as the keys they name."""


def _findings(errors: Any) -> list[tuple[str, tuple[Any, ...], str]]:
    """Each error as (keyword, where in the instance, message), in a fixed order."""
    found = []
    for error in errors:
        message = error.message
        if error.validator in UNORDERED:  # the kind of message, then the keys it names
            kind = message.partition("(")[0]
            message = kind + repr(sorted(set(re.findall(r"'([^']*)'", message))))
        found.append((str(error.validator), tuple(error.absolute_path), message))
    return sorted(found, key=repr)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(subschemas.filter(lambda s: isinstance(s, dict)), instances)
@example({"unevaluatedProperties": {"type": "integer"}}, {"ab": None, "a": None})
@example({"allOf": [True], "unevaluatedProperties": False}, {"a": None})  # true: no annotation
@example(
    {
        "oneOf": [
            {"$ref": "#/$defs/open"},
            {
                "items": {"type": "integer"},
                "patternProperties": {"^a": {}, "b$": {}},
                "properties": {
                    "a": {},
                    "ab": {},
                    "b": {"properties": {"a": {"type": "integer"}}, "$ref": "#/$defs/open"},
                },
                "uniqueItems": False,
                "dependentSchemas": {},
                "$ref": "#/$defs/open",
            },
        ]
    },
    None,
)  # a message over MESSAGE_CHARS
def test_the_linear_keywords_find_what_jsonschemas_own_find(
    schema: dict[str, Any], instance: Any
) -> None:
    schema = {**schema, "$defs": DEFS}
    ours = schemas.errors(schemas.validator_for(schema), instance)  # within the work budget
    # messages cut as ours are: a long oneOf message once failed CI compared whole
    assert _findings(ours) == _findings(_stock_cut(schema, instance))


def test_the_agreement_covers_each_linear_keyword_failing() -> None:
    """The examples the property draws reach every linear keyword's failure (else agreement
    would be about nothing): one hand-picked instance each, checked against the stock
    validator the same way."""
    cases: list[tuple[dict[str, Any], Any]] = [
        ({"pattern": "^a"}, "b"),
        ({"patternProperties": {"^x": {"type": "integer"}}}, {"xy": "s"}),
        ({"properties": {"a": {}}, "additionalProperties": False}, {"a": 1, "b": 2, "c": 3}),
        ({"patternProperties": {"^a": {}}, "additionalProperties": False}, {"ab": 1, "b": 2}),
        ({"additionalProperties": {"type": "string"}}, {"a": 1, "b": "x"}),
        ({"allOf": [{"properties": {"a": {}}}], "unevaluatedProperties": False}, {"a": 1, "b": 2}),
        ({"anyOf": [{"properties": {"a": {"type": "string"}}}, {"properties": {"b": {}}}],
          "unevaluatedProperties": False}, {"a": 1, "b": 2}),
        ({"if": {"properties": {"a": {"const": 1}}}, "then": {"properties": {"b": {}}},
          "else": {"properties": {"c": {}}}, "unevaluatedProperties": {"type": "integer"}},
         {"a": 1, "b": "s", "c": "t"}),
        ({"dependentSchemas": {"a": {"properties": {"b": {}}}}, "unevaluatedProperties": False},
         {"a": 1, "b": 2}),
        ({"$ref": "#/$defs/open", "unevaluatedProperties": False}, {"b": 1, "c": "s"}),
        ({"allOf": [True], "unevaluatedProperties": False}, {"a": 1}),
        ({"uniqueItems": True}, [1, 1.0]),
        ({"uniqueItems": True}, [{"a": 1, "b": 2}, {"b": 2, "a": 1}]),
    ]  # fmt: skip
    for schema, instance in cases:
        schema = {**schema, "$defs": DEFS}
        ours = _findings(schemas.errors(schemas.validator_for(schema), instance))
        assert ours, (schema, instance)
        assert ours == _findings(jsonschema.Draft202012Validator(schema).iter_errors(instance))


def _cut(message: str) -> str:
    """A message as ``schemas.errors`` documents it: over ``MESSAGE_CHARS`` characters, its
    first part, an ellipsis and its last third."""
    limit = schemas.MESSAGE_CHARS
    if len(message) <= limit:
        return message
    return message[: limit - limit // 3 - 1] + "…" + message[-(limit // 3) :]


def _stock_cut(schema: dict[str, Any], instance: Any) -> list[Any]:
    """The stock validator's errors (of the draft ``$schema`` names, 2020-12 when none), first
    ``MAX_ERRORS``, messages cut as ours are."""
    stock = jsonschema.validators.validator_for(schema, jsonschema.Draft202012Validator)
    found = list(stock(schema).iter_errors(instance))
    for error in found[: schemas.MAX_ERRORS]:
        error.message = _cut(error.message)
    return found[: schemas.MAX_ERRORS]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(subschemas.filter(lambda s: isinstance(s, dict)), leaf, instances)
@example({"oneOf": [{}, True]}, False, {"a": {"ab": [1, 2, 3]}, "b": "ab" * 200})
def test_unevaluated_properties_over_any_applicators_find_what_jsonschemas_own_find(
    schema: dict[str, Any], extra: Any, instance: Any
) -> None:
    """``unevaluatedProperties`` at the top of every generated schema, so each applicator
    under it (``$ref``, ``allOf``/``anyOf``/``oneOf``, ``if``/``then``/``else``,
    ``dependentSchemas``, nested ``additionalProperties``) is asked what it evaluated; long
    messages compared as both are cut."""
    schema = {**schema, "unevaluatedProperties": extra, "$defs": DEFS}
    ours = schemas.errors(schemas.validator_for(schema), instance)
    assert _findings(ours) == _findings(_stock_cut(schema, instance))


def test_hand_picked_applicators_evaluate_what_jsonschemas_own_do() -> None:
    """Cases the generator does not draw: ``$dynamicRef`` to a ``$dynamicAnchor``, ``if``
    decided by ``required``, ``oneOf`` with two branches valid (none applies), and
    ``additionalProperties``/``unevaluatedProperties`` nested in a property's schema, and
    subschemas naming their own dialect (``$schema``) behind ``$ref`` and ``$recursiveRef``."""
    cases: list[tuple[dict[str, Any], Any]] = [
        ({"$defs": {"d": {"$dynamicAnchor": "x", "properties": {"a": {}}}},
          "$dynamicRef": "#x", "unevaluatedProperties": False}, {"a": 1, "b": 2}),
        ({"if": {"required": ["a"]}, "then": {"properties": {"b": {}}},
          "else": {"properties": {"c": {}}}, "unevaluatedProperties": False},
         {"a": 1, "b": 2, "c": 3}),
        ({"if": {"required": ["a"]}, "then": {"properties": {"b": {}}},
          "else": {"properties": {"c": {}}}, "unevaluatedProperties": False}, {"b": 2, "c": 3}),
        ({"oneOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}],
          "unevaluatedProperties": False}, {"a": 1, "b": 2}),
        ({"oneOf": [{"properties": {"a": {}}, "required": ["a"]}, {"required": ["b"]}],
          "unevaluatedProperties": False}, {"a": 1, "c": 2}),
        ({"properties": {"a": {"properties": {"x": {}}, "additionalProperties": False}},
          "unevaluatedProperties": False}, {"a": {"x": 1, "y": 2}, "b": 3}),
        ({"properties": {"a": {"allOf": [{"properties": {"x": {}}}],
                               "unevaluatedProperties": {"type": "string"}}}},
         {"a": {"x": 1, "y": 2, "z": "s"}}),
        ({"anyOf": [{"additionalProperties": {"type": "integer"}}, {"properties": {"b": {}}}],
          "unevaluatedProperties": False}, {"a": 1, "b": "s"}),
        # subschemas naming their dialect keep it (on the linear engine): draft-07's
        # `dependencies`, unknown to 2020-12, applies inside an embedded draft-07 resource
        ({"$defs": {"d7": {"$id": "https://example.com/d7",
                           "$schema": "http://json-schema.org/draft-07/schema#",
                           "dependencies": {"a": ["b"]}, "patternProperties": {"^a": {}},
                           "additionalProperties": False}},
          "properties": {"x": {"$ref": "https://example.com/d7"}}}, {"x": {"a": 1, "c": 2}}),
        ({"$schema": "https://json-schema.org/draft/2019-09/schema", "$recursiveAnchor": True,
          "properties": {"x": {"$recursiveRef": "#"}, "p": {"pattern": "^a"}},
          "unevaluatedProperties": False}, {"x": {"p": "b", "q": 1}}),
        ({"$schema": "https://json-schema.org/draft/2020-12/schema",
          "properties": {"x": {"$ref": "#"}}, "uniqueItems": True}, {"x": [1, 1.0]}),
    ]  # fmt: skip
    for schema, instance in cases:
        ours = _findings(schemas.errors(schemas.validator_for(schema), instance))
        assert ours, (schema, instance)
        assert ours == _findings(_stock_cut(schema, instance)), (schema, instance)
