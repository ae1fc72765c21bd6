"""Validate a final answer against the run's output schema (``spec.output.schema``)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import jsonschema

_FENCE = re.compile(r"^\s*```(?:json)?\s*\n(?P<body>.*?)\n?```\s*$", re.DOTALL)


def parse_answer(content: str) -> Any:
    """The JSON value of an answer, accepting one surrounding Markdown code fence.

    Raises ``ValueError`` (``json.JSONDecodeError``) when it is not JSON.
    """
    match = _FENCE.match(content)
    return json.loads(match.group("body") if match else content)


def output_error(content: str, schema: Mapping[str, Any]) -> str | None:
    """Why ``content`` does not meet ``schema`` (JSON Schema 2020-12), or ``None`` if it does."""
    try:
        value = parse_answer(content)
    except ValueError as err:
        return f"the answer is not a JSON document ({err})"
    cls = jsonschema.validators.validator_for(schema, jsonschema.Draft202012Validator)
    errors = sorted(cls(schema).iter_errors(value), key=lambda e: list(e.path))
    if not errors:
        return None
    where = "/".join(str(p) for p in errors[0].path) or "(root)"
    return f"{where}: {errors[0].message}"
