"""Queued runs cost the operator bounded memory whatever their specs: an output schema of many
objects is refused at admission naming the field, and what the admission caches keep (each
run's last config built, the pump's queued objects) is bounded by weight, not by a count."""

from __future__ import annotations

import asyncio
import gc
import json
import time
import tracemalloc

import pytest
from kube_support import FakeKube

from agentrun import kube
from agentrun.kernel import schemas
from agentrun.operator.admission import lookup
from agentrun.operator.admission.lookup import RunConfigs
from agentrun.operator.agents.models import ModelCache
from agentrun.operator.platform.spec import SpecError
from agentrun.operator.platform.weighed import WeighedCache
from agentrun.operator.runs import RunKey
from agentrun.operator.tenants.policy import TenantPolicy
from agentrun.operator.toolservers.store import ToolServerCache
from agentrun_dev import demo

LIMIT = schemas.MAX_SCHEMA_CONTAINERS


def configs() -> RunConfigs:
    api = FakeKube()
    api.put(kube.MODELS, demo.mock_model("http://127.0.0.1:9/v1"))
    return RunConfigs(
        ModelCache(api),
        known_tools={"calculate": False},
        tool_specs=lambda names: [],
        servers=ToolServerCache(api),
    )


def spec(items: int) -> dict[str, object]:
    """A run whose output schema is ``items`` empty objects in a ``const`` (63 KB of JSON for
    21 000 of them, under the 64 KiB bound; the schema and its array count two more)."""
    schema = {"type": "object", "const": [{} for _ in range(items)]}
    return {"model": demo.MODEL_NAME, "goal": "g", "output": {"schema": schema}}


async def test_an_output_schema_of_too_many_objects_is_refused_naming_the_field() -> None:
    policy = TenantPolicy.of(demo.default_tenant())
    built = configs()
    wire = len(json.dumps(spec(21_000)["output"], separators=(",", ":")))
    assert wire < schemas.MAX_SCHEMA_BYTES
    with pytest.raises(SpecError) as refused:
        await built.build_config(
            RunKey("team-a", "r", "uid-r"), spec(21_000), policy, start_time=time.time()
        )
    assert str(refused.value) == (
        f"spec.output.schema: 21002 JSON objects and arrays, over the limit of {LIMIT}"
    )
    await built.build_config(
        RunKey("team-a", "s", "uid-s"), spec(LIMIT - 2), policy, start_time=time.time()
    )


async def test_queued_runs_configs_kept_are_bounded_by_weight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Runs at the bound each weigh about 0.7 MB parsed: the cache keeps what its weight
    allows and forgets the least recently built, however many runs are queued."""
    monkeypatch.setattr(lookup, "BUILT_MEMORY", 3_000_000)
    built = configs()
    policy = TenantPolicy.of(demo.default_tenant())
    gc.collect()
    tracemalloc.start()
    for i in range(12):
        key = RunKey("team-a", f"r{i}", f"uid-{i}")
        await built.build_config(key, spec(LIMIT - 2), policy, start_time=time.time())
    await asyncio.sleep(0)
    gc.collect()
    retained = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert retained < 2 * lookup.BUILT_MEMORY, f"{retained / 1e6:.1f} MB kept"
    assert 0 < len(built._built) < 12


async def test_a_config_kept_is_reused_without_a_copy_of_its_spec() -> None:
    """What a queued run's entry keeps is its config and a digest of its spec: a run whose
    spec is at the bound costs about one parsed copy of it, not two or three."""
    built = configs()
    policy = TenantPolicy.of(demo.default_tenant())
    key = RunKey("team-a", "r", "uid-r")
    weight = schemas.footprint(spec(LIMIT - 2))
    gc.collect()
    tracemalloc.start()
    first = await built.build_config(key, spec(LIMIT - 2), policy, start_time=1.0)
    gc.collect()
    retained = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert retained < 1.5 * weight, f"{retained / 1e6:.1f} MB kept for {weight / 1e6:.1f} MB"
    again = await built.build_config(key, spec(LIMIT - 2), policy, start_time=2.0)
    assert again.output_schema is first.output_schema  # reused, not built anew
    assert again.deadline == first.deadline + 1.0


def test_a_weighed_cache_forgets_the_least_recent_and_keeps_nothing_heavier_than_it() -> None:
    cache: WeighedCache[str, str] = WeighedCache(10, len)
    cache["a"] = "xxxx"
    cache["b"] = "xxxx"
    assert cache.get("a") == "xxxx"
    cache["c"] = "xxxx"  # over 10: "b", the least recently used, goes
    assert sorted(cache) == ["a", "c"]
    cache["a"] = "x" * 11  # heavier than the whole cache: not kept, nor the earlier value
    assert sorted(cache) == ["c"]
