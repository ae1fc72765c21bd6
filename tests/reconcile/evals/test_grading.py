"""Grading a finished run against a case's expectations (pure): every expectation kind, met
and missed, with the message a person reads in ``status.cases``."""

from __future__ import annotations

import dataclasses
import json
import time
from decimal import Decimal
from typing import Any

import pytest

from agentrun import kernel
from agentrun.kernel import decision as dec
from agentrun.operator.evals import grading
from agentrun.protocol import RunEvent

OK = grading.RunResult(
    reason="completed",
    outcome="ok",
    cost_usd=Decimal("0.0123"),
    tokens=525,
    steps=2,
    answer='{"area": 12, "perimeter": 14}',
    tools_called=frozenset({"calculate"}),
)
"""A run that answered in two steps after one calculation."""

AREA_SCHEMA = {
    "type": "object",
    "required": ["area", "perimeter"],
    "properties": {"area": {"type": "number"}, "perimeter": {"type": "number"}},
}


def expect(**fields: Any) -> grading.Expectations:
    return grading.Expectations(**fields)


MET: list[Any] = [
    pytest.param(expect(), id="reason-default-completed"),
    pytest.param(expect(outcome=kernel.Outcome.OK), id="outcome"),
    pytest.param(expect(max_cost_usd=Decimal("0.0123")), id="max-cost-inclusive"),
    pytest.param(expect(max_tokens=525), id="max-tokens-inclusive"),
    pytest.param(expect(max_steps=2), id="max-steps-inclusive"),
    pytest.param(expect(tools_called=("calculate",)), id="tools-called"),
    pytest.param(expect(tools_not_called=("sleep", "http_get")), id="tools-not-called"),
    pytest.param(expect(answer=grading.JsonSchemaAnswer(AREA_SCHEMA)), id="answer-json-schema"),
    pytest.param(expect(answer=grading.PatternAnswer(r'"area": 12\b')), id="answer-pattern"),
]


@pytest.mark.parametrize("expectations", MET)
def test_a_run_that_meets_an_expectation_passes(expectations: grading.Expectations) -> None:
    assert grading.grade(expectations, OK) == ()


MISSED: list[Any] = [
    pytest.param(
        expect(reason=kernel.TerminalReason.MAX_STEPS),
        "reason",
        "terminal reason completed != expected max_steps",
        id="reason",
    ),
    pytest.param(
        expect(outcome=kernel.Outcome.PARTIAL),
        "outcome",
        "outcome ok != expected partial",
        id="outcome",
    ),
    pytest.param(
        expect(max_cost_usd=Decimal("0.01")),
        "maxCostUSD",
        "cost 0.0123 USD > maxCostUSD 0.01",
        id="max-cost",
    ),
    pytest.param(expect(max_tokens=500), "maxTokens", "tokens 525 > maxTokens 500", id="tokens"),
    pytest.param(expect(max_steps=1), "maxSteps", "steps 2 > maxSteps 1", id="steps"),
    pytest.param(
        expect(tools_called=("calculate", "sleep", "http_get")),
        "toolsCalled",
        "tool(s) sleep, http_get not called (called: calculate)",
        id="tools-called",
    ),
    pytest.param(
        expect(tools_not_called=("calculate",)),
        "toolsNotCalled",
        "tool(s) calculate called (in toolsNotCalled)",
        id="tools-not-called",
    ),
    pytest.param(
        expect(answer=grading.JsonSchemaAnswer({**AREA_SCHEMA, "required": ["volume"]})),
        "answer.jsonSchema",
        "answer does not match answer.jsonSchema: at $: 'volume' is a required property",
        id="answer-json-schema",
    ),
    pytest.param(
        expect(answer=grading.PatternAnswer(r"^\d+$")),
        "answer.pattern",
        """answer '{"area": 12, "perimeter": 14}' does not match /^\\d+$/""",
        id="answer-pattern",
    ),
]


@pytest.mark.parametrize(("expectations", "field", "message"), MISSED)
def test_a_run_that_misses_an_expectation_fails_with_a_readable_message(
    expectations: grading.Expectations, field: str, message: str
) -> None:
    assert grading.grade(expectations, OK) == (grading.Failure(field, message),)


def test_every_missed_expectation_is_reported_in_field_order() -> None:
    capped = dataclasses.replace(
        OK, reason="max_steps", outcome="partial", steps=5, answer=None, tools_called=frozenset()
    )
    failures = grading.grade(
        expect(
            outcome=kernel.Outcome.OK,
            max_steps=3,
            tools_called=("calculate",),
            answer=grading.PatternAnswer("42"),
        ),
        capped,
    )
    assert [f.expectation for f in failures] == [
        "reason",
        "outcome",
        "maxSteps",
        "toolsCalled",
        "answer.pattern",
    ]
    assert failures[-1].message == "no answer to match /42/"
    assert failures[3].message == "tool(s) calculate not called (called: none)"


def test_an_answer_that_is_not_json_fails_a_json_schema_and_is_quoted_short() -> None:
    prose = dataclasses.replace(OK, answer="The area is 12. " * 20)
    (failure,) = grading.grade(expect(answer=grading.JsonSchemaAnswer(AREA_SCHEMA)), prose)
    assert failure.expectation == "answer.jsonSchema"
    assert failure.message.startswith("answer 'The area is 12. The area is 12.")
    assert "…' is not JSON: Expecting value: line 1 column 1" in failure.message
    missing = dataclasses.replace(OK, answer=None)
    assert grading.grade(expect(answer=grading.JsonSchemaAnswer(AREA_SCHEMA)), missing) == (
        grading.Failure("answer.jsonSchema", "no answer to validate against answer.jsonSchema"),
    )


def test_a_cost_is_printed_in_plain_notation() -> None:
    tiny = dataclasses.replace(OK, cost_usd=Decimal("1.5E-7"))
    (failure,) = grading.grade(expect(max_cost_usd=Decimal("0")), tiny)
    assert failure.message == "cost 0.00000015 USD > maxCostUSD 0"


def test_check_schema_names_what_is_wrong_with_a_schema() -> None:
    assert grading.check_schema(AREA_SCHEMA) is None
    assert grading.check_schema({"type": "objekt"}) is not None
    assert "is not valid under any of the given schemas" in str(
        grading.check_schema({"type": "objekt"})
    )


def turn(record: kernel.TurnRecord) -> RunEvent:
    return RunEvent("turn", "uid", kernel.RunSummary(kernel.Phase.RUNNING), record=record)


def test_tools_called_are_the_valid_calls_of_committed_turns() -> None:
    calls = dec.ToolCalls((), None)
    events = [
        RunEvent("admitted", "uid", kernel.RunSummary(kernel.Phase.RUNNING)),
        turn(
            kernel.Answered(
                0,
                calls,
                calls=(
                    kernel.CheckedCall("c1", "calculate", {"expression": "3*4"}),
                    kernel.InvalidCall("c2", "teleport", "unknown tool"),
                ),
            )
        ),
        turn(
            kernel.Answered(
                1,
                calls,
                calls=(kernel.CheckedCall("c3", "sleep", {"seconds": 1}),),
                held=("c3",),
            )
        ),
        turn(kernel.Answered(2, dec.Final("12"))),
    ]
    assert grading.tools_called(events) == frozenset({"calculate", "sleep"})
    assert grading.tools_called([]) == frozenset()


HOSTILE = "^(a+)+$"
HOSTILE_ANSWER = "a" * 50_000 + "!"


def test_a_catastrophic_pattern_grades_a_hostile_answer_at_once() -> None:
    answer = dataclasses.replace(OK, answer=HOSTILE_ANSWER)
    started = time.process_time()
    (failure,) = grading.grade(expect(answer=grading.PatternAnswer(HOSTILE)), answer)
    schema = {"type": "object", "properties": {"v": {"pattern": HOSTILE}}}
    as_json = dataclasses.replace(OK, answer=json.dumps({"v": HOSTILE_ANSWER}))
    (schema_failure,) = grading.grade(expect(answer=grading.JsonSchemaAnswer(schema)), as_json)
    assert time.process_time() - started < 1.0
    assert failure.message.startswith("answer 'aaaa") and "does not match /^(a+)+$/" in (
        failure.message
    )
    assert schema_failure.message.startswith("answer does not match answer.jsonSchema: at $.v")


def test_an_answer_past_the_work_budget_fails_its_schema_saying_so() -> None:
    branch = {"type": "array", "items": {"$ref": "#/$defs/n"}}
    schema = {"$defs": {"n": {"anyOf": [branch, branch, {"type": "integer"}]}}, "$ref": "#/$defs/n"}
    document: Any = 1
    for _ in range(25):
        document = [document, "x"]
    run = dataclasses.replace(OK, answer=json.dumps(document))
    (failure,) = grading.grade(expect(answer=grading.JsonSchemaAnswer(schema)), run)
    assert failure.message == (
        "answer does not match answer.jsonSchema: the answer could not be checked: the check "
        "took more than 200000 steps"
    )


def test_a_deeply_nested_answer_is_not_json_not_a_crash() -> None:
    run = dataclasses.replace(OK, answer="[" * 100_000 + "]" * 100_000)
    (failure,) = grading.grade(expect(answer=grading.JsonSchemaAnswer({"type": "array"})), run)
    assert failure.message.endswith("is not JSON: nested too deeply")


ANSWER_LIMIT = 131_072
"""The CRD's maxLength of an AgentRun's ``status.answer``: the most a model's answer can be."""
ROW_LIMIT = 32_768
"""The CRD's maxLength of an AgentEval's ``status.cases[].message``."""


NESTED = {"type": "object", "additionalProperties": {"$ref": "#"}}
"""Objects all the way down: a string anywhere fails it, as deep as it is."""


@pytest.mark.parametrize(
    ("answer", "schema", "ending"),
    [
        pytest.param(
            json.dumps({"k" * (ANSWER_LIMIT - 20): "s"}),
            {"type": "object", "additionalProperties": {"type": "integer"}},
            "'integer'",
            id="one-long-key",
        ),
        pytest.param(
            json.dumps({"k" * 60: {"n" * 60: {"m" * 60: "s"}}}), NESTED, "'object'", id="deep-path"
        ),
    ],
)
def test_the_place_a_hostile_answer_fails_its_schema_is_named_shortened(
    answer: str, schema: dict[str, Any], ending: str
) -> None:
    """The keys are the model's: a path quoted whole made a row longer than the status takes
    (the API server refused the write, and the suite was given up instead of graded)."""
    run = dataclasses.replace(OK, answer=answer)
    (failure,) = grading.grade(expect(answer=grading.JsonSchemaAnswer(schema)), run)
    where = failure.message.split(": ")[1]
    assert where.startswith("at $.kkk") and len(where) == 3 + grading.PATH_SHOWN
    assert "…" in where and failure.message.endswith("' is not of type " + ending)


def test_a_graded_rows_message_fits_the_status_whatever_the_failures() -> None:
    from agentrun.operator.evals import status

    many = [grading.Failure("toolsCalled", f"tool(s) {'t' * 125} not called")] * 300
    row = status.graded_row("case", "suite-case-1234abcd", OK, many)
    assert ROW_LIMIT >= status.ROW_MESSAGE_CHARS >= len(row.message)
    assert row.message.startswith("tool(s) ttt") and "…" in row.message
    assert status.CaseRow.from_dict(row.as_dict()) == row  # read back, it is the same row


@pytest.mark.parametrize(
    ("check", "answer"),
    [
        pytest.param(
            grading.JsonSchemaAnswer({"type": "string", "pattern": "^12$"}),
            '"\\ud83d"',
            id="pattern",
        ),
        pytest.param(
            grading.JsonSchemaAnswer({"propertyNames": {"pattern": "^area$"}}),
            '{"\\ud83d": 12}',
            id="property-names",
        ),
    ],
)
def test_half_a_surrogate_pair_in_a_hostile_answer_fails_its_case_not_the_suite(
    check: grading.AnswerCheck, answer: str
) -> None:
    """The answer is ASCII and valid JSON; parsed, it held a string RE2 cannot read, and
    grading raised UnicodeEncodeError twice: the suite was given up (ReconcileFailed, its runs
    deleted) instead of this case failing."""
    run = dataclasses.replace(OK, answer=answer)
    (failure,) = grading.grade(expect(answer=check), run)
    assert failure.expectation == "answer.jsonSchema" and "does not match" in failure.message
