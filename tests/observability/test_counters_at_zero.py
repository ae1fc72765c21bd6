"""Counters exist at 0 from the moment a tenant is known, so alerts fire on the first burst.

The reported case: a new tenant's first five runs all end ``model_error`` (the model answers
401). A counter series created by its first increment has no earlier sample, ``increase()``
over it stays 0 and the chart's alert never fires. Here a fresh operator process learns of an
AgentTenant and then counts those five ends; its two ``/metrics`` expositions (before and after
the burst) become the input of a ``promtool test rules`` run of the chart's real alert rules.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from agentrun import kernel, metrics
from agentrun.protocol import DEFAULT_TENANT, ModelConfig, RunConfig

REASONS = (
    "completed",
    "cancelled",
    "deadline_exceeded",
    "max_steps",
    "tool_budget_exhausted",
    "token_budget_exhausted",
    "cost_budget_exhausted",
    "tenant_budget_exhausted",
    "no_progress",
    "invalid_decision",
    "invalid_output",
    "refused",
    "model_error",
    "tool_unavailable",
    "checkpoint_failed",
    "effect_unknown",
    "invalid_spec",
)
"""The terminal vocabulary as published (docs/architecture.md), written out here: the
expected series must not come from the table the code under test computes."""
RUN_ENDS = {("completed", "ok")} | {
    (reason, outcome) for reason in REASONS[1:] for outcome in ("none", "partial")
}
"""Only ``completed`` is ``ok``; every other end is ``partial`` after work, ``none`` without."""
RULES_FILE = Path(__file__).parents[2] / "charts" / "agentrun" / "alerts" / "agentrun.rules.yaml"
SEPARATOR = "--- after the burst ---"

FRESH_OPERATOR = textwrap.dedent(
    f"""
    import sys
    from prometheus_client import generate_latest
    from agentrun import kernel, metrics
    from agentrun.operator.tenants.registry import Tenants

    tenants = Tenants(None)  # as the wiring makes it (no selector here: the API is not read)
    tenants.put({{
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentTenant",
        "metadata": {{"name": "fresh", "generation": 1}},
        "spec": {{"namespaces": ["team-fresh"]}},
    }})
    sys.stdout.write(generate_latest().decode())
    sys.stdout.write({SEPARATOR!r} + "\\n")
    for uid in range(5):  # five runs whose first model call is answered 401
        state = kernel.initial_state(goal="g")
        state = kernel.advance(state, kernel.ModelFailed(0, "HTTP 401"), kernel.Limits())
        metrics.record_end(state, tenant="fresh")
    sys.stdout.write(generate_latest().decode())
    """
)


def runs_samples(exposition: str) -> dict[tuple[tuple[str, str], ...], float]:
    """``agentrun_runs_total`` samples by their sorted labels."""
    samples = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == "agentrun_runs_total":
                samples[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


@pytest.fixture(scope="module")
def fresh_process() -> tuple[dict[Any, float], dict[Any, float]]:
    """``agentrun_runs_total`` of a fresh operator process: before and after the burst."""
    done = subprocess.run(
        [sys.executable, "-c", FRESH_OPERATOR],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    before, after = done.stdout.split(SEPARATOR + "\n")
    return runs_samples(before), runs_samples(after)


def test_a_known_tenant_has_every_reason_and_outcome_at_zero_before_any_run(
    fresh_process: tuple[dict[Any, float], dict[Any, float]],
) -> None:
    before, _ = fresh_process
    fresh = {
        (labels["reason"], labels["outcome"]): value
        for labels, value in ((dict(k), v) for k, v in before.items())
        if labels["tenant"] == "fresh"
    }
    assert len(RUN_ENDS) == 33
    assert set(fresh) == RUN_ENDS
    assert set(fresh.values()) == {0.0}
    assert {dict(k)["reason"] for k in before} == set(REASONS)
    assert {dict(k)["tenant"] for k in before} == {"fresh", DEFAULT_TENANT}


def test_the_burst_is_counted_once_on_the_series_that_existed(
    fresh_process: tuple[dict[Any, float], dict[Any, float]],
) -> None:
    before, after = fresh_process
    assert set(after) == set(before)  # no series appeared with the burst
    changed = {dict(k)["reason"] + "/" + dict(k)["outcome"]: v for k, v in after.items() if v}
    assert changed == {"model_error/none": 5.0}


def promtool_series(
    before: dict[Any, float], after: dict[Any, float], *, primed: bool
) -> list[dict[str, str]]:
    """Scrapes every minute: the fresh process's values for 11 minutes, then the burst's for
    20. ``primed=False`` is the lazy exporter: a series is absent until it has counted."""
    series = []
    for labels, value in after.items():
        selector = ",".join(f'{name}="{v}"' for name, v in labels)
        head = f"{before[labels]:g}x10" if primed or value == 0 else "_x10"
        series.append(
            {"series": f"agentrun_runs_total{{{selector},job=\"operator\"}}",
             "values": f"{head} {value:g}x20"}
        )  # fmt: skip
    return series


@pytest.mark.parametrize(
    ("primed", "alerts"),
    [
        pytest.param(
            True,
            [
                {
                    "exp_labels": {"severity": "warning", "tenant": "fresh"},
                    "exp_annotations": {
                        "summary": "Runs of tenant fresh are ending with model_error",
                        "description": "100% of the runs of tenant fresh that ended in the "
                        "last 15 minutes ended model_error: the model endpoint fails after "
                        "retries.",
                        "runbook_url": "https://agentrun.dev/docs/runbooks/"
                        "AgentrunRunsEndingModelError.md",
                    },
                }
            ],
            id="at-0",
        ),
        pytest.param(False, [], id="lazy-series-never-alert"),
    ],
)
def test_the_model_error_alert_fires_on_the_first_burst_after_a_fresh_start(
    fresh_process: tuple[dict[Any, float], dict[Any, float]],
    prometheus_binaries: Any,
    tmp_path: Path,
    primed: bool,
    alerts: list[dict[str, Any]],
) -> None:
    before, after = fresh_process
    tests = {
        "rule_files": [str(RULES_FILE)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": promtool_series(before, after, primed=primed),
                "alert_rule_test": [
                    {"eval_time": "18m", "alertname": "AgentrunRunsEndingModelError",
                     "exp_alerts": alerts}
                ],
            }
        ],
    }  # fmt: skip
    path = tmp_path / "first-burst.test.yaml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    done = subprocess.run(
        [str(prometheus_binaries.promtool), "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{json.dumps(tests)[:2000]}"


MODEL_ERROR_TYPES = (
    "rate_limited",
    "auth",
    "client_error",
    "server_error",
    "timeout",
    "connection",
    "filtered",
    "deadline",
    "credentials",
    "invalid_response",
)
"""Every ``error_type`` of ``agentrun_model_call_errors_total`` (docs/metrics.md)."""


def test_a_worker_creates_its_per_turn_counters_at_zero_on_a_tenant_s_first_turn() -> None:
    config = RunConfig(
        uid="u",
        namespace="ns",
        name="r",
        goal="g",
        instructions="",
        tools=("calculate",),
        limits=kernel.Limits(),
        model=ModelConfig("zero-model", "http://unused.invalid/v1", "m", kernel.Pricing(), 1, 1),
        deadline=0.0,
        tenant="zero-tenant",
    )
    metrics.know_run(config, catalog=("calculate",))
    metrics.know_run(config, catalog=("calculate",))  # again: nothing changes, nothing counted

    def value(name: str, **labels: str) -> float | None:
        return REGISTRY.get_sample_value(name, {"tenant": "zero-tenant", **labels})

    assert value("agentrun_turns_total") == 0
    for kind in ("malformed", "invalid_tool_call", "output_schema", "no_progress_nudge"):
        assert value("agentrun_corrections_total", kind=kind) == 0
    for tool in ("calculate", "unknown"):
        for result in ("ok", "error", "fault", "denied", "not_run"):
            assert value("agentrun_tool_calls_total", tool=tool, result=result) == 0
    for kind in ("input", "cached_input", "output", "reasoning"):
        assert value("agentrun_tokens_total", model="zero-model", type=kind) == 0
    assert value("agentrun_cost_usd_total", model="zero-model") == 0
    assert value("agentrun_usage_estimated_total", model="zero-model") == 0
    assert value("agentrun_budget_overrun_tokens_total", model="zero-model") == 0
    assert value("agentrun_model_calls_total", model="zero-model") == 0
    for error_type in MODEL_ERROR_TYPES:
        assert (
            value("agentrun_model_call_errors_total", model="zero-model", error_type=error_type)
            == 0
        )
