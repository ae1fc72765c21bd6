"""Budgets spent on work: runs of a tenant whose budget is nearly all held by sibling runs'
calls in flight wait for those holds to settle instead of failing; a run ends
``tenant_budget_exhausted`` only when what is committed plus its own worst case exceeds the
limit. The scenario: 40 Collatz runs (maxSteps 50) of a tenant with costUSD 0.25,
whenExhausted Fail and maxConcurrentRuns 40, three workers, the demo's mock model and prices."""

from __future__ import annotations

import copy
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun_dev import components, demo, stack

from .conftest import E2EStack
from .events import settled_book
from .test_tenants import TenantFactory, append_scenario, tenants, wait_runs  # noqa: F401

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
RUNS = 40
LIMIT = Decimal("0.25")
MIN_UTILISATION = Decimal("0.90")


def collatz_scenario() -> dict[str, Any]:
    """The demo's Collatz scenario (one calculate call a turn, for ever)."""
    scenarios = yaml.safe_load((REPO / "examples" / "scenarios.yaml").read_text())["scenarios"]
    found: dict[str, Any] = next(s for s in scenarios if s["name"] == "collatz")
    return found


def collatz_runs(model: str, count: int) -> dict[str, Any]:
    """``count`` copies of the Collatz example with ``maxSteps: 50``, as one kubectl List."""
    example = yaml.safe_load((REPO / "examples" / "collatz.yaml").read_text())
    items = []
    for index in range(count):
        run = copy.deepcopy(example)
        run["metadata"] = {"name": f"collatz-{index:02d}"}
        run["spec"]["model"] = model
        run["spec"]["budget"]["maxSteps"] = 50
        items.append(run)
    return {"apiVersion": "v1", "kind": "List", "items": items}


def test_forty_collatz_runs_spend_the_tenant_budget_on_work_with_no_overspend(
    stack_: E2EStack,
    test_namespace: str,
    tenants: TenantFactory,  # noqa: F811
    nats_server: Any,
) -> None:
    model = demo.mock_model(stack_.mock_url)
    model["metadata"]["name"] = "mock-demo"
    stack_.kubectl("apply", "-f", "-", input=yaml.safe_dump(model))
    append_scenario(stack_, collatz_scenario())
    tenant = tenants(
        f"t-{test_namespace}",
        [test_namespace],
        budget={"costUSD": str(LIMIT)},
        whenExhausted="Fail",
        maxConcurrentRuns=RUNS,
    )
    third = stack.start_worker(3, env=stack_.env, launch=stack_.launch)
    try:
        stack_.kubectl(
            "apply",
            "-n",
            test_namespace,
            "-f",
            "-",
            input=yaml.safe_dump(collatz_runs("mock-demo", RUNS)),
        )
        runs = wait_runs(
            stack_,
            test_namespace,
            lambda r: len(r) == RUNS and all(s.get("terminalReason") for s in r.values()),
            timeout=240,
        )
    finally:
        components.stop_component(third)
    book = settled_book(nats_server, tenant)
    reasons = {s["terminalReason"] for s in runs.values()}
    assert reasons <= {"max_steps", "tenant_budget_exhausted"}, reasons
    usage = {name: s.get("usage") or {} for name, s in runs.items()}
    spent = sum((Decimal(u.get("costUSD", "0")) for u in usage.values()), Decimal(0))
    assert book.used_cost == spent + book.abandoned_cost  # exact: every call charged once
    assert book.used_cost <= LIMIT  # zero overspend
    utilisation = book.used_cost / LIMIT
    ended = [s for s in runs.values() if s["terminalReason"] == "tenant_budget_exhausted"]
    print(
        f"\nbudget use: used {book.used_cost} of {LIMIT} USD, utilisation {utilisation:.1%}; "
        f"{len(ended)} of {RUNS} runs ended tenant_budget_exhausted, steps per run "
        f"{sorted(u.get('steps', 0) for u in usage.values())}"
    )
    assert utilisation >= MIN_UTILISATION, json.dumps([s.get("message") for s in ended][:5])
    for status in ended:  # only on what is committed, never on siblings' holds
        assert "reserved" not in status["message"] and "held" not in status["message"]
