"""A run's output schema is checked on the operator's check threads in its tenant's turn: a
namespace whose runs bring many new costly schemas does not hold another's admission behind
all of them (it did on the event loop's shared thread pool, first come, first served)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from kube_support import FakeKube

from agentrun import kube
from agentrun.kernel import schemas
from agentrun.operator.admission.lookup import RunConfigs
from agentrun.operator.agents.models import ModelCache
from agentrun.operator.platform.fairwork import FairWork
from agentrun.operator.runs import RunKey
from agentrun.operator.tenants.policy import TenantPolicy
from agentrun.operator.toolservers.store import ToolServerCache
from agentrun_dev import demo

CHECK_SECONDS = 0.1
"""What each of the noisy namespace's schemas costs to check (a sleep: the order is tested,
not the interpreter's lock)."""


def slow_for_noisy(schema: Any) -> str | None:
    if schema.get("title", "").startswith("noisy"):
        time.sleep(CHECK_SECONDS)
    return None


async def test_another_namespaces_run_is_checked_next_not_after_a_flood(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(schemas, "known_problem", slow_for_noisy)
    api = FakeKube()
    api.put(kube.MODELS, demo.mock_model("http://127.0.0.1:9/v1"))
    configs = RunConfigs(
        ModelCache(api),
        known_tools={"calculate": False},
        tool_specs=lambda names: [],
        servers=ToolServerCache(api),
        checks=FairWork(party=lambda namespace: namespace),
    )
    policy = TenantPolicy.of(demo.default_tenant())

    async def build(namespace: str, index: int) -> float:
        spec = {
            "model": demo.MODEL_NAME,
            "goal": "add",
            "output": {"schema": {"type": "object", "title": f"{namespace}-{index}"}},
        }
        run = RunKey(namespace, f"r{index}", f"uid-{namespace}-{index}")
        await configs.build_config(run, spec, policy, start_time=0.0)
        return time.monotonic()

    flood = [asyncio.create_task(build("noisy", i)) for i in range(60)]
    await asyncio.sleep(0.05)  # the flood is queued
    started = time.monotonic()
    quiet_done = await build("quiet", 0)
    # two checks were running and one of the flood's was queued first: at most three slow
    # checks come before it (60 of them at 0.1 s over the shared pool's 6 threads took 1 s)
    assert quiet_done - started < 4 * CHECK_SECONDS
    done = await asyncio.gather(*flood)
    assert max(done) - started > 2 * CHECK_SECONDS * 10  # the flood still waits its own turns
