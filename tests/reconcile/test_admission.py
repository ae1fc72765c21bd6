"""Admission turns spec + AgentModel into a RunConfig, or an invalid_spec naming the field."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from agentrun import kernel
from agentrun.operator import admission, status
from agentrun.operator.runs import RunKey

RUN = RunKey("ns", "run", "uid-1")
MODEL: dict[str, Any] = {
    "spec": {
        "baseURL": "http://m/v1",
        "model": "gpt",
        "pricing": {
            "inputPerMillionUSD": "2.5",
            "cachedInputPerMillionUSD": "1.25",
            "outputPerMillionUSD": "10",
        },
        "contextWindow": 8000,
        "maxOutputTokens": 500,
        "credentials": {"secretRef": {"name": "key", "namespace": "platform"}},
    }
}
TOOLS = {"calculate": False, "sleep": False, "kubernetes_get": True}


def admit(spec: dict[str, Any], model: dict[str, Any] | None = MODEL) -> Any:
    return admission.build_run_config(
        RUN, {"model": "m", "goal": "g", **spec}, model=model, known_tools=TOOLS, start_time=1000.0
    )


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("10m", 600), ("1h30m", 5400), ("1.5s", 1.5), ("250ms", 0.25), ("2h", 7200)],
)
def test_durations_are_read_like_go(text: str, seconds: float) -> None:
    assert admission.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5 minutes", "10", "m10", "1h 30m", "-1s"])
def test_bad_durations_name_the_field(text: str) -> None:
    with pytest.raises(admission.InvalidSpec, match=r"spec\.budget\.timeout"):
        admission.parse_duration(text)


def test_an_admitted_run_takes_prices_and_windows_from_the_model_only() -> None:
    config = admit(
        {"tools": ["calculate"], "budget": {"maxSteps": 7, "maxCostUSD": "0.25", "timeout": "90s"}}
    )
    assert config.deadline == 1090.0
    assert config.limits.max_steps == 7 and config.limits.max_cost_usd == Decimal("0.25")
    assert config.limits.context_window == 8000 and config.limits.max_output_tokens == 500
    assert config.model.pricing.output_per_million == Decimal("10")
    assert config.model.secret is not None and config.model.secret.key == "apiKey"


def test_a_run_cannot_bring_its_own_prices() -> None:
    config = admit({"pricing": {"outputPerMillionUSD": "0"}, "model_pricing": "0"})
    assert config.model.pricing.output_per_million == Decimal("10")


@pytest.mark.parametrize(
    ("spec", "model", "message"),
    [
        ({}, None, "spec.model: AgentModel 'm' not found"),
        ({"tools": ["calculate", "rm_rf"]}, MODEL, "spec.tools: unknown tool(s) rm_rf"),
        (
            {"tools": ["calculate"], "approval": {"tools": ["sleep"]}},
            MODEL,
            "spec.approval.tools: sleep",
        ),
        ({"budget": {"maxCostUSD": "lots"}}, MODEL, "spec.budget.maxCostUSD"),
    ],
    ids=["unknown model", "unknown tool", "approval outside tools", "bad cost"],
)
def test_an_unservable_run_is_rejected_naming_the_field(
    spec: dict[str, Any], model: Any, message: str
) -> None:
    with pytest.raises(admission.InvalidSpec) as err:
        admit(spec, model)
    assert message in str(err.value)


def test_a_rejection_projects_to_failed_invalid_spec() -> None:
    body = status.rejected("spec.model: AgentModel 'm' not found", at=1000.0, generation=1)
    assert (body["phase"], body["terminalReason"], body["outcome"]) == (
        "Failed",
        "invalid_spec",
        "partial",
    )
    assert {c["type"]: c["status"] for c in body["conditions"]} == {
        "Admitted": "False",
        "Finished": "True",
    }


def test_a_queued_status_names_tenant_reason_and_position() -> None:
    body = status.queued(
        tenant="team-a",
        reason="ConcurrencyLimit",
        message="2 of maxConcurrentRuns 2 runs are active",
        position=3,
        at=1000.0,
        generation=1,
    )
    assert (body["phase"], body["tenant"], body["queuePosition"]) == ("Queued", "team-a", 3)
    [admitted] = body["conditions"]
    assert (admitted["type"], admitted["status"], admitted["reason"]) == (
        "Admitted",
        "False",
        "ConcurrencyLimit",
    )
    assert "terminalReason" not in body


def test_an_unadmitted_end_carries_its_reason_and_clears_the_queue_position() -> None:
    body = status.rejected(
        "no budget left",
        at=1000.0,
        generation=1,
        phase=kernel.Phase.TENANT_BUDGET_EXHAUSTED,
        tenant="team-a",
    )
    assert (body["phase"], body["terminalReason"], body["outcome"]) == (
        "Failed",
        "tenant_budget_exhausted",
        "partial",
    )
    assert body["queuePosition"] is None and body["tenant"] == "team-a"
    assert {c["reason"] for c in body["conditions"]} == {"TenantBudgetExhausted"}
    cancelled = status.rejected("cancelled", at=1.0, generation=1, phase=kernel.Phase.CANCELLED)
    assert (cancelled["phase"], cancelled["terminalReason"]) == ("Cancelled", "cancelled")


def test_an_admitted_status_leaves_the_queue() -> None:
    summary = kernel.initial_state(goal="g").summary()
    body = status.project(
        summary, seq=1, start_time=1.0, event_time=2.0, generation=1, admitted_at=1.0, tenant="t"
    )
    assert body["queuePosition"] is None and body["tenant"] == "t"
