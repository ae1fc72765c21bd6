"""An in-process loop driver: the worker's turn code and the kernel, against the scripted
model server over real HTTP with the real ``openai`` client; no NATS, no Kubernetes.

It folds ``execute_turn`` + ``kernel.advance`` exactly as the consumer does between commits.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from agentrun import kernel
from agentrun.protocol import ModelConfig, RunConfig
from agentrun.testing import mockllm, scenario
from agentrun.tools import Catalog
from agentrun.worker.model import ModelClient, RetryPolicy
from agentrun.worker.toolrunner import ToolRunSettings
from agentrun.worker.turn import TurnDeps, execute_turn


class NoSecrets:
    async def api_key(self, ref: Any) -> str:
        raise AssertionError("no secret expected")


def config(
    url: str,
    *,
    goal: str,
    tools: tuple[str, ...],
    limits: kernel.Limits | None = None,
    timeout: float = 60,
) -> RunConfig:
    return RunConfig(
        uid="uid-1",
        namespace="ns",
        name="run",
        goal=goal,
        instructions="",
        tools=tools,
        limits=limits or kernel.Limits(),
        model=ModelConfig("mock", url, "scripted", kernel.Pricing(), 32000, 1000),
        deadline=time.time() + timeout,
    )


Approver = Callable[[kernel.RunState], tuple[str, bool]]
"""Given a state awaiting approval, returns (digest, approved) as a reviewer would."""


async def drive(
    scenarios_yaml: str,
    *,
    goal: str,
    catalog: Catalog,
    tools: tuple[str, ...],
    limits: kernel.Limits | None = None,
    tool_settings: ToolRunSettings | None = None,
    timeout: float = 60,
    approver: Approver | None = None,
    budget_for: Callable[[kernel.RunState], Any] | None = None,
) -> tuple[kernel.RunState, list[kernel.TurnRecord], list[Mapping[str, Any]]]:
    """Run a whole loop; returns the final state, the turn records and the model's requests.

    ``budget_for(state)``, when given, is the tenant ledger's hold for each turn (a
    ``ledger.TurnHold`` or a stand-in with its ``reserve`` and ``spend``)."""
    scenarios = scenario.parse_scenarios(scenarios_yaml)
    model = ModelClient(RetryPolicy(max_retries=2))
    records: list[kernel.TurnRecord] = []
    async with mockllm.MockLLM(scenarios) as mock:
        deps = TurnDeps(
            model=model,
            catalog=catalog,
            secrets=NoSecrets(),
            tool_settings=tool_settings or ToolRunSettings(),
        )
        run = config(mock.base_url, goal=goal, tools=tools, limits=limits, timeout=timeout)
        state = kernel.initial_state(goal=goal)
        while not state.phase.is_terminal:
            if state.phase is kernel.Phase.AWAITING_APPROVAL:
                assert approver is not None, "the run waits for an approval nobody gives"
                digest, approved = approver(state)
                state = kernel.resolve_approval(state, digest=digest, approved=approved)
                continue
            budget = budget_for(state) if budget_for is not None else None
            record = await execute_turn(deps, run, state, hold=budget)
            records.append(record)
            state = kernel.advance(state, record, run.limits)
        requests = [r.as_dict() for r in mock.state.requests]
    await model.close()
    return state, records, requests
