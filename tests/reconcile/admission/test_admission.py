"""Admission turns spec + AgentModel into a RunConfig, or an invalid_spec naming the field."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from agentrun import kernel, protocol
from agentrun.kernel import schemas
from agentrun.operator.admission import config as admission
from agentrun.operator.admission.config import too_large_to_checkpoint
from agentrun.operator.agents.spec import model_config
from agentrun.operator.platform.spec import SpecError
from agentrun.operator.runs import RunKey, status
from agentrun.operator.runs.spec import AgentRunSpec

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
        RUN,
        AgentRunSpec.of({"model": "m", "goal": "g", **spec}),
        model=None if model is None else model_config("m", model),
        known_tools=TOOLS,
        start_time=1000.0,
    )


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("10m", 600), ("1h30m", 5400), ("1.5s", 1.5), ("250ms", 0.25), ("2h", 7200)],
)
def test_durations_are_read_like_go(text: str, seconds: float) -> None:
    assert admit({"budget": {"timeout": text}}).deadline == 1000.0 + seconds


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.25, "250ms"),
        (1.5, "1.5s"),
        (90, "1m30s"),
        (600, "10m0s"),
        (599.9984, "9m59.998s"),
        (5400.5, "1h30m0.5s"),
        (86400, "24h0m0s"),
    ],
)
def test_status_budget_writes_a_timeout_as_kubernetes_writes_durations(
    seconds: float, text: str
) -> None:
    """Go's ``time.Duration.String`` to the millisecond (``status.budget.timeout``), which
    the spec's duration reader reads back."""
    assert protocol.duration_text(seconds) == text
    assert admit({"budget": {"timeout": text}}).deadline == 1000.0 + round(seconds, 3)


@pytest.mark.parametrize("text", ["", "5 minutes", "10", "m10", "1h 30m", "-1s"])
def test_bad_durations_name_the_field(text: str) -> None:
    with pytest.raises(SpecError, match=r"^spec\.budget\.timeout: .*like 90s"):
        admit({"budget": {"timeout": text}})


def test_an_unset_budget_gets_the_implicit_caps_and_the_kernel_defaults() -> None:
    config = admit({})
    assert (config.limits.max_steps, config.limits.max_tool_calls) == (20, 50)
    assert (config.limits.max_tokens, config.limits.max_cost_usd) == (None, None)
    assert config.deadline == 1000.0 + 600
    assert config.limits.on_exhausted is kernel.OnExhausted.SUMMARIZE
    assert config.limits.no_progress_window == 3


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
        (
            {},
            None,
            "spec.model: AgentModel 'm' not found (cluster-scoped): "
            "`kubectl get agentmodels` lists those there",
        ),
        ({"tools": ["calculate", "rm_rf"]}, MODEL, "spec.tools: unknown tool(s) rm_rf;"),
        (
            {"tools": ["calculte", "rm_rf"]},
            MODEL,
            "spec.tools: unknown tool(s) calculte (did you mean 'calculate'?), rm_rf;",
        ),
        (
            {"tools": ["calculate"], "approval": {"tools": ["sleep"]}},
            MODEL,
            "spec.approval.tools: sleep",
        ),
        ({"budget": {"maxCostUSD": "lots"}}, MODEL, "spec.budget.maxCostUSD: 'lots' is not a"),
        ({"budget": {"maxCostUSD": "-1"}}, MODEL, "spec.budget.maxCostUSD: '-1' must be"),
        ({"budget": {"maxSteps": "many"}}, MODEL, "spec.budget.maxSteps: 'many' is invalid"),
        ({"budget": {"onExhausted": "panic"}}, MODEL, "spec.budget.onExhausted: 'panic'"),
        ({"budget": {"noProgress": {"window": []}}}, MODEL, "spec.budget.noProgress.window: "),
        ({"tools": "calculate"}, MODEL, "spec.tools: 'calculate' is invalid"),
    ],
    ids=[
        "unknown model",
        "unknown tool",
        "misspelled tool",
        "approval outside tools",
        "bad cost",
        "negative cost",
        "steps not a number",
        "unknown onExhausted",
        "noProgress window not a number",
        "tools not a list",
    ],
)
def test_an_unservable_run_is_rejected_naming_the_field(
    spec: dict[str, Any], model: Any, message: str
) -> None:
    with pytest.raises(SpecError) as err:
        admit(spec, model)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"pricing": {"inputPerMillionUSD": "cheap"}}, "spec.pricing.inputPerMillionUSD: 'cheap'"),
        ({"pricing": {"outputPerMillionUSD": "-2"}}, "spec.pricing.outputPerMillionUSD: '-2' must"),
        ({"contextWindow": "big"}, "spec.contextWindow: 'big' is invalid"),
        ({"credentials": {"secretRef": {"name": "k"}}}, "spec.credentials.secretRef.namespace: "),
    ],
    ids=["input price", "negative output price", "context window", "secret without namespace"],
)
def test_a_bad_agentmodel_is_rejected_naming_the_model_and_the_field(
    spec: dict[str, Any], message: str
) -> None:
    with pytest.raises(SpecError) as err:
        model_config("m", {"spec": spec})
    assert str(err.value).startswith(f"AgentModel 'm' {message}")


def test_an_agentmodel_without_limits_gets_the_kernel_window_defaults() -> None:
    model = model_config("m", {"spec": {"baseURL": "http://m/v1", "model": "x"}})
    defaults = kernel.Limits()
    assert (model.context_window, model.max_output_tokens) == (
        defaults.context_window,
        defaults.max_output_tokens,
    )
    assert model.pricing == kernel.Pricing() and model.secret is None


def test_a_rejection_projects_to_failed_invalid_spec() -> None:
    body = status.rejected("spec.model: AgentModel 'm' not found", at=1000.0, generation=1)
    assert (body["phase"], body["terminalReason"], body["outcome"]) == (
        "Failed",
        "invalid_spec",
        "none",
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
        "none",
    )
    assert body["queuePosition"] is None and body["tenant"] == "team-a"
    assert {c["reason"] for c in body["conditions"]} == {"TenantBudgetExhausted"}
    cancelled = status.rejected("cancelled", at=1.0, generation=1, phase=kernel.Phase.CANCELLED)
    assert (cancelled["phase"], cancelled["terminalReason"]) == ("Cancelled", "cancelled")


def test_an_admitted_status_leaves_the_queue() -> None:
    summary = kernel.initial_state(goal="g").summary()
    body = status.project(summary, seq=1, start_time=1.0, event_time=2.0, generation=1, tenant="t")
    assert body["queuePosition"] is None and body["tenant"] == "t"


def test_admission_asks_for_the_smallest_first_call_the_reservation_would_make() -> None:
    """Finding 7: a tenant with 0.026 USD left could start no run on a model whose
    maxOutputTokens is 4096 (0.041 USD worst case), although the turn's reservation shrinks
    to what is left. Admission now asks what the reservation needs at least: the prompt's
    bound and 128 output tokens."""
    big = {"spec": {**MODEL["spec"], "maxOutputTokens": 4096, "contextWindow": 128000}}
    config = admit({}, big)
    tokens, cost = admission.first_call_need(config, tools=[])
    plan = kernel.plan_turn(
        kernel.initial_state(goal="g"),
        config.limits,
        pricing=config.model.pricing,
        offer=kernel.Offer([]),
        clock=kernel.Timing(now=0.0, deadline=1e12),
    )
    assert isinstance(plan, kernel.CallModel) and plan.max_output_tokens == 4096
    assert tokens == plan.prompt_estimate + kernel.MIN_SHRUNK_OUTPUT_TOKENS
    assert (
        cost
        < Decimal("0.026")
        < config.model.pricing.cost(
            input_tokens=plan.prompt_estimate, cached_input_tokens=0, output_tokens=4096
        )
    )


def test_a_run_whose_own_allowance_is_smaller_asks_for_that() -> None:
    config = admit({"budget": {"maxTokens": 150}})
    tokens, _ = admission.first_call_need(config, tools=[])
    assert tokens <= 150


@pytest.mark.parametrize(
    ("pricing", "budget", "tenant_cost", "refused"),
    [
        ({}, {}, True, "AgentTenant 't' spec.budget.costUSD"),
        ({}, {"maxCostUSD": "1"}, False, "spec.budget.maxCostUSD 1"),
        ({}, {}, False, None),  # no cost budget applies: a free model is fine
        ({"free": True}, {"maxCostUSD": "1"}, True, None),
        ({"inputPerMillionUSD": "1", "outputPerMillionUSD": "1"}, {}, True, None),
        ({"inputPerMillionUSD": "1"}, {"maxCostUSD": "1"}, False, "spec.budget.maxCostUSD 1"),
        ({"outputPerMillionUSD": "1"}, {}, True, "AgentTenant 't' spec.budget.costUSD"),
        ({"inputPerMillionUSD": "1"}, {}, False, None),
    ],
    ids=[
        "tenant-cost",
        "run-cost",
        "no-cost-budget",
        "declared-free",
        "priced",
        "output-free",
        "input-free",
        "partly-no-cost-budget",
    ],
)
def test_an_unpriced_model_is_refused_where_a_cost_budget_applies(
    pricing: dict[str, Any], budget: dict[str, Any], tenant_cost: bool, refused: str | None
) -> None:
    model = {"spec": {"baseURL": "http://m/v1", "model": "gpt", "pricing": pricing}}
    spec = AgentRunSpec.of({"model": "m", "goal": "g", "budget": budget})
    if refused is None:
        admission.check_metered("m", model, spec=spec, tenant="t", tenant_cost=tenant_cost)
        return
    with pytest.raises(SpecError) as caught:
        admission.check_metered("m", model, spec=spec, tenant="t", tenant_cost=tenant_cost)
    message = str(caught.value)
    lacks = {"inputPerMillionUSD", "outputPerMillionUSD"} - set(pricing)
    said = "no prices" if len(lacks) > 1 else f"no pricing.{lacks.pop()}"
    assert message.startswith(f"spec.model: AgentModel 'm' has {said},") and refused in message
    assert "pricing.free: true" in message


def test_a_model_whose_cached_price_is_above_its_input_price_refuses_every_run() -> None:
    """A hold prices a prompt at the input price: a dearer cached price (a cache-write premium
    put there) is refused naming the field, whatever the run's budget."""
    pricing = {
        "inputPerMillionUSD": "1",
        "cachedInputPerMillionUSD": "1.25",
        "outputPerMillionUSD": "2",
    }
    model = {"spec": {"baseURL": "http://m/v1", "model": "gpt", "pricing": pricing}}
    spec = AgentRunSpec.of({"model": "m", "goal": "g"})
    with pytest.raises(
        SpecError, match=r"cachedInputPerMillionUSD 1\.25 is above inputPerMillionUSD 1"
    ):
        admission.check_metered("m", model, spec=spec, tenant="t", tenant_cost=False)
    pricing["cachedInputPerMillionUSD"] = "1"
    admission.check_metered("m", model, spec=spec, tenant="t", tenant_cost=False)


OUTPUT_PROBLEMS: list[Any] = [
    pytest.param(
        {"description": "x" * 1_200_000},
        "1200018 bytes as JSON, over the 65536-byte limit",
        id="1.2MB",
    ),
    pytest.param(
        {"properties": {"sku": {"pattern": "(?<=x)y"}}},
        "at /properties/sku/pattern: '(?<=x)y' is not a regular expression the linear-time "
        "engine accepts (RE2 syntax: no backreferences or lookaround): invalid perl operator: (?<=",
        id="lookbehind",
    ),
    pytest.param(
        {"type": "objekt"},
        "at $.type: 'objekt' is not valid under any of the given schemas",
        id="invalid",
    ),
]


@pytest.mark.parametrize(("schema", "problem"), OUTPUT_PROBLEMS)
def test_an_output_schema_admission_cannot_use_is_named(
    schema: dict[str, Any], problem: str
) -> None:
    assert schemas.known_problem(schema) == problem
    assert schemas.known_problem({"type": "object"}) is None


def test_a_config_the_event_stream_cannot_hold_names_its_largest_part() -> None:
    config = admit({"output": {"schema": {"description": "x" * 2_000_000}}})
    assert too_large_to_checkpoint(config, cap=1_048_576) == (
        "spec.output.schema: 2000018 bytes; the run's admitted event, which checkpoints its "
        "spec, is over the 1048576 bytes one event on the bus may hold: shorten it"
    )


def test_usage_status_counts_calls_not_run_apart_from_failures() -> None:
    summary = kernel.RunSummary(
        kernel.Phase.TOOL_BUDGET_EXHAUSTED, tool_calls=3, tool_failures=0, tool_calls_not_run=3
    )
    usage = status.usage_status(summary, wall_seconds=1.0)
    assert (usage["toolCalls"], usage["toolFailures"], usage["toolCallsNotRun"]) == (3, 0, 3)
