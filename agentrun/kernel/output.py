"""Validate a final answer against the run's output schema (``spec.output.schema``), on the
linear-time engine within a bounded amount of work (``schemas``)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from agentrun.kernel import schemas

_FENCE = re.compile(r"^\s*```(?:json)?\s*\n(?P<body>.*?)\n?```\s*$", re.DOTALL)


def parse_answer(content: str) -> Any:
    """The JSON value of an answer, accepting one surrounding Markdown code fence.

    Raises ``ValueError`` (``json.JSONDecodeError``) when it is not JSON.
    """
    match = _FENCE.match(content)
    return json.loads(match.group("body") if match else content)


def output_error(content: str, schema: Mapping[str, Any]) -> str | None:
    """Why ``content`` does not meet ``schema`` (JSON Schema, 2020-12 unless its ``$schema``
    says otherwise), or ``None`` if it does. A check that takes more than
    ``schemas.WORK_LIMIT`` steps counts as failed (its message says so); deterministic, so a
    replay of the run decides the same."""
    try:
        value = parse_answer(content)
    except ValueError as err:
        return f"the answer is not a JSON document ({err})"
    except RecursionError:
        return "the answer is not a JSON document (nested too deeply)"
    try:
        found = schemas.errors(schemas.validator_for(schema), value)
    except schemas.WorkExceeded as err:
        return f"the answer could not be checked against the schema: {err}"
    errors = sorted(found, key=lambda e: list(e.path))
    if not errors:
        return None
    where = "/".join(str(p) for p in errors[0].path) or "(root)"
    return f"{where}: {errors[0].message}"
