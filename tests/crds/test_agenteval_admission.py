"""The API server checks an AgentEval against its CRD schema (OpenAPI and CEL), naming the
field of each rejection; the operator checks the rest (a regex, a JSON Schema)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from crd_support import Apply


def make_agenteval(name: str = "suite", **spec: Any) -> dict[str, Any]:
    manifest: dict[str, Any] = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentEval",
        "metadata": {"name": name},
        "spec": {
            "agentRef": {"name": "geometry"},
            "cases": [
                {
                    "name": "area",
                    "goal": "Area of 3 by 4?",
                    "expect": {"toolsCalled": ["calculate"], "answer": {"pattern": "12"}},
                }
            ],
        },
    }
    manifest["spec"].update(spec)
    return manifest


def with_case(**case: Any) -> dict[str, Any]:
    manifest = make_agenteval()
    manifest["spec"]["cases"][0].update(case)
    return manifest


def with_expect(**expect: Any) -> dict[str, Any]:
    manifest = make_agenteval()
    manifest["spec"]["cases"][0]["expect"] = expect
    return manifest


def two_cases_named_alike() -> dict[str, Any]:
    manifest = make_agenteval()
    manifest["spec"]["cases"].append(copy.deepcopy(manifest["spec"]["cases"][0]))
    return manifest


REJECTED: list[Any] = [
    pytest.param(
        with_expect(answer={"pattern": "12", "jsonSchema": {"type": "object"}}),
        'spec.cases[0].expect.answer: Invalid value: "object": set exactly one of '
        "answer.jsonSchema and answer.pattern",
        id="answer-both",
    ),
    pytest.param(
        with_expect(toolsCalled=["calculate"], toolsNotCalled=["calculate"]),
        "spec.cases[0].expect.toolsNotCalled: Invalid value",
        id="tool-called-and-not",
    ),
    pytest.param(
        with_expect(reason="finished"),
        "spec.cases[0].expect.reason: Unsupported value",
        id="reason",
    ),
    pytest.param(
        with_expect(maxCostUSD="lots"), "spec.cases[0].expect.maxCostUSD: Invalid value", id="cost"
    ),
    pytest.param(with_case(name="Area_1"), "spec.cases[0].name: Invalid value", id="case-name"),
    pytest.param(two_cases_named_alike(), "spec.cases[1]: Duplicate value", id="duplicate-case"),
    pytest.param(make_agenteval(cases=[]), "spec.cases: Invalid value", id="no-cases"),
    pytest.param(
        make_agenteval(parallelism=0), "spec.parallelism: Invalid value", id="parallelism"
    ),
    pytest.param(make_agenteval("Not.A.Label"), "metadata.name: Invalid value", id="name"),
]


@pytest.mark.parametrize(("manifest", "message"), REJECTED)
def test_api_server_rejects_an_invalid_agenteval_naming_the_field(
    apply: Apply, crds: object, test_namespace: str, manifest: dict[str, Any], message: str
) -> None:
    result = apply(manifest, namespace=test_namespace)
    assert result.returncode != 0, f"accepted: {result.stdout}"
    assert message in result.stderr, result.stderr


def test_api_server_accepts_a_suite_with_every_expectation(
    apply: Apply, crds: object, test_namespace: str
) -> None:
    manifest = with_expect(
        reason="max_steps",
        outcome="partial",
        maxCostUSD="0.01",
        maxTokens=2000,
        maxSteps=5,
        toolsCalled=["calculate"],
        toolsNotCalled=["sleep", "tools/search"],
        answer={"jsonSchema": {"type": "object", "required": ["area"]}},
    )
    manifest["spec"].update(parallelism=3, ttlSecondsAfterFinished=600)
    manifest["spec"]["cases"][0].update(agentRef={"name": "other"}, parameters={"width": "3"})
    result = apply(manifest, namespace=test_namespace)
    assert result.returncode == 0, result.stderr
