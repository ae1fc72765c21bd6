"""What a run is admitted with, told to its user: its timeout counts from its admission (the
time its status shows as ``startTime``), however long its admission took after its config was
built, and its ``Admitted`` Event names each cap its tenant's ``spec.runBudget.max`` lowered.
Against the real nats-server's ledger."""

from __future__ import annotations

import time
import uuid
from typing import Any

from nats.aio.client import Client as NATS

from agentrun.operator.platform.spec import ObjectMeta
from agentrun.operator.runs import RunKey, RunObject
from agentrun.operator.runs.spec import RunStatusView
from agentrun.operator.tenants import TenantPolicy
from agentrun.protocol import RunConfig

from .test_poison import make_pump, tenant_object


class Clock:
    """Epoch seconds that move on 7 s each time they are read: a slow admission."""

    def __init__(self) -> None:
        self.now = 1.9e9

    def __call__(self) -> float:
        self.now += 7.0
        return self.now


async def admit(
    client: NATS,
    budget: dict[str, Any],
    *,
    run_budget: dict[str, Any] | None = None,
    agent: bool = False,
) -> tuple[list[tuple[RunConfig, float]], list[dict[str, Any]]]:
    """Admit one run with ``spec.budget`` ``budget`` (``agent``: a run of an Agent, whose
    ``status.resolvedSpec`` has it) in a tenant with ``runBudget`` ``run_budget``: the configs
    started with their start times, and the Events posted."""
    pump, runs, _, tenant = await make_pump(client)
    if run_budget is not None:
        tenant = TenantPolicy.of(tenant_object(tenant.name, runBudget=run_budget))
        pump.deps.tenants.put(tenant_object(tenant.name, runBudget=run_budget))
    pump.clock = Clock()
    started: list[tuple[RunConfig, float]] = []

    async def start_run(config: RunConfig, *, start_time: float, generation: int) -> None:
        started.append((config, start_time))

    runs.start_run = start_run  # type: ignore[method-assign]
    spec = {"model": "mock", "goal": "g", "budget": budget}
    obj = RunObject(metadata=ObjectMeta(generation=1), spec=spec)
    if agent:  # the Agent's budget is in the resolved spec the run executes, not in its own
        written = {"agentRef": {"name": "a"}, "goal": "g"}
        status = RunStatusView.model_validate({"resolvedSpec": spec})
        obj = RunObject(metadata=ObjectMeta(generation=1), spec=written, status=status)
    key = RunKey("ns", "capped", f"capped-{uuid.uuid4().hex[:6]}")
    await pump.enqueue_run(key, tenant, generation=1, created=time.time(), obj=obj)
    await pump.pump_queue(tenant.name)
    await pump.deps.events.drain()
    return started, list(pump.deps.api.events)  # type: ignore[attr-defined]


async def test_a_runs_timeout_counts_from_its_admission_not_from_its_configs_build(
    client: NATS,
) -> None:
    """The config's deadline is its build's clock + 600 s; the run starts at a later read of
    the clock (7 s later), and its deadline is moved with it (it was 593 s after
    ``startTime``)."""
    (started, _) = await admit(client, {})
    ((config, start_time),) = started
    assert abs(config.deadline - start_time - 600.0) < 1e-6


def admitted_message(events: list[dict[str, Any]]) -> str:
    (admitted,) = [e for e in events if e["reason"] == "Admitted"]
    return str(admitted["message"])


async def test_the_admitted_event_names_each_cap_the_tenant_lowered(client: NATS) -> None:
    """``overMax: Clamp``: maxSteps 50 asked, 20 given; the implicit 10m timeout above the
    tenant's 5m; no maxTokens of its own, the tenant's 1000; maxToolCalls asked under its
    cap is not named."""
    run_budget = {
        "max": {"maxSteps": 20, "maxToolCalls": 40, "maxTokens": 1000, "timeout": "5m"},
        "overMax": "Clamp",
    }
    _, events = await admit(client, {"maxSteps": 50, "maxToolCalls": 30}, run_budget=run_budget)
    message = admitted_message(events)
    assert message.endswith(
        "; its spec.runBudget.max capped maxSteps 20 (50 asked), maxTokens 1000 (none by "
        "default), timeout 5m (10m by default)"
    ), message


async def test_the_admitted_event_of_a_run_of_an_agent_names_the_caps_of_its_resolved_spec(
    client: NATS,
) -> None:
    run_budget = {"max": {"maxSteps": 20}, "overMax": "Clamp"}
    _, events = await admit(client, {"maxSteps": 50}, run_budget=run_budget, agent=True)
    message = admitted_message(events)
    assert message.endswith("; its spec.runBudget.max capped maxSteps 20 (50 asked)"), message


async def test_the_admitted_event_of_a_run_under_every_cap_names_none(client: NATS) -> None:
    _, events = await admit(client, {"maxSteps": 5}, run_budget={"max": {"maxSteps": 20}})
    message = admitted_message(events)
    assert "capped" not in message and message.endswith("since creation"), message
