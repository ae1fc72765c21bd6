"""Kubernetes Events: the operator records admissions, queue waits, approvals, ends, tenant
budget moments and model failures, as ``kubectl get events`` shows them; never one per turn."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from agentrun.operator.platform.events import EventRecorder, EventType, Involved, Occasion, Throttle
from agentrun.operator.platform.kubeapi import ApiError, Kube

from . import test_tenants
from .conftest import E2EStack, run_manifest
from .test_approval import cli
from .test_tenants import TenantFactory, append_scenario, wait_early_in_window

pytestmark = pytest.mark.e2e

tenants = test_tenants.tenants
"""The AgentTenant fixture: ``tenants(name, namespaces, **spec)``."""


def events(stack_: E2EStack, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
    """The events on ``kind/name`` in ``namespace`` by first time, as kubectl lists them."""
    listed = json.loads(
        stack_.kubectl(
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            f"involvedObject.kind={kind},involvedObject.name={name}",
            "-o",
            "json",
        ).stdout
    )
    items: list[dict[str, Any]] = listed["items"]
    return sorted(items, key=lambda e: (e["firstTimestamp"], e["metadata"]["creationTimestamp"]))


def wait_events(
    stack_: E2EStack,
    namespace: str,
    kind: str,
    name: str,
    predicate: Callable[[list[dict[str, Any]]], bool],
    *,
    timeout: float = 30,
) -> list[dict[str, Any]]:
    end = time.monotonic() + timeout
    while True:
        found = events(stack_, namespace, kind, name)
        if predicate(found) or time.monotonic() > end:
            assert predicate(found), json.dumps([brief(e) for e in found], indent=1)
            return found
        time.sleep(0.3)


def brief(event: dict[str, Any]) -> tuple[str, str, str]:
    return (event["type"], event["reason"], event["message"])


def used_all(event: dict[str, Any]) -> bool:
    """A WindowReset closing a window that used the whole 1000-token budget."""
    return event["reason"] == "WindowReset" and "previous one used 1000 tokens" in event["message"]


def reasons(found: list[dict[str, Any]]) -> list[str]:
    return [e["reason"] for e in found]


def test_a_run_records_its_admission_and_its_end_with_reason_and_cost_not_its_turns(
    stack_: E2EStack, test_namespace: str
) -> None:
    append_scenario(
        stack_,
        {
            "name": "events-steps",
            "match": {"goal": "E2E-EVENTS-STEPS"},
            "turns": [
                {
                    "tool_calls": [{"name": "calculate", "arguments": {"expression": "{turn}+1"}}],
                    "usage": {"prompt_tokens": 50, "completion_tokens": 10},
                }
            ],
            "after": "repeat_last",
        },
    )
    stack_.apply(test_namespace, run_manifest("steps", "E2E-EVENTS-STEPS", budget={"maxSteps": 4}))
    status = stack_.wait_terminal(test_namespace, "steps")
    assert status["terminalReason"] == "max_steps"
    found = wait_events(
        stack_, test_namespace, "AgentRun", "steps", lambda f: "MaxSteps" in reasons(f)
    )
    time.sleep(1.0)  # nothing more comes
    found = events(stack_, test_namespace, "AgentRun", "steps")
    assert reasons(found) == ["Admitted", "MaxSteps"]  # five turns, two events
    admitted, ended = found
    assert admitted["type"] == "Normal" and "admitted in AgentTenant" in admitted["message"]
    assert ended["type"] == "Warning" and ended["count"] == 1
    usage = status["usage"]
    assert ended["message"].startswith(
        f"ended max_steps (outcome partial) after {usage['steps']} steps, "
        f"{usage['toolCalls']} tool calls, {usage['totalTokens']} tokens, {usage['costUSD']} USD"
    )
    assert ended["involvedObject"]["uid"] == stack_.get(test_namespace, "steps")["metadata"]["uid"]
    assert ended["source"]["component"] == "agentrun-operator"
    described = stack_.kubectl("describe", "agentrun", "steps", "-n", test_namespace).stdout
    assert "MaxSteps" in described and "Admitted" in described


def test_an_unadmitted_run_records_why_it_ended(stack_: E2EStack, test_namespace: str) -> None:
    stack_.apply(test_namespace, run_manifest("nomodel", "x", model="no-such-model"))
    stack_.wait_terminal(test_namespace, "nomodel")
    found = wait_events(stack_, test_namespace, "AgentRun", "nomodel", lambda f: bool(f))
    assert [brief(e)[:2] for e in found] == [("Warning", "InvalidSpec")]
    assert "spec.model: AgentModel 'no-such-model' not found" in found[0]["message"]


def test_approval_requested_and_decided_are_recorded(stack_: E2EStack, test_namespace: str) -> None:
    manifest = run_manifest("held", "E2E-APPROVAL held", approval={"tools": ["calculate"]})
    stack_.apply(test_namespace, manifest)
    waiting = stack_.wait_for(
        test_namespace, "held", lambda s: s.get("phase") == "AwaitingApproval"
    )
    digest = waiting["pendingApproval"]["digest"]
    found = wait_events(
        stack_, test_namespace, "AgentRun", "held", lambda f: "ApprovalRequested" in reasons(f)
    )
    requested = found[reasons(found).index("ApprovalRequested")]
    assert "a1 (calculate)" in requested["message"] and digest in requested["message"]
    assert cli(stack_, "approve", "held", "--digest", digest, "-n", test_namespace).returncode == 0
    stack_.wait_terminal(test_namespace, "held")
    found = wait_events(
        stack_, test_namespace, "AgentRun", "held", lambda f: "Completed" in reasons(f)
    )
    assert reasons(found) == ["Admitted", "ApprovalRequested", "Approved", "Completed"]
    assert found[3]["type"] == "Normal"


def test_a_used_up_tenant_window_records_exhaustion_queueing_and_the_reset(
    stack_: E2EStack, test_namespace: str, tenants: TenantFactory
) -> None:
    # the first run must end and the second be applied inside the window the first used up:
    # a run takes a second or two, several on a busy machine, so at least 12 s of a 16 s
    # window are left when they start
    spec = {
        "window": "16s",
        "budget": {"tokens": 1000},
        "runBudget": {"default": {"maxTokens": 1000}},
    }
    tenant = tenants(f"ev-{test_namespace}", [test_namespace], **spec)
    wait_early_in_window(stack_, tenant, window=16, margin=12)
    stack_.apply(test_namespace, run_manifest("first", f"E2E-TENANT-EXACT first {tenant}"))
    stack_.wait_terminal(test_namespace, "first", timeout=20)
    stack_.apply(test_namespace, run_manifest("second", f"E2E-TENANT-SMALL second {tenant}"))
    # its Event, not its phase: Queued lasts only until the reset, which a poll can miss
    wait_events(
        stack_, test_namespace, "AgentRun", "second", lambda f: "Queued" in reasons(f), timeout=30
    )
    on_tenant = wait_events(
        stack_,
        "default",
        "AgentTenant",
        tenant,
        lambda f: "BudgetExhausted" in reasons(f) and any(used_all(e) for e in f),
        timeout=30,
    )
    exhausted = on_tenant[reasons(on_tenant).index("BudgetExhausted")]
    assert exhausted["type"] == "Warning" and "tokens" in exhausted["message"]
    reset = next(e for e in on_tenant if used_all(e))
    assert reset["type"] == "Normal"
    assert exhausted["involvedObject"]["uid"]  # looked up: kubectl describe finds it
    stack_.wait_terminal(test_namespace, "second", timeout=30)
    second = wait_events(
        stack_, test_namespace, "AgentRun", "second", lambda f: "Completed" in reasons(f)
    )
    assert reasons(second) == ["Queued", "Admitted", "Completed"]
    assert "(BudgetExhausted)" in second[0]["message"]


def test_a_failing_model_is_warned_about_on_its_agentmodel_without_naming_the_run(
    stack_: E2EStack, test_namespace: str
) -> None:
    """The AgentModel is cluster-scoped: its Events sit in ``default``, where people of every
    tenant read them. The warning names no run, namespace or tenant and quotes nothing the
    provider said (which may echo a prompt); the run's own Event in its namespace has the
    cause, with the provider's terminal escape neutralised."""
    stack_.apply(test_namespace, run_manifest("broken-echo", "E2E-ECHOING-500"))
    ended = stack_.wait_terminal(test_namespace, "broken-echo", timeout=90)
    assert ended["terminalReason"] == "model_error"
    assert "TENANT-SECRET-PLAN" in ended["message"]
    found = wait_events(
        stack_, "default", "AgentModel", "mock", lambda f: "ModelCallsFailing" in reasons(f)
    )
    failing = found[reasons(found).index("ModelCallsFailing")]
    assert failing["type"] == "Warning"  # once per model per minute: any run's failure
    assert "ended model_error" in failing["message"]
    for private in ("broken", test_namespace, "TENANT-SECRET-PLAN", "upstream", "\x1b"):
        assert private not in failing["message"], failing["message"]
    own = wait_events(
        stack_, test_namespace, "AgentRun", "broken-echo", lambda f: "ModelError" in reasons(f)
    )
    message = own[reasons(own).index("ModelError")]["message"]
    assert "TENANT-SECRET-PLAN" in message
    assert "\x1b" not in message and "\\x1b[31m" in message


def test_the_recorder_raises_a_repeat_s_count_and_posts_anew_once_the_event_is_gone(
    control_plane: Any, stack_: E2EStack, test_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The poster against the API server itself: the first occasion creates an Event, a repeat
    raises its ``count``, a repeat after the Event expired (deleted) creates a new one, and an
    API refusal (a namespace that does not exist) is raised to the caller."""
    monkeypatch.setenv("KUBECONFIG", str(control_plane.kubeconfig))
    involved = Involved("AgentRun", "posted", test_namespace, "uid-posted")

    async def post_all() -> None:
        api = await Kube.connect()
        recorder = EventRecorder(api, throttle=Throttle(repeat_after=0, rate=100, burst=100))
        try:
            for message in ("one", "two"):
                await recorder.post(
                    Occasion(involved, EventType.NORMAL, "Probe", message, "k"), at=time.time()
                )
            found = events(stack_, test_namespace, "AgentRun", "posted")
            assert [(e["count"], e["message"]) for e in found] == [(2, "two")]
            assert found[0]["involvedObject"]["uid"] == "uid-posted"
            assert found[0]["source"]["component"] == "agentrun-operator"
            stack_.kubectl("delete", "events", "--all", "-n", test_namespace)
            await recorder.post(
                Occasion(involved, EventType.WARNING, "Probe", "three", "k"), at=time.time()
            )
            found = events(stack_, test_namespace, "AgentRun", "posted")
            assert [(e["type"], e["count"], e["message"]) for e in found] == [
                ("Warning", 1, "three")
            ]
            nowhere = Involved("AgentRun", "posted", "no-such-namespace", "uid-posted")
            with pytest.raises(ApiError) as refused:
                await recorder.post(
                    Occasion(nowhere, EventType.NORMAL, "Probe", "four", "k2"), at=time.time()
                )
            assert refused.value.status == 404
        finally:
            await api.close()

    asyncio.run(post_all())
