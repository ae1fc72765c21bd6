"""Argo CD health checks (docs/argocd): the Lua scripts, run with a real Lua 5.1 runtime,
against the committed samples (``health_test.yaml``, as Argo CD's own resource_customizations
are tested) and against live objects of real runs, tenants and Agents.

``AGENTRUN_WRITE_ARGOCD_TESTDATA=1`` rewrites each Kind's ``testdata/`` and ``health_test.yaml``
from the live objects (review the diff: the statuses are asserted here either way)."""

from __future__ import annotations

import copy
import json
import time
from typing import Any

import pytest
import yaml

from . import argocd_health, test_tenants
from .conftest import E2EStack, run_manifest
from .test_agents import agent_manifest
from .test_tenants import (
    TenantFactory,
    append_scenario,
    conditions,
    wait_early_in_window,
    wait_tenant,
)

tenants = test_tenants.tenants
"""The AgentTenant fixture: ``tenants(name, namespaces, **spec)``."""


@pytest.mark.parametrize("kind", argocd_health.KINDS)
def test_the_committed_samples_get_the_health_their_test_file_states(kind: str) -> None:
    cases = argocd_health.test_cases(kind)
    assert len(cases) >= 2
    for expected, path in cases:
        obj = yaml.safe_load(path.read_text())
        assert obj["kind"] == kind, path
        assert argocd_health.health(kind, obj) == expected, path.name


def test_every_argo_status_a_kind_can_report_has_a_sample() -> None:
    covered = {
        kind: {expected["status"] for expected, _ in argocd_health.test_cases(kind)}
        for kind in argocd_health.KINDS
    }
    assert covered == {
        "AgentRun": {"Progressing", "Suspended", "Healthy", "Degraded"},
        "AgentTenant": {"Progressing", "Suspended", "Healthy", "Degraded"},
        "Agent": {"Progressing", "Healthy", "Degraded"},
        "AgentEval": {"Progressing", "Healthy", "Degraded"},
        "CronAgentRun": {"Progressing", "Suspended", "Healthy", "Degraded"},
    }


def awaiting_approval(*decisions: str) -> dict[str, Any]:
    """The committed AwaitingApproval sample with one held ``calculate`` call per decision
    (``pending``, ``approved``, ``denied``), waiting for the first pending one, as the operator
    writes ``status.pendingApproval`` for a turn that held several calls."""
    path = argocd_health.ROOT / "AgentRun/testdata/awaiting-approval.yaml"
    obj: dict[str, Any] = yaml.safe_load(path.read_text())
    pending = obj["status"]["pendingApproval"]
    template = pending["heldCalls"][0]
    held = [
        {**copy.deepcopy(template), "toolCallID": f"a{i + 1}", "decision": decision}
        for i, decision in enumerate(decisions)
    ]
    waiting = next(i for i, h in enumerate(held) if h["decision"] == "pending")
    pending.update(
        toolCallID=held[waiting]["toolCallID"], call=waiting + 1, of=len(held), heldCalls=held
    )
    return obj


@pytest.mark.parametrize(
    ("decisions", "message"),
    [
        pytest.param(("pending",), "call 1 of 1 held for approval: calculate", id="one-held"),
        pytest.param(
            ("pending", "pending", "pending"),
            "call 1 of 3 held for approval: calculate",
            id="three-held-none-decided",
        ),
        pytest.param(
            ("approved", "denied", "pending"),
            "call 3 of 3 held for approval: calculate (2 decided)",
            id="three-held-two-decided",
        ),
    ],
)
def test_a_run_awaiting_approval_says_which_held_call_waits_and_how_many_were_held(
    decisions: tuple[str, ...], message: str
) -> None:
    found = argocd_health.health("AgentRun", awaiting_approval(*decisions))
    assert found == {
        "status": "Suspended",
        "message": f"Waiting for a person to approve or deny {message}",
    }


def test_a_pending_approval_without_the_held_call_fields_still_names_the_tool() -> None:
    obj = awaiting_approval("pending")
    pending = obj["status"]["pendingApproval"]
    for written_later in ("call", "of", "heldCalls"):
        del pending[written_later]
    assert argocd_health.health("AgentRun", obj) == {
        "status": "Suspended",
        "message": "Waiting for a person to approve or deny a call of calculate",
    }


def get(stack_: E2EStack, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
    args = ["get", kind, name, "-o", "json"] + (["-n", namespace] if namespace else [])
    found: dict[str, Any] = json.loads(stack_.kubectl(*args).stdout)
    return argocd_health.clean(found)


@pytest.mark.e2e
def test_live_objects_get_the_expected_health(
    stack_: E2EStack, test_namespace: str, tenants: TenantFactory
) -> None:
    ns = test_namespace
    tenant = tenants(
        f"argo-{ns}",
        [ns],
        maxConcurrentRuns=1,
        window="1h",
        budget={"tokens": 1000},
        runBudget={"default": {"maxTokens": 1000}},
    )
    # the tenant must stay used up from the holder's charge to the last sample: one window
    wait_early_in_window(stack_, tenant, window=3600, margin=120)
    samples = argocd_health.Samples(ns, tenant)
    sample = samples.check

    # a run waiting for a person holds the tenant's one slot; the next one queues
    append_scenario(
        stack_,
        {
            "name": "argo-held",
            "match": {"goal": "E2E-ARGOHOLD"},
            "turns": [
                {
                    "content": "Computing; the multiplication needs a reviewer.",
                    "tool_calls": [{"name": "calculate", "arguments": {"expression": "6*7"}}],
                    # the 900 tokens are mostly output: a prompt reported far above what was
                    # sent would teach the worker that ran it a hidden prompt of ~800 tokens
                    # for this tenant (PromptCalibration), and later runs here would end
                    # token_budget_exhausted or not depending on which worker took them
                    "usage": {"prompt_tokens": 50, "completion_tokens": 850},
                }
            ],
        },
    )
    holder = run_manifest("held", "E2E-ARGOHOLD held", approval={"tools": ["calculate"]})
    stack_.apply(ns, holder)
    stack_.wait_for(ns, "held", lambda s: s.get("phase") == "AwaitingApproval")
    found = sample(
        "AgentRun", "awaiting-approval", get(stack_, "agentrun", "held", ns), "Suspended"
    )
    assert found["message"] == (
        "Waiting for a person to approve or deny call 1 of 1 held for approval: calculate"
    )
    stack_.apply(ns, run_manifest("exact", "E2E-TENANT-EXACT argo"))
    stack_.wait_for(ns, "exact", lambda s: s.get("phase") == "Queued")
    found = sample("AgentRun", "queued", get(stack_, "agentrun", "exact", ns), "Progressing")
    assert "queued in AgentTenant" in found["message"]
    stack_.kubectl("annotate", "agentrun", "held", "-n", ns, "agentrun.dev/cancel=true")
    stack_.wait_terminal(ns, "held")
    found = sample("AgentRun", "cancelled", get(stack_, "agentrun", "held", ns), "Degraded")
    assert found["message"].startswith("cancelled: cancelled by the agentrun.dev/cancel")
    # the holder spent 900 of the tenant's 1000 tokens: even the queued run's smallest first
    # call (its prompt and 128 output tokens) no longer fits, so the tenant is Suspended until
    # the window resets or it gets more
    exhausted = wait_tenant(
        stack_, tenant, lambda s: conditions(s).get("BudgetExhausted", {}).get("status") == "True"
    )
    assert exhausted["queuedRuns"] == 1
    found = sample(
        "AgentTenant", "budget-exhausted", get(stack_, "agenttenant", tenant), "Suspended"
    )
    assert "tokens" in found["message"]
    stale = copy.deepcopy(get(stack_, "agenttenant", tenant))
    stale["metadata"]["generation"] += 1  # edited, not yet read by the operator
    sample("AgentTenant", "not-observed", stale, "Progressing")

    # with the budget raised the queued run goes on and the tenant is healthy
    stack_.kubectl(
        "patch",
        "agenttenant",
        tenant,
        "--type=merge",
        "-p",
        '{"spec":{"budget":{"tokens":100000}}}',
    )
    stack_.wait_terminal(ns, "exact")
    succeeded = get(stack_, "agentrun", "exact", ns)
    found = sample("AgentRun", "succeeded", succeeded, "Healthy")
    assert found["message"].startswith("completed in 1 step, ")
    pending = copy.deepcopy(succeeded)
    del pending["status"]  # as applied, before the operator's first status write
    sample("AgentRun", "pending", pending, "Progressing")
    wait_tenant(
        stack_,
        tenant,
        lambda s: (
            s.get("observedGeneration") == 2
            and s.get("activeRuns") == 0
            and conditions(s).get("BudgetExhausted", {}).get("status") == "False"
        ),
    )
    found = sample("AgentTenant", "healthy", get(stack_, "agenttenant", tenant), "Healthy")
    assert found["message"] == "0 active, 0 queued runs"
    stack_.apply(ns, run_manifest("long", "E2E-LONG argo"))
    # the object sampled is the one seen running: a second read could find the run ended
    end = time.monotonic() + 60
    while True:
        running = get(stack_, "agentrun", "long", ns)
        shown = running.get("status") or {}
        if shown.get("phase") == "Running" and shown.get("usage"):
            break
        assert time.monotonic() < end, f"long never showed Running with usage: {shown}"
        time.sleep(0.25)
    found = sample("AgentRun", "running", running, "Progressing")
    assert found["message"].startswith("Running: ")
    append_scenario(
        stack_,
        {
            "name": "argo-steps",
            "match": {"goal": "E2E-ARGO-STEPS"},
            "turns": [
                {
                    "tool_calls": [{"name": "calculate", "arguments": {"expression": "{turn}+1"}}],
                    "usage": {"prompt_tokens": 50, "completion_tokens": 10},
                }
            ],
            "after": "repeat_last",
        },
    )
    stack_.apply(ns, run_manifest("capped", "E2E-ARGO-STEPS", budget={"maxSteps": 2}))
    stack_.wait_terminal(ns, "capped", timeout=90)
    found = sample("AgentRun", "max-steps", get(stack_, "agentrun", "capped", ns), "Degraded")
    assert found["message"].startswith("max_steps: ")
    stack_.apply(ns, run_manifest("nomodel", "x", model="no-such-model"))
    stack_.wait_terminal(ns, "nomodel")
    found = sample("AgentRun", "invalid-spec", get(stack_, "agentrun", "nomodel", ns), "Degraded")
    assert found["message"] == (
        "invalid_spec: spec.model: AgentModel 'no-such-model' not found (cluster-scoped): "
        "`kubectl get agentmodels` lists those there"
    )

    invalid = f"argo-invalid-{ns}"
    with test_tenants.tenant_crd_before_default_checks(stack_):  # now rejected on apply
        tenants(invalid, [f"unused-{ns}"], runBudget=test_tenants.DEFAULT_ABOVE_CAP)
    wait_tenant(stack_, invalid, lambda s: "Accepted" in conditions(s))
    obj = argocd_health.anonymous(get(stack_, "agenttenant", invalid), invalid, None)
    found = sample("AgentTenant", "invalid-spec", obj, "Degraded")
    assert "spec.runBudget.default.maxSteps" in found["message"]

    stack_.apply(ns, agent_manifest("calc"))
    stack_.apply(ns, agent_manifest("orphan", model="no-such-model"))
    for name, case, status in (
        ("calc", "ready", "Healthy"),
        ("orphan", "model-missing", "Degraded"),
    ):
        obj = wait_agent_checked(stack_, ns, name)
        sample("Agent", case, obj, status)
    fresh = copy.deepcopy(obj)
    del fresh["status"]
    sample("Agent", "unchecked", fresh, "Progressing")

    samples.write()


def wait_agent_checked(stack_: E2EStack, namespace: str, name: str) -> dict[str, Any]:
    end = time.monotonic() + 30
    while True:
        obj = get(stack_, "agent", name, namespace)
        if (obj.get("status") or {}).get("conditions") or time.monotonic() > end:
            return obj
        time.sleep(0.25)
