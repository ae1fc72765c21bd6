"""An AgentRun applied with kubectl runs to its typed terminal reason, one per guard."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun.kernel import wire
from agentrun_dev import components

from .conftest import E2EStack, run_manifest

pytestmark = pytest.mark.e2e


def test_parallel_tool_calls_complete_with_results_in_call_order(
    stack_: E2EStack, test_namespace: str
) -> None:
    goal = f"E2E-PARALLEL-ORDER: sleep and multiply ({test_namespace})"  # many tests run it
    stack_.apply(test_namespace, run_manifest("parallel", goal))
    status = stack_.wait_terminal(test_namespace, "parallel")
    assert (status["phase"], status["terminalReason"], status["outcome"]) == (
        "Succeeded",
        "completed",
        "ok",
    )
    assert status["answer"] == "Slept, and 6*7 is 42."
    assert status["usage"]["toolCalls"] == 2
    assert status["usage"]["steps"] == 2
    assert (status["usage"]["inputTokens"], status["usage"]["outputTokens"]) == (260, 30)
    second = [r for r in stack_.mock_requests() if goal in str(r) and r.get("turn") == 1]
    assert second, "the model never saw turn 1"
    messages = second[-1]["body"]["messages"]
    tool_messages = [m for m in messages if m["role"] == "tool"]
    # the slow call finished last but is answered first: order of the assistant's tool_calls
    assert [m["tool_call_id"] for m in tool_messages] == [
        wire.wire_call_id("call_slow"),  # ids go out in wire form
        wire.wire_call_id("call_fast"),
    ]
    assert tool_messages[1]["content"] == "42"


BUDGETS: list[Any] = [
    pytest.param("E2E-MAX-STEPS", {"maxSteps": 3}, "max_steps", {"steps": 4}, id="maxSteps"),
    pytest.param(
        "E2E-TOOL-BUDGET",
        {"maxToolCalls": 3},
        "tool_budget_exhausted",
        {"toolCalls": 2},
        id="maxToolCalls",
    ),
    pytest.param(
        "E2E-TOKEN-BUDGET", {"maxTokens": 1200}, "token_budget_exhausted", {}, id="maxTokens"
    ),
    pytest.param(
        "E2E-COST-BUDGET", {"maxCostUSD": "0.02"}, "cost_budget_exhausted", {}, id="maxCostUSD"
    ),
]


@pytest.mark.parametrize(("goal", "budget", "reason", "usage"), BUDGETS)
def test_each_per_run_budget_ends_the_run_with_its_own_reason(
    stack_: E2EStack,
    test_namespace: str,
    goal: str,
    budget: dict[str, Any],
    reason: str,
    usage: dict[str, int],
) -> None:
    goal = f"{goal} in {test_namespace}"  # the scripted model's log holds every test's requests
    stack_.apply(test_namespace, run_manifest("capped", goal, budget={"maxSteps": 10, **budget}))
    status = stack_.wait_terminal(test_namespace, "capped")
    assert (status["phase"], status["terminalReason"], status["outcome"]) == (
        "Failed",
        reason,
        "partial",
    )
    for key, value in usage.items():
        assert status["usage"][key] == value
    summary = [
        r for r in stack_.mock_requests() if r["scenario"] == "budget-summary" and goal in str(r)
    ]
    if reason == "tool_budget_exhausted":
        assert "answer" not in status  # not a summarizing cap
    elif reason == "max_steps":  # onExhausted defaults to summarize: one last call, its prose
        assert status["answer"].startswith("SUMMARY after")  # in .status.answer
        # the history holds tool calls: the run's tools go with it, none may be called
        assert len(summary) == 1 and summary[0]["body"]["tool_choice"] == "none"
        assert summary[0]["body"]["tools"]
    else:  # a token or cost cap leaves nothing for a summary: it would spend past the cap
        assert "answer" not in status and not summary
        # the scripted model ignores max_tokens and reports more prompt tokens than were
        # sent: either the gate stops the next call, or a call overruns and ends the run
        # typed, by at most that one call (500 tokens, 0.0075 USD)
        message = status["message"]
        assert "no budget left for a summary" in message or "overrun by" in message, message
    if reason == "token_budget_exhausted":
        assert status["usage"]["totalTokens"] <= 1200 + 500
    if reason == "cost_budget_exhausted":
        assert float(status["usage"]["costUSD"]) <= 0.02 + 0.0075


def test_on_exhausted_stop_ends_at_the_cap_without_a_summary(
    stack_: E2EStack, test_namespace: str
) -> None:
    stack_.apply(
        test_namespace,
        run_manifest(
            "stopper", "E2E-MAX-STEPS stop", budget={"maxSteps": 2, "onExhausted": "stop"}
        ),
    )
    status = stack_.wait_terminal(test_namespace, "stopper")
    assert (status["terminalReason"], status["usage"]["steps"]) == ("max_steps", 2)
    assert "answer" not in status


def test_a_rate_limited_model_call_is_retried_and_the_run_completes(
    stack_: E2EStack, test_namespace: str
) -> None:
    goal = f"E2E-429 say hi {test_namespace}"  # other tests' E2E-429 runs are in the log too
    stack_.apply(test_namespace, run_manifest("ratelimited", goal))
    status = stack_.wait_terminal(test_namespace, "ratelimited")
    assert status["terminalReason"] == "completed"
    assert status["answer"] == "Recovered after a rate limit."
    attempts = [r for r in stack_.mock_requests() if goal in str(r)]
    assert [r["status"] for r in attempts][-2:] == [429, 200]


def test_a_model_that_always_fails_ends_with_model_error(
    stack_: E2EStack, test_namespace: str
) -> None:
    stack_.apply(test_namespace, run_manifest("broken", "E2E-500 anything"))
    status = stack_.wait_terminal(test_namespace, "broken", timeout=90)
    assert (status["phase"], status["terminalReason"]) == ("Failed", "model_error")
    assert "500" in status["message"]
    assert status["usage"]["steps"] == 0


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        pytest.param(
            {"model": "no-such-model"},
            "spec.model: AgentModel 'no-such-model' not found",
            id="unknown model",
        ),
        pytest.param(
            {"tools": ["calculate", "launch_missiles"]},
            "spec.tools: unknown tool(s) launch_missiles",
            id="unknown tool",
        ),
    ],
)
def test_a_run_the_worker_cannot_serve_fails_with_invalid_spec(
    stack_: E2EStack, test_namespace: str, spec: dict[str, Any], fragment: str
) -> None:
    stack_.apply(test_namespace, run_manifest("invalid", "E2E-MAX-STEPS", **spec))
    status = stack_.wait_terminal(test_namespace, "invalid")
    assert (status["phase"], status["terminalReason"], status["outcome"]) == (
        "Failed",
        "invalid_spec",
        "none",  # nothing was done: not to be mistaken for partial work
    )
    assert fragment in status["message"]
    condition = {c["type"]: c for c in status["conditions"]}["Admitted"]
    assert (condition["status"], condition["reason"]) == ("False", "InvalidSpec")


def test_the_operator_enforces_the_timeout_while_the_model_hangs(
    stack_: E2EStack, test_namespace: str
) -> None:
    stack_.apply(test_namespace, run_manifest("hung", "E2E-SLOW-MODEL", budget={"timeout": "3s"}))
    status = stack_.wait_terminal(test_namespace, "hung", timeout=30)
    assert (status["phase"], status["terminalReason"]) == ("Failed", "deadline_exceeded")
    assert 2.5 <= status["usage"]["wallSeconds"] <= 15


def test_kubectl_get_shows_phase_reason_steps_tokens_cost(
    stack_: E2EStack, test_namespace: str
) -> None:
    stack_.apply(test_namespace, run_manifest("columns", "E2E-MAX-STEPS", budget={"maxSteps": 2}))
    stack_.wait_terminal(test_namespace, "columns")
    out = stack_.kubectl("get", "ar", "columns", "-n", test_namespace).stdout.split("\n")
    assert out[0].split() == ["NAME", "PHASE", "REASON", "STEPS", "TOKENS", "COST", "AGE"]
    assert out[1].split()[:5] == ["columns", "Failed", "max_steps", "3", "460"]


def test_a_turn_longer_than_ack_wait_is_kept_alive_and_runs_once(
    stack_: E2EStack, test_namespace: str
) -> None:
    stack_.apply(test_namespace, run_manifest("patient", "E2E-HEARTBEAT wait"))
    status = stack_.wait_terminal(test_namespace, "patient", timeout=40)
    assert status["terminalReason"] == "completed"
    turn0 = [r for r in stack_.mock_requests() if "E2E-HEARTBEAT" in str(r) and r.get("turn") == 0]
    assert len(turn0) == 1, "the 7 s turn was redelivered: in_progress heartbeats did not hold it"


def test_the_timeout_ends_a_run_that_no_worker_picks_up(
    stack_: E2EStack, test_namespace: str
) -> None:
    for worker in stack_.workers:
        components.stop_component(worker)
    stack_.apply(test_namespace, run_manifest("orphan", "E2E-MAX-STEPS", budget={"timeout": "2s"}))
    status = stack_.wait_terminal(test_namespace, "orphan", timeout=30)
    assert (status["phase"], status["terminalReason"]) == ("Failed", "deadline_exceeded")
    assert status["usage"]["steps"] == 0


def test_fifty_fast_turns_cause_far_fewer_than_fifty_status_writes(
    stack_: E2EStack, test_namespace: str
) -> None:
    watch = subprocess.Popen(
        [
            str(stack_.kubectl.binary),
            "get",
            "agentrun",
            "-n",
            test_namespace,
            "--watch",
            "--output-watch-events",
            "-o",
            "jsonpath={.object.metadata.resourceVersion} {.object.status.phase}{'\\n'}",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=stack_.kubectl.env,
    )
    seen: list[str] = []

    def read() -> None:
        assert watch.stdout is not None
        for line in watch.stdout:
            if line.strip():
                seen.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        stack_.apply(
            test_namespace,
            run_manifest("fifty", "E2E-FAST-FIFTY", budget={"maxSteps": 50, "onExhausted": "stop"}),
        )
        status = stack_.wait_terminal(test_namespace, "fifty")
        # the watch delivers the terminal write on its own schedule: wait until it has
        deadline = time.monotonic() + 15
        while not any(line.split()[-1] == "Failed" for line in list(seen)):
            assert time.monotonic() < deadline, f"the watch never showed the end: {seen}"
            time.sleep(0.1)
    finally:
        watch.terminate()
        watch.wait(timeout=10)
        reader.join(timeout=10)
    lines = list(seen)
    assert status["terminalReason"] == "max_steps" and status["usage"]["steps"] == 50
    versions = {line.split()[0] for line in lines}
    assert len(versions) < 25, f"{len(versions)} writes for 50 turns"
    assert lines[-1].split()[-1] == "Failed"


def test_agentrun_cancel_ends_a_running_run_cancelled(
    stack_: E2EStack, test_namespace: str
) -> None:
    stack_.apply(test_namespace, run_manifest("unwanted", "E2E-CANCELLABLE job"))
    stack_.wait_for(
        test_namespace, "unwanted", lambda s: (s.get("usage") or {}).get("steps", 0) >= 1
    )
    cli = subprocess.run(
        [
            str(Path(sys.executable).with_name("agentrun")),
            "cancel",
            "unwanted",
            "-n",
            test_namespace,
        ],
        env={**stack_.kubectl.env},
        capture_output=True,
        text=True,
        check=False,
    )
    assert cli.returncode == 0, cli.stderr
    status = stack_.wait_terminal(test_namespace, "unwanted", timeout=20)
    assert (status["phase"], status["terminalReason"], status["outcome"]) == (
        "Cancelled",
        "cancelled",
        "partial" if status["usage"]["steps"] else "none",
    )
    assert status["usage"]["steps"] < 20


def test_credentials_come_from_the_models_secret_and_tools_read_the_runs_namespace(
    stack_: E2EStack, test_namespace: str
) -> None:
    stack_.kubectl(
        "create",
        "secret",
        "generic",
        "model-key",
        "-n",
        test_namespace,
        "--from-literal=apiKey=sk-e2e-secret",
    )
    model = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentModel",
        "metadata": {"name": f"keyed-{test_namespace}"},
        "spec": {
            "baseURL": stack_.mock_url,
            "model": "scripted",
            "credentials": {"secretRef": {"name": "model-key", "namespace": test_namespace}},
            "pricing": {"free": True},  # the default tenant has a cost budget
        },
    }
    stack_.kubectl("apply", "-f", "-", input=yaml.safe_dump(model))
    stack_.apply(
        test_namespace,
        run_manifest(
            "reader", "E2E-KUBE-GET", model=f"keyed-{test_namespace}", tools=["kubernetes_get"]
        ),
    )
    status = stack_.wait_terminal(test_namespace, "reader")
    assert status["terminalReason"] == "completed", status.get("message")
    calls = [r for r in stack_.mock_requests() if "E2E-KUBE-GET" in str(r["body"])]
    assert {r["api_key"] for r in calls} == {"sk-e2e-secret"}
    result = next(m for m in calls[-1]["body"]["messages"] if m["role"] == "tool")
    assert result["tool_call_id"] == wire.wire_call_id("look")
    assert '"reader"' in result["content"]  # the run sees itself among its namespace's AgentRuns


GUARDS: list[Any] = [
    pytest.param("E2E-STUCK", {}, "no_progress", {"steps": 7, "corrections": 1}, id="no_progress"),
    # the same failing call over and over is the no-progress breaker's, not tool_unavailable
    pytest.param(
        "E2E-BROKEN-TOOL",
        {},
        "no_progress",
        {"steps": 7, "toolFailures": 7},
        id="repeated_failing_call",
    ),
    pytest.param(
        "E2E-NOT-JSON",
        {"output": {"schema": {"type": "object", "required": ["area"]}}},
        "invalid_output",
        {"steps": 2, "corrections": 2},  # a correction counts each turn that needed one
        id="invalid_output",
    ),
    pytest.param("E2E-REFUSE", {}, "refused", {"steps": 1}, id="refused"),
    pytest.param(
        "E2E-MALFORMED", {}, "invalid_decision", {"steps": 3, "toolCalls": 0}, id="invalid_decision"
    ),
]


def test_invalid_tool_calls_go_back_to_the_model_which_corrects_itself(
    stack_: E2EStack, test_namespace: str
) -> None:
    stack_.apply(test_namespace, run_manifest("learner", "E2E-SIX-BAD-CALLS: root of 16"))
    status = stack_.wait_terminal(test_namespace, "learner")
    assert (status["terminalReason"], status["answer"]) == (
        "completed",
        "The square root of 16 is 4.",
    )
    assert (status["usage"]["toolFailures"], status["usage"]["steps"]) == (6, 3)
    second = [
        r for r in stack_.mock_requests() if "E2E-SIX-BAD-CALLS" in str(r) and r.get("turn") == 1
    ]
    assert second, "the model never saw its errors"
    results = {
        m["tool_call_id"]: m["content"]
        for m in second[-1]["body"]["messages"]
        if m["role"] == "tool"
    }
    assert len(results) == 6 and all(c.startswith("ERROR: ") for c in results.values())
    on_wire = wire.wire_call_id  # requests carry ids in their wire form
    assert "division by zero" in results[on_wire("bad_zero")]
    assert "result too large" in results[on_wire("bad_huge")]
    assert "expr" in results[on_wire("bad_args")]  # the schema error names the wrong argument


@pytest.mark.parametrize(("goal", "spec", "reason", "usage"), GUARDS)
def test_each_loop_guard_ends_the_run_with_its_own_reason(
    stack_: E2EStack,
    test_namespace: str,
    goal: str,
    spec: dict[str, Any],
    reason: str,
    usage: dict[str, int],
) -> None:
    stack_.apply(test_namespace, run_manifest("guarded", goal, budget={"maxSteps": 20}, **spec))
    status = stack_.wait_terminal(test_namespace, "guarded")
    assert (status["phase"], status["terminalReason"], status["outcome"]) == (
        "Failed",
        reason,
        "partial",
    )
    for key, value in usage.items():
        assert status["usage"][key] == value, key


def test_cancelling_a_run_cancels_its_model_call_in_flight(
    stack_: E2EStack, test_namespace: str
) -> None:
    stack_.apply(
        test_namespace,
        run_manifest("waiting", "E2E-SLOW-MODEL cancel me", budget={"timeout": "5m"}),
    )
    deadline = time.monotonic() + 20
    while not any("E2E-SLOW-MODEL cancel me" in str(r["body"]) for r in stack_.mock_requests()):
        assert time.monotonic() < deadline, "the model was never called"
        time.sleep(0.1)
    started = time.monotonic()
    stack_.kubectl(
        "annotate", "agentrun", "waiting", "-n", test_namespace, "agentrun.dev/cancel=true"
    )
    status = stack_.wait_terminal(test_namespace, "waiting", timeout=25)
    assert status["terminalReason"] == "cancelled"
    # not the 30 s the model takes to answer (it was called before ``started``); the room
    # above the usual second or two is for a loaded machine
    assert time.monotonic() - started < 20


def test_a_model_without_prices_is_refused_where_a_cost_budget_applies(
    stack_: E2EStack, test_namespace: str
) -> None:
    """Finding 3: an AgentModel without pricing ran with cost 0 against a cost budget. Now
    its runs end invalid_spec naming the field, its Priced condition says why, and
    ``pricing.free: true`` says free on purpose."""
    name = f"unpriced-{test_namespace}"
    model = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentModel",
        "metadata": {"name": name},
        "spec": {"baseURL": stack_.mock_url, "model": "scripted"},
    }
    stack_.kubectl("apply", "-f", "-", input=yaml.safe_dump(model))
    goal = f"E2E-429 unpriced in {test_namespace}"
    stack_.apply(test_namespace, run_manifest("unmetered", goal, model=name))
    status = stack_.wait_terminal(test_namespace, "unmetered")
    assert (status["terminalReason"], status["outcome"]) == ("invalid_spec", "none")
    assert "has no prices" in status["message"] and "costUSD" in status["message"]
    assert not [r for r in stack_.mock_requests() if goal in str(r)]  # never called
    assert priced_condition(stack_, name, "False") == "Unpriced"
    # input priced, output not: a reply of any length would cost nothing
    model["spec"]["pricing"] = {"inputPerMillionUSD": "2.50"}
    stack_.kubectl("apply", "-f", "-", input=yaml.safe_dump(model))
    assert priced_condition(stack_, name, "False", saying="outputPerMillionUSD") == "Unpriced"
    stack_.apply(test_namespace, run_manifest("half", f"{goal} half", model=name))
    status = stack_.wait_terminal(test_namespace, "half")
    assert status["terminalReason"] == "invalid_spec"
    assert "has no pricing.outputPerMillionUSD" in status["message"]
    model["spec"]["pricing"] = {"free": True}
    stack_.kubectl("apply", "-f", "-", input=yaml.safe_dump(model))
    assert priced_condition(stack_, name, "True") == "Free"  # the operator saw it
    stack_.apply(test_namespace, run_manifest("free", f"{goal} free", model=name))
    assert stack_.wait_terminal(test_namespace, "free")["terminalReason"] == "completed"
    stack_.kubectl("delete", "agentmodel", name, "--wait=false")


def priced_condition(stack_: E2EStack, name: str, status: str, *, saying: str = "") -> str:
    """The reason of AgentModel ``name``'s ``Priced`` condition once it has ``status`` and a
    message holding ``saying``."""
    deadline = time.monotonic() + 30
    priced: dict[str, Any] = {}
    while time.monotonic() < deadline:
        got = json.loads(stack_.kubectl("get", "agentmodel", name, "-o", "json").stdout)
        conditions = (got.get("status") or {}).get("conditions") or []
        priced = next((c for c in conditions if c["type"] == "Priced"), {})
        if priced.get("status") == status and saying in str(priced.get("message")):
            return str(priced["reason"])
        time.sleep(0.5)
    raise AssertionError(f"AgentModel {name} never had Priced={status} ({saying}): {priced}")
