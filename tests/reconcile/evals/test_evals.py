"""AgentEval: the spec model (errors naming the field), rounds, run names and manifests, and the
status table (pure)."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest

from agentrun import kernel
from agentrun.operator.evals import grading
from agentrun.operator.evals.spec import EvalSpec
from agentrun.operator.evals.status import (
    AgentSeen,
    CasePhase,
    CaseRow,
    EvalPhase,
    EvalRef,
    Round,
    eval_status,
    graded_row,
    invalid_status,
    previous_rows,
    round_id,
    run_manifest,
    run_name,
    run_result,
    unchanged,
)
from agentrun.operator.platform.spec import SpecError

SUITE = EvalRef("team-a", "geometry-suite", "uid-1", 3)


def spec(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "agentRef": {"name": "geometry"},
        "cases": [
            {
                "name": "area",
                "goal": "Area of {{ params.width }} by 4?",
                "parameters": {"width": "3"},
                "expect": {
                    "outcome": "ok",
                    "maxCostUSD": "0.01",
                    "maxTokens": 2000,
                    "maxSteps": 3,
                    "toolsCalled": ["calculate"],
                    "toolsNotCalled": ["sleep"],
                    "answer": {"pattern": "12"},
                },
            },
            {
                "name": "json",
                "goal": "Answer in JSON.",
                "agentRef": {"name": "geometry-json"},
                "expect": {"answer": {"jsonSchema": {"type": "object"}}},
            },
            {"name": "capped", "goal": "Loop.", "expect": {"reason": "max_steps"}},
        ],
    }
    body.update(fields)
    return body


def test_a_spec_parses_into_cases_with_their_expectations_and_defaults() -> None:
    parsed = EvalSpec.of(spec())
    assert (parsed.agent, parsed.parallelism, parsed.ttl_seconds_after_finished) == (
        "geometry",
        2,
        None,
    )
    area, json_case, capped = parsed.cases
    assert (area.agent, area.parameters) == ("geometry", {"width": "3"})
    assert area.expect == grading.Expectations(
        reason=kernel.TerminalReason.COMPLETED,
        outcome=kernel.Outcome.OK,
        max_cost_usd=Decimal("0.01"),
        max_tokens=2000,
        max_steps=3,
        tools_called=("calculate",),
        tools_not_called=("sleep",),
        answer=grading.PatternAnswer("12"),
    )
    assert json_case.agent == "geometry-json"
    assert json_case.expect.answer == grading.JsonSchemaAnswer({"type": "object"})
    assert capped.expect == grading.Expectations(reason=kernel.TerminalReason.MAX_STEPS)
    assert parsed.agents == frozenset({"geometry", "geometry-json"})


def broken(path: list[Any], value: Any) -> dict[str, Any]:
    body = copy.deepcopy(spec())
    node: Any = body
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return body


INVALID: list[Any] = [
    pytest.param(
        broken(["cases", 2, "expect", "answer"], {"pattern": "(unclosed"}),
        "spec.cases[2].expect.answer.pattern: '(unclosed' is not a regular expression the "
        "linear-time engine accepts (RE2 syntax: no backreferences or lookaround): "
        "missing ): (unclosed",
        id="bad-pattern",
    ),
    pytest.param(
        broken(["cases", 2, "expect", "answer"], {"pattern": "^(\\w+) \\1$"}),
        "spec.cases[2].expect.answer.pattern: '^(\\\\w+) \\\\1$' is not a regular expression "
        "the linear-time engine accepts (RE2 syntax: no backreferences or lookaround): "
        "invalid escape sequence: \\1",
        id="backreference",
    ),
    pytest.param(
        broken(
            ["cases", 1, "expect", "answer"],
            {"jsonSchema": {"properties": {"sku": {"pattern": "^(?!x)"}}}},
        ),
        "spec.cases[1].expect.answer.jsonSchema: not a valid JSON Schema: at "
        "/properties/sku/pattern: '^(?!x)' is not a regular expression the linear-time engine "
        "accepts (RE2 syntax: no backreferences or lookaround): invalid perl operator: (?!",
        id="lookahead-in-json-schema",
    ),
    pytest.param(
        broken(
            ["cases", 1, "expect", "answer"],
            {"jsonSchema": {"description": "x" * 70_000}},
        ),
        "spec.cases[1].expect.answer.jsonSchema: not a valid JSON Schema: 70018 bytes as "
        "JSON, over the 65536-byte limit",
        id="json-schema-too-large",
    ),
    pytest.param(
        broken(["cases", 1, "expect", "answer"], {"jsonSchema": {"type": "objekt"}}),
        "spec.cases[1].expect.answer.jsonSchema: not a valid JSON Schema: at $.type: 'objekt' "
        "is not valid under any of the given schemas",
        id="bad-json-schema",
    ),
    pytest.param(
        broken(["cases", 1, "expect", "answer"], {"pattern": "x", "jsonSchema": {}}),
        "spec.cases[1].expect.answer: set exactly one of jsonSchema and pattern",
        id="both-answer-checks",
    ),
    pytest.param(
        broken(["cases", 0, "expect", "toolsNotCalled"], ["calculate"]),
        "spec.cases[0].expect.toolsNotCalled: calculate also in spec.cases[0].expect.toolsCalled",
        id="tool-both-called-and-not",
    ),
    pytest.param(
        broken(["cases", 0, "expect", "maxCostUSD"], "lots"),
        "spec.cases[0].expect.maxCostUSD: 'lots' is not a decimal number",
        id="bad-cost",
    ),
    pytest.param(
        broken(["cases", 2, "expect", "reason"], "finished"),
        "spec.cases[2].expect.reason: 'finished' is invalid (input should be 'completed', ",
        id="unknown-reason",
    ),
    pytest.param(
        broken(["cases", 2, "name"], "area"),
        "spec.cases[2].name: 'area' names an earlier case too",
        id="duplicate-case",
    ),
    pytest.param(
        broken(["cases", 1, "name"], "Not_A_Label"),
        "spec.cases[1].name: 'Not_A_Label' is invalid (string should match pattern",
        id="case-name-not-a-label",
    ),
    pytest.param(
        broken(["cases"], []),
        "spec.cases: [] is invalid (tuple should have at least 1 item",
        id="no-cases",
    ),
    pytest.param({"cases": spec()["cases"]}, "spec.agentRef: required", id="no-agent"),
    pytest.param(
        spec(parallelism=0), "spec.parallelism: 0 is invalid (input should be", id="parallelism"
    ),
]


@pytest.mark.parametrize(("body", "message"), INVALID)
def test_an_invalid_spec_is_refused_naming_the_field(body: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as raised:
        EvalSpec.of(body)
    assert str(raised.value).startswith(message), str(raised.value)


def test_a_round_changes_with_the_generation_of_the_suite_or_of_an_agent() -> None:
    agents = [AgentSeen("geometry", 2, "sha256:a"), AgentSeen("geometry-json", 1, "sha256:b")]
    first = round_id(3, agents)
    assert round_id(3, list(reversed(agents))) == first
    assert round_id(4, agents) != first
    assert round_id(3, [AgentSeen("geometry", 3, "sha256:c"), agents[1]]) != first
    assert len(first) == 10


def test_run_names_are_deterministic_labels_apart_by_round_case_and_eval_object() -> None:
    name = run_name(SUITE, "area", round_="r1")
    assert name == run_name(SUITE, "area", round_="r1")
    assert name.startswith("geometry-suite-area-") and len(name) == len("geometry-suite-area-") + 8
    assert name != run_name(SUITE, "area", round_="r2")
    assert name != run_name(SUITE, "json", round_="r1")
    other = EvalRef(SUITE.namespace, SUITE.name, "uid-2", 1)
    assert name != run_name(other, "area", round_="r1")
    long = run_name(EvalRef("ns", "e" * 63, "u", 1), "c" * 63, round_="r")
    assert len(long) == 63 and long.count("-") == 1


def test_a_cases_run_runs_its_agent_owned_by_the_eval_and_labelled() -> None:
    parsed = EvalSpec.of(spec())
    manifest = run_manifest(SUITE, parsed.cases[0], round_="r1", ttl=600)
    assert manifest["metadata"]["labels"] == {
        "agentrun.dev/eval": "geometry-suite",
        "agentrun.dev/eval-case": "area",
        "agentrun.dev/eval-round": "r1",
    }
    (owner,) = manifest["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "AgentEval",
        "geometry-suite",
        "uid-1",
        True,
    )
    assert manifest["spec"] == {
        "agentRef": {"name": "geometry", "parameters": {"width": "3"}},
        "goal": "Area of {{ params.width }} by 4?",
        "ttlSecondsAfterFinished": 600,
    }
    bare = run_manifest(SUITE, parsed.cases[1], round_="r1", ttl=None)
    assert bare["spec"] == {"agentRef": {"name": "geometry-json"}, "goal": "Answer in JSON."}


def test_a_finished_runs_status_is_read_for_grading() -> None:
    status = {
        "terminalReason": "completed",
        "outcome": "ok",
        "answer": "12",
        "usage": {"steps": 2, "totalTokens": 525, "costUSD": "1.5E-7"},
    }
    result = run_result(status, tools=frozenset({"calculate"}))
    assert result == grading.RunResult(
        "completed", "ok", Decimal("1.5E-7"), 525, 2, "12", frozenset({"calculate"})
    )
    assert run_result({"terminalReason": "invalid_spec", "outcome": "none"}, tools=frozenset()) == (
        grading.RunResult("invalid_spec", "none")
    )


ROUND = Round("r1", 3, AgentSeen("geometry", 2, "sha256:a"))
PASSED = graded_row(
    "area",
    "run-a",
    run_result({"terminalReason": "completed", "outcome": "ok"}, tools=frozenset()),
    (),
)
FAILED = graded_row(
    "capped",
    "run-c",
    grading.RunResult("completed", "ok", Decimal("0.02"), 900, 4),
    (grading.Failure("reason", "terminal reason completed != expected max_steps"),),
)


def test_a_round_in_progress_is_running_with_its_table_and_unknown_verdict() -> None:
    rows = [
        PASSED,
        CaseRow("json", "run-b", CasePhase.RUNNING),
        CaseRow("capped", "run-c", CasePhase.PENDING),
    ]
    body = eval_status(rows, round_=ROUND, previous={}, now=0.0)
    assert (body["phase"], body["summary"]) == ("Running", {"passed": 1, "failed": 0, "total": 3})
    assert body["cases"][0] == {
        "name": "area",
        "run": "run-a",
        "phase": "Passed",
        "passed": True,
        "reason": "completed",
        "message": "every expectation met (terminal reason completed)",
        "costUSD": "0",
        "tokens": 0,
        "steps": 0,
    }
    assert body["cases"][1] == {"name": "json", "run": "run-b", "phase": "Running"}
    conditions = {c["type"]: c for c in body["conditions"]}
    assert (conditions["Complete"]["status"], conditions["Complete"]["message"]) == (
        "False",
        "1 of 3 cases graded",
    )
    assert conditions["Passed"]["status"] == "Unknown"
    assert body["agent"] == {"name": "geometry", "generation": 2, "digest": "sha256:a"}
    assert (body["round"], body["observedGeneration"], body["completionTime"]) == ("r1", 3, None)


def test_a_round_with_a_failed_case_fails_naming_it_and_keeps_its_times() -> None:
    rows = [PASSED, FAILED]
    running = eval_status(
        [PASSED, CaseRow("capped", "run-c", CasePhase.RUNNING)], round_=ROUND, previous={}, now=0.0
    )
    body = eval_status(rows, round_=ROUND, previous=running, now=60.0)
    assert body["phase"] == EvalPhase.FAILED.value
    assert (body["startTime"], body["completionTime"]) == (
        "1970-01-01T00:00:00Z",
        "1970-01-01T00:01:00Z",
    )
    passed = {c["type"]: c for c in body["conditions"]}["Passed"]
    assert (passed["status"], passed["reason"]) == ("False", "CasesFailed")
    assert passed["message"] == (
        "1 of 2 cases failed: capped (terminal reason completed != expected max_steps)"
    )
    assert body["cases"][1]["passed"] is False and body["cases"][1]["costUSD"] == "0.02"
    # written again later: nothing changes, so nothing is written
    assert unchanged(eval_status(rows, round_=ROUND, previous=body, now=120.0), body)
    # the graded rows are kept for the same round only
    assert previous_rows(body, round_="r1") == {"area": PASSED, "capped": FAILED}
    assert previous_rows(body, round_="r2") == {}


def test_a_round_where_every_case_passed_succeeds() -> None:
    body = eval_status([PASSED], round_=ROUND, previous={}, now=0.0)
    passed = {c["type"]: c for c in body["conditions"]}["Passed"]
    assert (body["phase"], passed["status"], passed["reason"]) == ("Succeeded", "True", "AllPassed")
    # a new round starts over: its own start time, no completion time, Passed back to Unknown
    new = Round("r2", 4, ROUND.agent)
    later = eval_status(
        [CaseRow("area", "run-x", CasePhase.RUNNING)], round_=new, previous=body, now=30.0
    )
    assert (later["startTime"], later["completionTime"]) == ("1970-01-01T00:00:30Z", None)
    flipped = {c["type"]: c for c in later["conditions"]}["Passed"]
    assert (flipped["status"], flipped["lastTransitionTime"]) == ("Unknown", "1970-01-01T00:00:30Z")


def test_an_invalid_spec_fails_the_suite_with_the_message() -> None:
    body = invalid_status("spec.cases[0].goal: required", generation=2, previous={}, now=0.0)
    assert (body["phase"], body["summary"]["total"], body["cases"]) == ("Failed", 0, [])
    conditions = {c["type"]: (c["status"], c["reason"], c["message"]) for c in body["conditions"]}
    assert conditions == {
        "Complete": ("True", "InvalidSpec", "spec.cases[0].goal: required"),
        "Passed": ("False", "InvalidSpec", "spec.cases[0].goal: required"),
    }


def test_a_failed_case_fails_the_suite_at_once_while_the_others_are_still_graded() -> None:
    rows = [FAILED, CaseRow("area", "run-a", CasePhase.RUNNING)]
    body = eval_status(rows, round_=ROUND, previous={}, now=0.0)
    conditions = {c["type"]: c for c in body["conditions"]}
    assert (body["phase"], body["completionTime"]) == ("Failed", None)
    assert (conditions["Complete"]["status"], conditions["Complete"]["message"]) == (
        "False",
        "1 of 2 cases graded",
    )
    assert (conditions["Passed"]["status"], conditions["Passed"]["message"]) == (
        "False",
        "1 of 2 cases failed so far: capped (terminal reason completed != expected max_steps)",
    )
