"""What ``kubectl agentrun eval`` prints for an AgentEval (no cluster)."""

from __future__ import annotations

from typing import Any

from agentrun.cli import kubectl

FAILED_SUITE: dict[str, Any] = {
    "metadata": {"name": "mixed"},
    "status": {
        "phase": "Failed",
        "round": "fed8ad966d",
        "agent": {"name": "calc", "generation": 2, "digest": "sha256:b5"},
        "summary": {"passed": 1, "failed": 1, "total": 3},
        "cases": [
            {
                "name": "product",
                "run": "mixed-product-5960d40b",
                "phase": "Passed",
                "passed": True,
                "reason": "completed",
                "message": "every expectation met (terminal reason completed)",
                "costUSD": "0.000680",
                "tokens": 218,
                "steps": 2,
            },
            {
                "name": "slow",
                "run": "mixed-slow-c1800cf9",
                "phase": "Failed",
                "passed": False,
                "reason": "completed",
                "message": "terminal reason completed != expected max_steps",
                "costUSD": "0.000525",
                "tokens": 165,
                "steps": 2,
            },
            {"name": "later", "run": "mixed-later-0011aabb", "phase": "Pending"},
        ],
    },
}


def test_a_suite_shows_its_verdict_its_table_and_why_cases_failed() -> None:
    assert kubectl.eval_lines(FAILED_SUITE) == [
        "mixed: Failed, 1 passed, 1 failed of 3",
        "Agent calc generation 2, round fed8ad966d",
        "",
        "CASE      PHASE     RUN                      REASON      STEPS   TOKENS   COST",
        "product   Passed    mixed-product-5960d40b   completed   2       218      $0.0007",
        "slow      Failed    mixed-slow-c1800cf9      completed   2       165      $0.0005",
        "later     Pending   mixed-later-0011aabb     -           -       -        -",
        "",
        "Failed:",
        "  slow: terminal reason completed != expected max_steps",
    ]


def test_an_invalid_or_unstarted_suite_says_so() -> None:
    invalid = {
        "metadata": {"name": "broken"},
        "status": {
            "phase": "Failed",
            "summary": {"passed": 0, "failed": 0, "total": 0},
            "cases": [],
            "conditions": [
                {
                    "type": "Passed",
                    "status": "False",
                    "reason": "InvalidSpec",
                    "message": "spec.x: y",
                }
            ],
        },
    }
    assert kubectl.eval_lines(invalid) == [
        "broken: Failed, 0 passed, 0 failed of 0",
        "invalid: spec.x: y",
    ]
    assert kubectl.eval_lines({"metadata": {"name": "new"}}) == [
        "new: Pending, 0 passed, 0 failed of 0"
    ]


def test_the_eval_command_is_in_the_plugins_help() -> None:
    parser = kubectl.build_parser()
    args = parser.parse_args(["eval", "mixed", "-n", "team-a"])
    assert (args.eval, args.namespace, args.handler) == ("mixed", "team-a", kubectl.cmd_eval)
