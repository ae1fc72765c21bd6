"""Agents: AgentRuns with spec.agentRef run the Agent as it was when the run was created."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from . import test_tenants
from .conftest import E2EStack
from .test_tenants import TenantFactory, append_scenario, model_calls

pytestmark = pytest.mark.e2e

tenants = test_tenants.tenants
"""The AgentTenant fixture: ``tenants(name, namespaces, **spec)``."""

AGENT_TURNS = [
    {
        "content": "Multiplying.",
        "tool_calls": [{"name": "calculate", "arguments": {"expression": "6*7"}}],
        "usage": {"prompt_tokens": 80, "completion_tokens": 10},
    },
    {"content": "The product is 42.", "usage": {"prompt_tokens": 120, "completion_tokens": 8}},
]


def agent_manifest(name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "mock",
        "instructions": "You are the {{ params.team }} team's calculator. Be {{params.tone}}.",
        "tools": ["calculate", "sleep"],
        "budget": {"maxSteps": 6, "onExhausted": "stop"},
        "parameters": [
            {"name": "team", "description": "who asks", "required": True},
            {"name": "tone", "default": "brief"},
            {"name": "factor", "default": "7"},
        ],
    }
    body.update(spec)
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": name},
        "spec": body,
    }


def agent_run(name: str, goal: str, agent: str, **ref: Any) -> dict[str, Any]:
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {"goal": goal, "agentRef": {"name": agent, **ref}},
    }


def system_prompts(stack_: E2EStack, goal: str) -> set[str]:
    return {
        m["content"]
        for r in model_calls(stack_, goal)
        for m in r["body"]["messages"]
        if m["role"] == "system"
    }


def get_agent(stack_: E2EStack, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(
        stack_.kubectl("get", "agent", name, "-n", namespace, "-o", "json").stdout
    )
    return found


def test_a_run_of_an_agent_gets_its_definition_with_parameters_and_records_where_from(
    stack_: E2EStack, test_namespace: str
) -> None:
    goal = "E2E-AGENT-BASIC: multiply 6 by {{ params.factor }} for {{ params.team }}"
    append_scenario(
        stack_, {"name": "agent-basic", "match": {"goal": "E2E-AGENT-BASIC"}, "turns": AGENT_TURNS}
    )
    stack_.apply(test_namespace, agent_manifest("calc"))
    stack_.apply(test_namespace, agent_run("calc-1", goal, "calc", parameters={"team": "billing"}))
    status = stack_.wait_terminal(test_namespace, "calc-1")
    assert (status["terminalReason"], status["answer"]) == ("completed", "The product is 42.")
    resolved = status["resolvedSpec"]
    assert resolved["goal"] == "E2E-AGENT-BASIC: multiply 6 by 7 for billing"
    assert resolved["model"] == "mock" and resolved["tools"] == ["calculate", "sleep"]
    assert resolved["budget"]["maxSteps"] == 6 and resolved["budget"]["onExhausted"] == "stop"
    assert status["agent"]["name"] == "calc" and status["agent"]["generation"] == 1
    assert status["agent"]["digest"].startswith("sha256:") and len(status["agent"]["digest"]) == 71
    assert system_prompts(stack_, "E2E-AGENT-BASIC") == {
        "You are the billing team's calculator. Be brief."
    }
    first_user = model_calls(stack_, "E2E-AGENT-BASIC")[0]["body"]["messages"][1]
    assert first_user["content"] == "E2E-AGENT-BASIC: multiply 6 by 7 for billing"
    # the Agent's Ready condition: its AgentModel and tools exist
    agent = get_agent(stack_, test_namespace, "calc")
    ready = {c["type"]: c for c in agent["status"]["conditions"]}["Ready"]
    assert (ready["status"], agent["status"]["observedGeneration"]) == ("True", 1)


def test_a_run_budget_cap_overrides_the_agents_and_tenant_policy_applies_after_resolution(
    stack_: E2EStack, test_namespace: str, tenants: TenantFactory
) -> None:
    tenants(f"agents-{test_namespace[-8:]}", [test_namespace], allowedTools=["calculate"])
    stack_.apply(test_namespace, agent_manifest("calc", budget={"maxSteps": 6}))
    stack_.apply(
        test_namespace, agent_run("too-many-tools", "E2E-AGENT-X", "calc", parameters={"team": "a"})
    )
    status = stack_.wait_terminal(test_namespace, "too-many-tools")
    assert status["terminalReason"] == "invalid_spec"
    assert "sleep" in status["message"] and "spec.tools" in status["message"]

    stack_.apply(test_namespace, agent_manifest("narrow", tools=["calculate"]))
    append_scenario(
        stack_,
        {
            "name": "agent-capped",
            "match": {"goal": "E2E-AGENT-CAPPED"},
            "turns": [AGENT_TURNS[0]],
            "after": "repeat_last",
        },
    )
    run = agent_run("capped", "E2E-AGENT-CAPPED", "narrow", parameters={"team": "a"})
    run["spec"]["budget"] = {"maxSteps": 2}
    stack_.apply(test_namespace, run)
    status = stack_.wait_terminal(test_namespace, "capped")
    assert (status["terminalReason"], status["usage"]["steps"]) == ("max_steps", 2)
    budget = status["resolvedSpec"]["budget"]
    assert (budget["maxSteps"], budget["onExhausted"]) == (2, "stop")


INVALID_REFS: list[Any] = [
    pytest.param("missing", {}, "spec.agentRef.name: Agent 'missing' not found", id="no-agent"),
    pytest.param(
        "calc",
        {"parameters": {"team": "a", "colour": "red"}},
        "spec.agentRef.parameters.colour: Agent 'calc' declares no parameter 'colour'",
        id="unknown-parameter",
    ),
    pytest.param(
        "calc",
        {"parameters": {"tone": "dry"}},
        "spec.agentRef.parameters.team: required by Agent 'calc' and not given (who asks)",
        id="missing-required",
    ),
]


@pytest.mark.parametrize(("agent", "ref", "message"), INVALID_REFS)
def test_an_unresolvable_agent_ref_ends_the_run_invalid_spec_naming_the_field(
    stack_: E2EStack, test_namespace: str, agent: str, ref: dict[str, Any], message: str
) -> None:
    stack_.apply(test_namespace, agent_manifest("calc"))
    stack_.apply(test_namespace, agent_run("bad", "E2E-AGENT-BAD", agent, **ref))
    status = stack_.wait_terminal(test_namespace, "bad")
    assert (status["phase"], status["terminalReason"]) == ("Failed", "invalid_spec")
    assert status["message"].startswith(message), status["message"]


def test_a_goal_referencing_an_undeclared_parameter_is_invalid_spec(
    stack_: E2EStack, test_namespace: str
) -> None:
    stack_.apply(test_namespace, agent_manifest("calc"))
    run = agent_run(
        "typo", "E2E-AGENT-TYPO for {{ params.teem }}", "calc", parameters={"team": "a"}
    )
    stack_.apply(test_namespace, run)
    status = stack_.wait_terminal(test_namespace, "typo")
    assert status["terminalReason"] == "invalid_spec"
    assert status["message"] == (
        "spec.goal: references {{ params.teem }}, not a parameter of the Agent "
        "(declared: factor, team, tone)"
    )


def test_the_api_server_rejects_a_run_that_mixes_agent_ref_and_its_own_definition(
    stack_: E2EStack, test_namespace: str
) -> None:
    both = agent_run("both", "g", "calc")
    both["spec"]["model"] = "mock"
    refused = stack_.kubectl(
        "apply", "-n", test_namespace, "-f", "-", input=json.dumps(both), check=False
    )
    assert refused.returncode != 0
    assert "spec.model: Forbidden: set exactly one of spec.model" in refused.stderr
    assert "not both" in refused.stderr
    tools = agent_run("tools", "g", "calc")
    tools["spec"]["tools"] = ["calculate"]
    refused = stack_.kubectl(
        "apply", "-n", test_namespace, "-f", "-", input=json.dumps(tools), check=False
    )
    assert refused.returncode != 0
    assert "spec.agentRef: Forbidden: a run with spec.agentRef takes" in refused.stderr
    neither = {**agent_run("neither", "g", "calc"), "spec": {"goal": "g"}}
    refused = stack_.kubectl(
        "apply", "-n", test_namespace, "-f", "-", input=json.dumps(neither), check=False
    )
    assert "spec.model: Required value: set one of spec.model" in refused.stderr
    bad_param = agent_manifest("bad")
    bad_param["spec"]["parameters"] = [{"name": "x", "required": True, "default": "1"}]
    refused = stack_.kubectl(
        "apply", "-n", test_namespace, "-f", "-", input=json.dumps(bad_param), check=False
    )
    assert "spec.parameters[0].default: Invalid value" in refused.stderr


def test_editing_the_agent_does_not_change_a_run_created_before_even_while_it_waits(
    stack_: E2EStack, test_namespace: str, tenants: TenantFactory
) -> None:
    tenants(f"agents-{test_namespace[-8:]}", [test_namespace], maxConcurrentRuns=1)
    append_scenario(
        stack_,
        {
            "name": "agent-hold",
            "match": {"goal": "E2E-AGENT-HOLD"},
            "turns": [
                {"tool_calls": [{"name": "sleep", "arguments": {"seconds": 3}}]},
                {"content": "held"},
            ],
        },
    )
    append_scenario(
        stack_, {"name": "agent-edit", "match": {"goal": "E2E-AGENT-EDIT"}, "turns": AGENT_TURNS}
    )
    stack_.apply(test_namespace, agent_manifest("calc"))
    stack_.apply(
        test_namespace, agent_run("holder", "E2E-AGENT-HOLD", "calc", parameters={"team": "ops"})
    )
    stack_.wait_for(test_namespace, "holder", lambda s: s.get("phase") == "Running")
    stack_.apply(
        test_namespace, agent_run("waiter", "E2E-AGENT-EDIT 1", "calc", parameters={"team": "ops"})
    )
    before = stack_.wait_for(test_namespace, "waiter", lambda s: s.get("phase") == "Queued")
    edited = agent_manifest("calc", instructions="Edited: answer in French.")
    stack_.apply(test_namespace, edited)
    assert get_agent(stack_, test_namespace, "calc")["metadata"]["generation"] == 2
    status = stack_.wait_terminal(test_namespace, "waiter", timeout=60)
    assert status["terminalReason"] == "completed"
    assert status["agent"] == before["agent"] and status["agent"]["generation"] == 1
    assert system_prompts(stack_, "E2E-AGENT-EDIT 1") == {
        "You are the ops team's calculator. Be brief."
    }
    # a run created after the edit gets the new definition, under a new digest
    stack_.apply(
        test_namespace, agent_run("after", "E2E-AGENT-EDIT 2", "calc", parameters={"team": "ops"})
    )
    later = stack_.wait_terminal(test_namespace, "after")
    assert (
        later["agent"]["generation"] == 2 and later["agent"]["digest"] != status["agent"]["digest"]
    )
    assert system_prompts(stack_, "E2E-AGENT-EDIT 2") == {"Edited: answer in French."}


def ready_condition(stack_: E2EStack, namespace: str, name: str) -> dict[str, Any]:
    """The Agent's ``Ready`` condition, once the operator has written one (30 s at most)."""
    end = time.monotonic() + 30
    while True:
        agent = get_agent(stack_, namespace, name)
        conditions = {c["type"]: c for c in (agent.get("status") or {}).get("conditions", [])}
        if "Ready" in conditions or time.monotonic() > end:
            break
        time.sleep(0.25)
    found: dict[str, Any] = conditions["Ready"]
    return found


def test_an_agent_whose_model_is_missing_is_not_ready(
    stack_: E2EStack, test_namespace: str
) -> None:
    stack_.apply(test_namespace, agent_manifest("orphan", model="no-such-model"))
    ready = ready_condition(stack_, test_namespace, "orphan")
    assert (ready["status"], ready["reason"]) == ("False", "ModelNotFound")
    assert ready["message"] == (
        "spec.model: AgentModel 'no-such-model' not found (cluster-scoped): "
        "`kubectl get agentmodels` lists those there"
    )


def test_an_agent_with_an_unclosed_placeholder_is_not_ready_and_its_runs_are_invalid_spec(
    stack_: E2EStack, test_namespace: str
) -> None:
    stack_.apply(test_namespace, agent_manifest("unclosed", instructions="hi {{ params.team"))
    ready = ready_condition(stack_, test_namespace, "unclosed")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert ready["message"] == (
        "spec.instructions: '{{' at character 3 has no matching '}}' "
        "(a placeholder is {{ params.NAME }})"
    )
    run = agent_run("verbatim", "E2E-AGENT-UNCLOSED", "unclosed", parameters={"team": "a"})
    stack_.apply(test_namespace, run)
    status = stack_.wait_terminal(test_namespace, "verbatim")
    assert (status["phase"], status["terminalReason"]) == ("Failed", "invalid_spec")
    assert status["message"].startswith(
        "Agent 'unclosed' spec.instructions: '{{' at character 3 has no matching '}}'"
    ), status["message"]
    assert model_calls(stack_, "E2E-AGENT-UNCLOSED") == []
