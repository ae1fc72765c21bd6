"""An object a queued run names (its AgentModel, an AgentToolServer) deleted while the run
waits: the run waits for it to be made again (``Admitted=False``, reason
``ReferenceMissing``) without holding up the runs queued behind it, and is admitted once it
is back; a GitOps tool replacing the object (delete, then create) loses no queued run. A new
run naming a missing object is still rejected at once, naming the field. Waiting runs cost
one read of the missing AgentModel per ``MISSING_SECONDS``, not one per run and pass. The
pump against the real nats-server's ledger, the real tenant registry and the real
``RunConfigs`` over a fake API server."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kube_support import FakeKube
from nats.aio.client import Client as NATS

from agentrun import kube
from agentrun.operator.admission.lookup import RunConfigs
from agentrun.operator.agents import models
from agentrun.operator.agents.models import ModelCache
from agentrun.operator.platform.spec import ObjectMeta, ReferenceMissing, SpecError
from agentrun.operator.runs import RunKey, RunObject
from agentrun.operator.toolservers import resolve
from agentrun.operator.toolservers.store import ToolServerCache
from agentrun_dev import demo

from .test_rebinding import World, tenant

OTHER = "other-model"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def model_gets(api: FakeKube, name: str) -> int:
    return sum(1 for verb, ref in api.calls if verb == "get" and ref.name == name)


async def world_with_models(client: NATS) -> tuple[World, ModelCache, Clock]:
    """Tenant ``a`` (two runs at a time) binding ``ns``; AgentModels ``mock`` and ``other``."""
    world = World(client, tenant("a", namespaces=["ns"], maxConcurrentRuns=2))
    mock = demo.mock_model("http://127.0.0.1:9/v1")
    other = copy.deepcopy(mock)
    other["metadata"]["name"] = OTHER
    world.api.put(kube.MODELS, mock)
    world.api.put(kube.MODELS, other)
    clock = Clock()
    cache = ModelCache(world.api, clock=clock)
    world.configs = RunConfigs(
        cache,
        known_tools={"calculate": False},
        tool_specs=lambda names: [],
        servers=ToolServerCache(world.api, clock=clock),
    )
    await world.start()
    return world, cache, clock


async def enqueue(world: World, name: str, model: str, *, created: float) -> None:
    obj = RunObject(metadata=ObjectMeta(generation=1), spec={"model": model, "goal": "g"})
    key = RunKey("ns", name, f"{name}-{world.tag}")
    policy = world.tenants.policies[world.name("a")]
    await world.pump.enqueue_run(key, policy, generation=1, created=created, obj=obj)


def delete_model(world: World, cache: ModelCache, name: str) -> dict[str, Any]:
    """Delete AgentModel ``name`` as the API server and the operator's watch see it."""
    found = world.api.objects.pop((kube.MODELS, "", name))
    cache.put(name, None)
    return found


async def test_a_queued_run_whose_agentmodel_is_deleted_waits_for_it_and_holds_no_one_up(
    client: NATS,
) -> None:
    world, cache, clock = await world_with_models(client)
    model = delete_model(world, cache, demo.MODEL_NAME)
    await enqueue(world, "r1", demo.MODEL_NAME, created=1e9)
    await enqueue(world, "r2", OTHER, created=1e9 + 1)
    await world.pump.pump_queue(world.name("a"))
    assert world.runs.started == ["r2"] and await world.queued("a") == ["r1"]
    body = world.runs.bodies["r1"]
    assert "terminalReason" not in body
    (admitted,) = body["conditions"]
    assert (admitted["status"], admitted["reason"]) == ("False", "ReferenceMissing")
    assert f"spec.model: AgentModel '{demo.MODEL_NAME}' not found" in admitted["message"]

    reads = model_gets(world.api, demo.MODEL_NAME)
    for _ in range(3):  # passes within MISSING_SECONDS read the missing model no more
        await world.pump.pump_queue(world.name("a"))
    assert model_gets(world.api, demo.MODEL_NAME) == reads
    clock.now += models.MISSING_SECONDS
    await world.pump.pump_queue(world.name("a"))
    assert model_gets(world.api, demo.MODEL_NAME) == reads + 1
    assert await world.queued("a") == ["r1"]

    world.api.put(kube.MODELS, model)  # applied again; the watch tells the cache at once
    cache.put(demo.MODEL_NAME, model)
    await world.pump.pump_queue(world.name("a"))
    assert world.runs.started == ["r2", "r1"] and await world.queued("a") == []
    assert await world.charged("a") == ["r1", "r2"]


async def test_a_new_run_naming_a_missing_agentmodel_is_still_rejected_naming_the_field(
    client: NATS,
) -> None:
    world, cache, _ = await world_with_models(client)
    delete_model(world, cache, demo.MODEL_NAME)
    policy = world.tenants.policies[world.name("a")]
    with pytest.raises(ReferenceMissing, match=r"^spec\.model: AgentModel 'mock' not found"):
        await world.configs.build_config(
            RunKey("ns", "new", "uid-new"), {"model": "mock", "goal": "g"}, policy, start_time=0
        )


async def test_a_model_found_missing_is_taken_as_missing_only_by_who_asks_and_until_made() -> None:
    api, clock = FakeKube(), Clock()
    cache = ModelCache(api, clock=clock)
    assert await cache.get("m") is None
    assert await cache.get("m", recent_miss=True) is None
    assert model_gets(api, "m") == 1  # the queued runs' look took the recent miss
    assert await cache.get("m") is None  # a new run's look reads it again
    assert model_gets(api, "m") == 2
    made = api.put(
        kube.MODELS, {**demo.mock_model("http://127.0.0.1:9/v1"), "metadata": {"name": "m"}}
    )
    cache.put("m", made)  # the watch saw it made: no caller takes the miss any more
    assert await cache.get("m", recent_miss=True) == made
    cache.put("m", None)
    assert await cache.get("m", recent_miss=True) == made  # read again: the API server has it
    assert model_gets(api, "m") == 3


def test_a_tool_server_that_does_not_exist_is_a_missing_reference_naming_the_field() -> None:
    with pytest.raises(ReferenceMissing) as missing:
        resolve.resolve_tool("fs/read", None, namespace="ns", rules=(), tenant="t")
    assert isinstance(missing.value, SpecError)  # a new run naming it is rejected as before
    assert str(missing.value).startswith("spec.tools: fs/read: AgentToolServer 'fs' not found")


async def test_a_resumed_queued_run_whose_agentmodel_is_missing_waits_a_new_one_is_rejected(
    client: NATS,
) -> None:
    """After an operator restart kopf resumes every queued run through the create handler:
    one its queue holds waits there for its AgentModel; a run the queue does not hold is
    rejected as a new run naming a missing model."""
    world, cache, _ = await world_with_models(client)
    delete_model(world, cache, demo.MODEL_NAME)
    await enqueue(world, "r1", demo.MODEL_NAME, created=1e9)
    await world.pump.pump_queue(world.name("a"))
    await world.start()  # a new process: the queue read again from the ledger
    status = {"tenant": world.name("a"), "phase": "Queued"}
    for name in ("r1", "r9"):
        await world.resume(name, status, model=demo.MODEL_NAME)
    assert "terminalReason" not in world.runs.bodies["r1"]
    assert await world.queued("a") == ["r1"]
    assert world.runs.bodies["r9"]["terminalReason"] == "invalid_spec"
    assert "spec.model: AgentModel 'mock' not found" in world.runs.bodies["r9"]["message"]
