"""The vitals read off the operator's run views: the phase gauge's counts and the run span."""

from __future__ import annotations

import dataclasses
from decimal import Decimal

import pytest

from agentrun import kernel
from agentrun.operator.runs import views


def view(tenant: str, phase: kernel.Phase | None, *, uid: str = "u") -> views.RunView:
    summary = None
    if phase is not None:
        summary = dataclasses.replace(kernel.initial_state(goal="g"), phase=phase).summary()
    return views.RunView("ns", "run", uid, tenant, 100.0, 10.0, summary=summary, model="m")


def test_phase_counts_take_live_runs_by_phase_and_queued_runs_per_tenant() -> None:
    live = [
        view("a", None, uid="1"),  # admitted, no event yet: Running
        view("a", kernel.Phase.RUNNING, uid="2"),
        view("a", kernel.Phase.AWAITING_APPROVAL, uid="3"),
        view("b", kernel.Phase.COMPLETED, uid="4"),  # ended: not counted
    ]
    counts = views.phase_counts(live, {"a": 2, "b": 0, "c": 1})
    assert dict(counts) == {
        ("a", "Running"): 2,
        ("a", "AwaitingApproval"): 1,
        ("a", "Queued"): 2,
        ("c", "Queued"): 1,
    }


@pytest.mark.parametrize(
    ("phase", "error_type"),
    [(kernel.Phase.COMPLETED, None), (kernel.Phase.MAX_STEPS, "max_steps")],
    ids=["completed-has-no-error", "capped-names-its-reason"],
)
def test_the_run_span_carries_the_vitals_and_an_error_type_unless_completed(
    phase: kernel.Phase, error_type: str | None
) -> None:
    state = dataclasses.replace(
        kernel.initial_state(goal="g"),
        phase=phase,
        steps=3,
        usage=kernel.Usage(input_tokens=90, output_tokens=10, cost_usd=Decimal("0.5")),
    )
    span = views.run_span(view("a", phase), state.summary(), end=12.5)
    assert (span.start, span.end, span.error_type) == (10.0, 12.5, error_type)
    assert span.vitals["agentrun.steps"] == 3
    assert span.vitals["gen_ai.usage.input_tokens"] == 90
    assert span.vitals["agentrun.terminal_reason"] == phase.value


def test_a_run_that_has_not_ended_has_no_run_span() -> None:
    running = kernel.initial_state(goal="g").summary()
    with pytest.raises(AssertionError, match="only an ended run"):
        views.run_span(view("a", kernel.Phase.RUNNING), running, end=1.0)
