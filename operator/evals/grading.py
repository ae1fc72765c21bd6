"""Grading a finished run against an evaluation case's expectations.

What belongs here: the expectations an ``AgentEval`` case can state (``Expectations``), what a
finished run did as far as grading looks (``RunResult``: its terminal reason, outcome, usage,
answer and the tools it called), the tools a run called read from its committed events
(``tools_called``) and the one grading rule (``grade``), which returns every expectation the
run missed with a readable message ("cost 0.0123 USD > maxCostUSD 0.01"). Pure: no I/O; the
answer's pattern and JSON Schema are checked on the linear-time engine within a work budget
(``agentrun.kernel.schemas``: the answer is the model's, the pattern the suite author's). What
does not: parsing the CRD (``spec``), creating runs or writing status (``controller``, which
grades off its event loop).

A tool counts as called when the model made a valid call to it in a committed turn (whether it
then ran, was held for approval or was stopped by a budget); a call rejected before running
(an unknown tool, invalid arguments) does not count.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any, assert_never

import jsonschema.exceptions

from agentrun import kernel
from agentrun.kernel import schemas
from agentrun.protocol import RunEvent

ANSWER_SHOWN = 80
"""Characters of an answer quoted in a failure message before ``…``."""
PATH_SHOWN = 120
"""Characters of the place in the answer a schema failure names (``$.key…``) at most: its keys
are the model's, each as long as the answer allows."""


@dataclasses.dataclass(frozen=True, slots=True)
class JsonSchemaAnswer:
    """The answer must be a JSON document valid against ``schema``."""

    schema: Mapping[str, Any]
    """A JSON Schema (its ``$schema`` picks the draft; 2020-12 when absent)."""


@dataclasses.dataclass(frozen=True, slots=True)
class PatternAnswer:
    """The answer must contain a match of ``pattern`` (RE2 syntax, searched as ``re.search``
    does: anchor it with ``^…$`` to match the whole answer)."""

    pattern: str


AnswerCheck = JsonSchemaAnswer | PatternAnswer


@dataclasses.dataclass(frozen=True, slots=True)
class Expectations:
    """What a case expects of its run. ``None`` / empty: not checked."""

    reason: kernel.TerminalReason = kernel.TerminalReason.COMPLETED
    """The run's terminal reason."""
    outcome: kernel.Outcome | None = None
    """The run's outcome (``ok``, ``partial``, ``none``)."""
    max_cost_usd: Decimal | None = None
    """Most spend, US dollars (inclusive)."""
    max_tokens: int | None = None
    """Most input plus output tokens (inclusive)."""
    max_steps: int | None = None
    """Most model calls (inclusive)."""
    tools_called: tuple[str, ...] = ()
    """Tools the model must have called, each at least once."""
    tools_not_called: tuple[str, ...] = ()
    """Tools the model must not have called."""
    answer: AnswerCheck | None = None
    """A check of ``status.answer``."""


@dataclasses.dataclass(frozen=True, slots=True)
class RunResult:
    """What a finished run did, as grading sees it (from its ``.status`` and its events)."""

    reason: str
    """``status.terminalReason``."""
    outcome: str
    """``status.outcome``."""
    cost_usd: Decimal = Decimal(0)
    """``status.usage.costUSD``."""
    tokens: int = 0
    """``status.usage.totalTokens``."""
    steps: int = 0
    """``status.usage.steps``."""
    answer: str | None = None
    """``status.answer``; ``None`` when unset."""
    tools_called: frozenset[str] = frozenset()
    """Tools the model validly called (``tools_called``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Failure:
    """One expectation a run missed."""

    expectation: str
    """The expectation's field name under ``expect``, e.g. ``maxCostUSD``, ``answer.pattern``."""
    message: str
    """What the run did against what was expected, e.g. ``cost 0.0123 USD > maxCostUSD 0.01``."""


def tools_called(events: Iterable[RunEvent]) -> frozenset[str]:
    """The names of the tools the model made valid calls to, over a run's committed events."""
    names: set[str] = set()
    for event in events:
        names.update(called_in(event))
    return frozenset(names)


def called_in(event: RunEvent) -> frozenset[str]:
    """The names of the tools the model validly called in ``event`` (a committed turn's), so
    a reader folds a run's events one at a time."""
    record = event.record
    if not isinstance(record, kernel.Answered):
        return frozenset()
    return frozenset(c.name for c in record.calls if isinstance(c, kernel.CheckedCall))


def grade(expect: Expectations, run: RunResult) -> tuple[Failure, ...]:
    """Every expectation of ``expect`` that ``run`` missed, in the order of the fields of
    ``Expectations``; empty when the run passes."""
    failures: list[Failure] = []
    if run.reason != expect.reason:
        failures.append(
            Failure("reason", f"terminal reason {run.reason or 'none'} != expected {expect.reason}")
        )
    if expect.outcome is not None and run.outcome != expect.outcome:
        failures.append(
            Failure("outcome", f"outcome {run.outcome or 'none'} != expected {expect.outcome}")
        )
    failures += _limits(expect, run)
    failures += _tools(expect, run)
    if expect.answer is not None:
        failures += _answer(expect.answer, run.answer)
    return tuple(failures)


def _limits(expect: Expectations, run: RunResult) -> list[Failure]:
    failures: list[Failure] = []
    if expect.max_cost_usd is not None and run.cost_usd > expect.max_cost_usd:
        failures.append(
            Failure(
                "maxCostUSD",
                f"cost {_decimal(run.cost_usd)} USD > maxCostUSD {_decimal(expect.max_cost_usd)}",
            )
        )
    if expect.max_tokens is not None and run.tokens > expect.max_tokens:
        failures.append(
            Failure("maxTokens", f"tokens {run.tokens} > maxTokens {expect.max_tokens}")
        )
    if expect.max_steps is not None and run.steps > expect.max_steps:
        failures.append(Failure("maxSteps", f"steps {run.steps} > maxSteps {expect.max_steps}"))
    return failures


def _tools(expect: Expectations, run: RunResult) -> list[Failure]:
    failures: list[Failure] = []
    missing = [tool for tool in expect.tools_called if tool not in run.tools_called]
    if missing:
        called = ", ".join(sorted(run.tools_called)) or "none"
        failures.append(
            Failure("toolsCalled", f"tool(s) {', '.join(missing)} not called (called: {called})")
        )
    forbidden = [tool for tool in expect.tools_not_called if tool in run.tools_called]
    if forbidden:
        failures.append(
            Failure("toolsNotCalled", f"tool(s) {', '.join(forbidden)} called (in toolsNotCalled)")
        )
    return failures


def _answer(check: AnswerCheck, answer: str | None) -> list[Failure]:
    match check:
        case JsonSchemaAnswer(schema):
            where = "answer.jsonSchema"
            if answer is None:
                return [Failure(where, "no answer to validate against answer.jsonSchema")]
            try:
                document = json.loads(answer)
            except ValueError as err:
                return [Failure(where, f"answer {_quote(answer)} is not JSON: {err}")]
            except RecursionError:
                return [Failure(where, f"answer {_quote(answer)} is not JSON: nested too deeply")]
            error = schema_error(schema, document)
            if error is not None:
                return [Failure(where, f"answer does not match answer.jsonSchema: {error}")]
            return []
        case PatternAnswer(pattern):
            where = "answer.pattern"
            if answer is None:
                return [Failure(where, f"no answer to match /{pattern}/")]
            try:
                matched = schemas.search(pattern, answer)
            except schemas.PatternRefused as err:
                return [Failure(where, f"/{pattern}/ cannot be used: {err}")]
            if not matched:
                return [Failure(where, f"answer {_quote(answer)} does not match /{pattern}/")]
            return []
        case _:
            assert_never(check)


def schema_error(schema: Mapping[str, Any], document: Any) -> str | None:
    """The most relevant reason ``document`` fails ``schema`` (``at $.path: message``), or
    ``None`` when it is valid; a check past the work budget is a reason too. ``schema`` must
    have passed ``check_schema``."""
    try:
        found = schemas.errors(schemas.validator_for(schema), document)
    except schemas.WorkExceeded as err:
        return f"the answer could not be checked: {err}"
    error = jsonschema.exceptions.best_match(iter(found))
    if error is None:
        return None
    return f"at {shorten(error.json_path, PATH_SHOWN)}: {error.message}"


def shorten(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters (``limit`` > 1), else its start and its
    last third joined by ``…``, ``limit`` characters in all."""
    if len(text) <= limit:
        return text
    tail = limit // 3
    return text[: limit - tail - 1] + "…" + text[-tail:]


def check_schema(schema: Mapping[str, Any]) -> str | None:
    """Why ``schema`` cannot grade answers (``schemas.schema_problem``: invalid for its draft,
    a pattern RE2 refuses, too large or too deep), or ``None`` when it can."""
    return schemas.known_problem(schema)


def _decimal(amount: Decimal) -> str:
    """``amount`` in plain notation, without trailing zeros (``0.0123``, never ``1.23E-2``)."""
    text = format(amount, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _quote(answer: str) -> str:
    flat = " ".join(answer.split())
    return repr(flat if len(flat) <= ANSWER_SHOWN else flat[: ANSWER_SHOWN - 1] + "…")
