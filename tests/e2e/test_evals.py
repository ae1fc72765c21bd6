"""AgentEval: suites of graded runs, driven with kubectl against the real API server, NATS, the
operator, the workers and the scripted model. A passing and a failing suite are graded case by
case; an operator restart mid-round creates no second run; an edit of the Agent or of the suite
starts a new round; the Argo CD health of live suites.

``AGENTRUN_WRITE_ARGOCD_TESTDATA=1`` rewrites the AgentEval samples of docs/argocd from the
live objects (the statuses are asserted either way)."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from agentrun.operator.evals.store import AGENTS_BY_GET
from agentrun_dev import components, stack
from agentrun_dev.kubectl import create_namespace, delete_namespace

from . import argocd_health, test_kubectl_plugin
from .conftest import EXAMPLES, E2EStack, apply_tenant, http_get, run_manifest
from .test_agents import AGENT_TURNS, agent_manifest
from .test_budget_use import collatz_scenario
from .test_telemetry import metric
from .test_tenants import append_scenario

pytestmark = pytest.mark.e2e

SLOW_TURNS = [
    {
        "content": "Resting first.",
        "tool_calls": [{"name": "sleep", "arguments": {"seconds": 3}}],
        "usage": {"prompt_tokens": 60, "completion_tokens": 9},
    },
    {"content": "Done after a nap.", "usage": {"prompt_tokens": 90, "completion_tokens": 6}},
]


@pytest.fixture(scope="module", autouse=True)
def scripted(e2e: E2EStack) -> None:
    """The scenarios these suites' goals match (scenario names are unique: added once)."""
    append_scenario(e2e, {**collatz_scenario(), "name": "eval-collatz"})
    append_scenario(
        e2e,
        {"name": "eval-product", "match": {"goal": "E2E-EVAL-PRODUCT"}, "turns": AGENT_TURNS},
    )
    append_scenario(
        e2e, {"name": "eval-slow", "match": {"goal": "E2E-EVAL-SLOW"}, "turns": SLOW_TURNS}
    )


def suite(name: str, cases: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentEval",
        "metadata": {"name": name},
        "spec": {"agentRef": {"name": "calc"}, "cases": cases, **spec},
    }


def case(name: str, goal: str, **expect: Any) -> dict[str, Any]:
    return {"name": name, "goal": goal, "parameters": {"team": "qa"}, "expect": expect}


PRODUCT = case(
    "product",
    "E2E-EVAL-PRODUCT 6 times {{ params.factor }} for {{ params.team }}",
    outcome="ok",
    maxSteps=2,
    toolsCalled=["calculate"],
    toolsNotCalled=["sleep"],
    answer={"pattern": r"\b42\b"},
)
"""Passes: two steps, one calculation, "The product is 42."."""
DEAR = case(
    "dear",
    "E2E-EVAL-PRODUCT again for {{ params.team }}",
    maxCostUSD="0.000001",
    maxTokens=100,
    toolsNotCalled=["calculate"],
    answer={"jsonSchema": {"type": "object"}},
)
"""Fails four expectations of the same run."""
SLOW = case("slow", "E2E-EVAL-SLOW for {{ params.team }}", reason="max_steps")
"""Takes three seconds (a sleep), completes, and so fails: max_steps was expected."""


def get_eval(stack_: E2EStack, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(
        stack_.kubectl("get", "agenteval", name, "-n", namespace, "-o", "json").stdout
    )
    return found


def wait_eval(
    stack_: E2EStack,
    namespace: str,
    name: str,
    predicate: Callable[[dict[str, Any]], bool],
    *,
    timeout: float = 90,
    each: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Poll the AgentEval until ``predicate(status)``; ``each`` runs at every poll."""
    end = time.monotonic() + timeout
    status: dict[str, Any] = {}
    while time.monotonic() < end:
        status = get_eval(stack_, namespace, name).get("status") or {}
        if predicate(status):
            return status
        if each is not None:
            each()
        time.sleep(0.25)
    raise AssertionError(f"{namespace}/{name}: {json.dumps(status, indent=1)}")


def finished(status: dict[str, Any]) -> bool:
    """Every case graded (a suite is Failed as soon as one case failed)."""
    return conditions(status).get("Complete", {}).get("status") == "True"


def eval_runs(stack_: E2EStack, namespace: str, name: str) -> list[dict[str, Any]]:
    listed = stack_.kubectl(
        "get", "agentruns", "-n", namespace, "-l", f"agentrun.dev/eval={name}", "-o", "json"
    ).stdout
    items: list[dict[str, Any]] = json.loads(listed)["items"]
    return items


def eval_events(stack_: E2EStack, namespace: str, name: str) -> list[tuple[str, str, str]]:
    listed = stack_.kubectl(
        "get",
        "events",
        "-n",
        namespace,
        "--field-selector",
        f"involvedObject.kind=AgentEval,involvedObject.name={name}",
        "-o",
        "json",
    ).stdout
    return [(e["type"], e["reason"], e["message"]) for e in json.loads(listed)["items"]]


def wait_events(
    stack_: E2EStack, namespace: str, name: str, reasons: set[str]
) -> list[tuple[str, str, str]]:
    end = time.monotonic() + 20
    while True:
        events = eval_events(stack_, namespace, name)
        if reasons <= {reason for _, reason, _ in events} or time.monotonic() > end:
            return events
        time.sleep(0.25)


def rows(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in status["cases"]}


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status.get("conditions") or []}


def test_the_example_suite_passes_with_the_demo_model(
    stack_: E2EStack, test_namespace: str
) -> None:
    documents = list(yaml.safe_load_all((EXAMPLES / "agents" / "geometry.yaml").read_text()))
    stack_.apply(test_namespace, next(d for d in documents if d["kind"] == "Agent"))
    stack_.kubectl(
        "apply", "-n", test_namespace, "-f", str(EXAMPLES / "agents" / "geometry-eval.yaml")
    )
    status = wait_eval(stack_, test_namespace, "geometry-suite", finished)
    assert status["phase"] == "Succeeded", json.dumps(status, indent=1)
    assert status["summary"] == {"passed": 2, "failed": 0, "total": 2}
    table = rows(status)
    assert (table["rectangle"]["reason"], table["rectangle"]["steps"]) == ("completed", 2)
    assert table["runaway"]["reason"] == "max_steps"
    assert all(row["passed"] for row in table.values())
    passed = conditions(status)["Passed"]
    assert (passed["status"], passed["reason"], passed["message"]) == (
        "True",
        "AllPassed",
        "2 of 2 cases passed",
    )
    assert status["agent"]["name"] == "geometry" and status["agent"]["generation"] == 1
    printed = stack_.kubectl("get", "agenteval", "-n", test_namespace).stdout.splitlines()
    assert printed[0].split() == ["NAME", "AGENT", "PASSED", "FAILED", "TOTAL", "PHASE", "AGE"]
    assert printed[1].split()[:6] == ["geometry-suite", "geometry", "2", "0", "2", "Succeeded"]
    # each case's run: a run of the Agent, owned by the suite, labelled with eval, case, round
    runs = {
        r["metadata"]["labels"]["agentrun.dev/eval-case"]: r
        for r in eval_runs(stack_, test_namespace, "geometry-suite")
    }
    assert sorted(runs) == ["rectangle", "runaway"]
    rectangle = runs["rectangle"]
    assert rectangle["metadata"]["name"] == table["rectangle"]["run"]
    assert rectangle["metadata"]["labels"]["agentrun.dev/eval-round"] == status["round"]
    assert rectangle["metadata"]["ownerReferences"][0]["kind"] == "AgentEval"
    assert rectangle["spec"]["agentRef"] == {
        "name": "geometry",
        "parameters": {"width": "3", "height": "4"},
    }
    assert rectangle["status"]["tenant"]  # admitted in the namespace's tenant like any run
    events = wait_events(
        stack_, test_namespace, "geometry-suite", {"EvaluationStarted", "EvaluationPassed"}
    )
    assert ("Normal", "EvaluationPassed", f"round {status['round']}: 2 of 2 cases passed") in (
        events
    )


def test_a_failing_suite_is_graded_case_by_case_at_most_parallelism_at_a_time(
    stack_: E2EStack, test_namespace: str
) -> None:
    ns = test_namespace
    stack_.apply(ns, agent_manifest("calc"))
    stack_.apply(ns, suite("mixed", [PRODUCT, DEAR, SLOW], parallelism=1))
    most_unfinished = 0

    def count_unfinished() -> None:
        nonlocal most_unfinished
        unfinished = [
            r
            for r in eval_runs(stack_, ns, "mixed")
            if not (r.get("status") or {}).get("terminalReason")
        ]
        most_unfinished = max(most_unfinished, len(unfinished))

    first = wait_eval(stack_, ns, "mixed", lambda s: bool(s.get("cases")))
    assert [row["phase"] for row in first["cases"]].count("Running") <= 1
    status = wait_eval(stack_, ns, "mixed", finished, each=count_unfinished)
    assert most_unfinished == 1
    assert status["phase"] == "Failed"
    assert status["summary"] == {"passed": 1, "failed": 2, "total": 3}
    table = rows(status)
    assert table["product"]["passed"] is True
    assert table["product"]["message"] == "every expectation met (terminal reason completed)"
    dear = table["dear"]
    assert (dear["passed"], dear["reason"], dear["tokens"], dear["steps"]) == (
        False,
        "completed",
        218,
        2,
    )
    assert dear["message"] == (
        f"cost {dear['costUSD'].rstrip('0')} USD > maxCostUSD 0.000001; "
        "tokens 218 > maxTokens 100; tool(s) calculate called (in toolsNotCalled); "
        "answer 'The product is 42.' is not JSON: Expecting value: line 1 column 1 (char 0)"
    )
    assert table["slow"]["message"] == "terminal reason completed != expected max_steps"
    passed = conditions(status)["Passed"]
    assert (passed["status"], passed["reason"]) == ("False", "CasesFailed")
    assert passed["message"].startswith("2 of 3 cases failed: dear (cost ")
    assert passed["message"].endswith("; slow (terminal reason completed != expected max_steps)")
    assert conditions(status)["Complete"]["status"] == "True"
    events = wait_events(stack_, ns, "mixed", {"CaseFailed", "EvaluationFailed"})
    failed_cases = [m for _, reason, m in events if reason == "CaseFailed"]
    assert len(failed_cases) == 2 and any(m.startswith("case slow (run ") for m in failed_cases)
    assert ("Warning", "EvaluationFailed", f"round {status['round']}: {passed['message']}") in (
        events
    )
    shown = test_kubectl_plugin.plugin(stack_, "eval", "mixed", "-n", ns)
    assert shown.returncode == 1, shown.stderr  # a failed suite, as for a CI gate
    assert shown.stdout.startswith("mixed: Failed, 1 passed, 2 failed of 3\n")
    assert "  slow: terminal reason completed != expected max_steps" in shown.stdout
    metrics = http_get(f"http://127.0.0.1:{stack_.operator.ports['metrics']}/metrics")
    labels = f'eval="mixed",namespace="{ns}"'
    assert metric(metrics, "agentrun_eval_cases_total") >= 3
    assert f'agentrun_eval_cases_total{{{labels},result="failed"}} 2.0' in metrics
    assert f'agentrun_eval_cases_total{{{labels},result="passed"}} 1.0' in metrics
    assert f"agentrun_eval_pass_ratio{{{labels}}} 0.3333333333333333" in metrics


def test_a_tenant_ttl_of_zero_deletes_a_suites_runs_once_graded_not_before(
    stack_: E2EStack, test_namespace: str
) -> None:
    """A platform team's ``ttlSecondsAfterFinished: 0`` on the tenant (or the suite's own)
    deleted each case's run as it ended, before grading read its events: every case failed
    "deleted before it was graded", whatever the Agent did."""
    ns = test_namespace
    budget = {"tokens": 1_000_000}
    apply_tenant(stack_, f"ttl0-{ns}", ns, budget=budget, ttlSecondsAfterFinished=0)
    try:
        stack_.wait_tenant_observed(f"ttl0-{ns}")
        stack_.apply(ns, agent_manifest("calc"))
        stack_.apply(ns, suite("kept", [PRODUCT, {**SLOW, "expect": {"reason": "completed"}}]))
        status = wait_eval(stack_, ns, "kept", finished)
        assert status["summary"] == {"passed": 2, "failed": 0, "total": 2}, status["cases"]
        end = time.monotonic() + 20  # graded: their TTL deletes them now
        while eval_runs(stack_, ns, "kept"):
            assert time.monotonic() < end, "a graded run outlived its TTL of 0"
            time.sleep(0.25)
    finally:
        stack_.kubectl("delete", "agenttenant", f"ttl0-{ns}", "--wait=false")


def test_an_operator_restart_mid_round_creates_no_second_run(
    stack_: E2EStack, test_namespace: str
) -> None:
    ns = test_namespace
    stack_.apply(ns, agent_manifest("calc"))
    slow = [dict(SLOW, name=f"slow-{i}", expect={}) for i in range(3)]
    stack_.apply(ns, suite("restart", slow, parallelism=2))
    before = wait_eval(
        stack_,
        ns,
        "restart",
        lambda s: [r["phase"] for r in s.get("cases") or []].count("Running") == 2,
    )
    # read after the status: a case that ended meanwhile (3 s each) may have let the third
    # one start, so parallelism is checked on the runs still going, not on how many exist
    listed = eval_runs(stack_, ns, "restart")
    created = sorted(r["metadata"]["name"] for r in listed)
    going = [r for r in listed if not (r.get("status") or {}).get("terminalReason")]
    assert len(created) >= 2 and len(going) <= 2, created
    components.kill_component(stack_.operator)
    time.sleep(1.5)
    stack_.operator = stack.start_operator(stack_.env, launch=stack_.launch)
    status = wait_eval(stack_, ns, "restart", finished, timeout=120)
    assert status["phase"] == "Succeeded" and status["summary"]["total"] == 3
    assert status["round"] == before["round"]
    runs = eval_runs(stack_, ns, "restart")
    names = sorted(r["metadata"]["name"] for r in runs)
    assert len(names) == 3 and set(created) <= set(names)
    assert sorted(row["run"] for row in status["cases"]) == names
    uids = {r["metadata"]["name"]: r["metadata"]["uid"] for r in runs}
    assert len(set(uids.values())) == 3
    started = [e for e in eval_events(stack_, ns, "restart") if e[1] == "EvaluationStarted"]
    assert len(started) == 1


def test_an_agent_edit_starts_a_new_round_and_deletes_the_old_runs(
    stack_: E2EStack, test_namespace: str
) -> None:
    ns = test_namespace
    stack_.apply(ns, agent_manifest("calc"))
    stack_.apply(ns, suite("gate", [PRODUCT]))
    first = wait_eval(stack_, ns, "gate", finished)
    assert first["phase"] == "Succeeded" and first["agent"]["generation"] == 1
    old_run = first["cases"][0]["run"]
    stack_.apply(ns, agent_manifest("calc", instructions="Edited for {{ params.team }}."))
    second = wait_eval(
        stack_, ns, "gate", lambda s: s.get("round") != first["round"] and finished(s)
    )
    assert second["phase"] == "Succeeded"
    assert (
        second["agent"]["generation"] == 2 and second["agent"]["digest"] != first["agent"]["digest"]
    )
    assert second["observedGeneration"] == 1  # the suite itself did not change
    new_run = second["cases"][0]["run"]
    assert new_run != old_run
    assert stack_.get(ns, old_run) is None
    run = stack_.get(ns, new_run)
    assert run is not None and run["status"]["agent"]["generation"] == 2
    assert run["status"]["resolvedSpec"]["instructions"] == "Edited for qa."
    events = wait_events(stack_, ns, "gate", {"EvaluationStarted"})
    started = [m for _, reason, m in events if reason == "EvaluationStarted"]
    assert any("generation 2" in m for m in started), events


def test_a_suite_of_many_agents_reads_them_listed_and_follows_an_edit_of_any(
    stack_: E2EStack, test_namespace: str
) -> None:
    """More Agents than ``AGENTS_BY_GET``: the operator reads them in one list of the namespace
    (paged, on the real API server), each case runs its own, and an edit of one that is not
    the suite's ``agentRef`` starts a new round too."""
    ns = test_namespace
    count = AGENTS_BY_GET + 1
    for i in range(count):
        stack_.apply(ns, agent_manifest(f"calc-{i}"))
    cases = [
        {**PRODUCT, "name": f"product-{i}", "agentRef": {"name": f"calc-{i}"}} for i in range(count)
    ]
    stack_.apply(ns, suite("many", cases, agentRef={"name": "calc-0"}, parallelism=count))
    first = wait_eval(stack_, ns, "many", finished, timeout=180)
    assert first["phase"] == "Succeeded", first
    assert first["agent"]["name"] == "calc-0" and first["agent"]["generation"] == 1
    last = f"calc-{count - 1}"
    stack_.apply(ns, agent_manifest(last, instructions="Edited for {{ params.team }}."))
    second = wait_eval(
        stack_, ns, "many", lambda s: s.get("round") != first["round"] and finished(s), timeout=180
    )
    assert second["phase"] == "Succeeded", second
    assert second["agent"] == first["agent"]  # the suite's own Agent did not change
    run = stack_.get(ns, rows(second)[f"product-{count - 1}"]["run"])
    assert run is not None and run["status"]["agent"]["generation"] == 2


def test_a_spec_the_operator_cannot_run_fails_naming_the_field(
    stack_: E2EStack, test_namespace: str
) -> None:
    bad = copy.deepcopy(PRODUCT)
    bad["expect"]["answer"] = {"pattern": "(unclosed"}
    stack_.apply(test_namespace, suite("broken", [PRODUCT, bad | {"name": "bad"}]))
    status = wait_eval(stack_, test_namespace, "broken", finished)
    passed = conditions(status)["Passed"]
    assert (status["phase"], passed["reason"]) == ("Failed", "InvalidSpec")
    assert passed["message"] == (
        "spec.cases[1].expect.answer.pattern: '(unclosed' is not a regular expression the "
        "linear-time engine accepts (RE2 syntax: no backreferences or lookaround): "
        "missing ): (unclosed"
    )
    assert eval_runs(stack_, test_namespace, "broken") == []


def test_live_suites_get_the_expected_argo_health(stack_: E2EStack, test_namespace: str) -> None:
    ns = test_namespace
    samples = argocd_health.Samples(ns)

    def sample(case: str, obj: dict[str, Any], status: str) -> dict[str, str]:
        return samples.check("AgentEval", case, obj, status)

    def live(name: str) -> dict[str, Any]:
        return argocd_health.clean(get_eval(stack_, ns, name))

    stack_.apply(ns, agent_manifest("calc"))
    stack_.apply(ns, suite("gate", [PRODUCT, SLOW]))
    wait_eval(
        stack_,
        ns,
        "gate",
        lambda s: rows(s).get("product", {}).get("phase") == "Passed" if s.get("cases") else False,
    )
    obj = live("gate")  # the slow case sleeps for 3 s
    found = sample("running", obj, "Progressing")
    assert found["message"] == "Evaluating: 1 of 2 cases graded"
    fresh = copy.deepcopy(obj)
    del fresh["status"]
    sample("not-started", fresh, "Progressing")
    wait_eval(stack_, ns, "gate", finished)
    found = sample("case-failed", live("gate"), "Degraded")
    assert found["message"] == (
        "1 of 2 cases failed: slow (terminal reason completed != expected max_steps)"
    )
    # the suite fixed (a new generation): a new round, which passes
    stack_.apply(ns, suite("gate", [PRODUCT]))
    wait_eval(stack_, ns, "gate", lambda s: s.get("observedGeneration") == 2 and finished(s))
    found = sample("passed", live("gate"), "Healthy")
    assert found["message"] == "1 of 1 cases passed"
    broken = copy.deepcopy(PRODUCT)
    broken["expect"]["answer"] = {"jsonSchema": {"type": "objekt"}}
    stack_.apply(ns, suite("broken", [broken]))
    wait_eval(stack_, ns, "broken", finished)
    found = sample("invalid-spec", live("broken"), "Degraded")
    assert found["message"].startswith("spec.cases[0].expect.answer.jsonSchema: not a valid")
    samples.write()


HOSTILE_PATTERN = "^(a+)+$"
HOSTILE_ANSWER = "a" * 100 + "!"
"""On Python's backtracking ``re`` the pattern takes about 22 s against 30 characters and hours
against 40: the leader's event loop would stop there."""


def test_a_catastrophic_pattern_grading_a_hostile_answer_holds_up_no_other_run(
    stack_: E2EStack, test_namespace: str
) -> None:
    """An AgentEval's ``answer.pattern`` ``^(a+)+$`` grades an answer of 101 characters
    while another namespace's run is created: the suite fails that case at once, and the
    other run is admitted and finishes as fast as on an idle operator."""
    append_scenario(
        stack_,
        {
            "name": "eval-hostile",
            "match": {"goal": "E2E-EVAL-HOSTILE"},
            "turns": [  # slow enough for a poll to see the case Running on a busy machine
                {
                    "content": HOSTILE_ANSWER,
                    "usage": {"prompt_tokens": 9, "completion_tokens": 9},
                    "latency_ms": 3000,
                }
            ],
        },
    )
    append_scenario(
        stack_,
        {
            "name": "eval-neighbour",
            "match": {"goal": "E2E-EVAL-NEIGHBOUR"},
            "turns": [{"content": "Hello.", "usage": {"prompt_tokens": 5, "completion_tokens": 2}}],
        },
    )
    ns = test_namespace
    other = create_namespace(stack_.kubectl)
    try:
        stack_.apply(ns, agent_manifest("calc"))
        hostile = case("hostile", "E2E-EVAL-HOSTILE for {{ params.team }}")
        hostile["expect"]["answer"] = {"pattern": HOSTILE_PATTERN}
        stack_.apply(ns, suite("redos", [hostile]))
        wait_eval(
            stack_,
            ns,
            "redos",
            lambda s: any(r.get("phase") == "Running" for r in s.get("cases") or []),
        )
        started = time.monotonic()
        stack_.apply(other, run_manifest("neighbour", "E2E-EVAL-NEIGHBOUR say hello"))
        neighbour = stack_.wait_terminal(other, "neighbour", timeout=30)
        took = time.monotonic() - started
        assert (neighbour["terminalReason"], neighbour["answer"]) == ("completed", "Hello.")
        status = wait_eval(stack_, ns, "redos", finished, timeout=60)
        assert time.monotonic() - started < 30, f"graded after {time.monotonic() - started:.1f}s"
        row = rows(status)["hostile"]
        assert (status["phase"], row["passed"], row["reason"]) == ("Failed", False, "completed")
        assert row["message"].startswith("answer 'aaaa")
        assert f"does not match /{HOSTILE_PATTERN}/" in row["message"]
        assert took < 15, f"the other namespace's run took {took:.1f}s"
    finally:
        delete_namespace(stack_.kubectl, other)
