"""Validate a final answer against the run's output schema (``spec.output.schema``), on the
linear-time engine within a bounded amount of work (``schemas``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agentrun.kernel import schemas

FENCE = "```"


def parse_answer(content: str) -> Any:
    """The JSON value of an answer, accepting one surrounding Markdown code fence.

    Raises ``ValueError`` (``json.JSONDecodeError``) when it is not JSON.
    """
    body = fenced_body(content)
    return json.loads(content if body is None else body)


def fenced_body(content: str) -> str | None:
    """What one Markdown code fence around ``content`` holds, or ``None`` when there is none;
    in time linear in ``content``. The rule is the regular expression
    ``^\\s*```(?:json)?\\s*\\n(?P<body>.*?)\\n?```\\s*$`` (``re.DOTALL``) matched, decided
    without it: the fence opens after leading whitespace with an optional ``json`` and a run of
    whitespace holding a newline (the body starts after the run's last one), and closes with
    the last non-whitespace characters, less one newline before them. Python's ``re``
    backtracks that pattern quadratically (a fence opened by 24,000 newlines and never closed
    took 4.4 s, holding the GIL: the event loop waits though it runs on a thread)."""
    opened = len(content) - len(content.lstrip())
    if not content.startswith(FENCE, opened):
        return None
    at = opened + len(FENCE)
    if content.startswith("json", at):
        at += len("json")
    run = len(content) - at - len(content[at:].lstrip())
    newline = content.rfind("\n", at, at + run)
    if newline < 0:
        return None
    start, closed = newline + 1, len(content.rstrip()) - len(FENCE)
    if closed < start or not content.startswith(FENCE, closed):
        return None
    if closed > start and content[closed - 1] == "\n":
        closed -= 1
    return content[start:closed]


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
