"""The operator's AgentModel cache: found models are kept for a while, missing ones are not."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun.operator import tenants


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What the API server holds (name → AgentModel) and how often it was asked."""
    state: dict[str, Any] = {"models": {}, "gets": 0}

    async def get_model(api: Any, name: str) -> dict[str, Any] | None:
        state["gets"] += 1
        model: dict[str, Any] | None = state["models"].get(name)
        return model

    monkeypatch.setattr(tenants, "get_model", get_model)
    return state


async def test_a_model_created_after_a_miss_is_found_at_once(lookups: dict[str, Any]) -> None:
    cache = tenants.ModelCache(object(), clock=Clock())  # type: ignore[arg-type]
    assert await cache.get("mock") is None
    lookups["models"]["mock"] = {"metadata": {"name": "mock"}}
    assert await cache.get("mock") == {"metadata": {"name": "mock"}}


async def test_a_found_model_is_read_once_per_cache_period(lookups: dict[str, Any]) -> None:
    clock = Clock()
    cache = tenants.ModelCache(object(), clock=clock)  # type: ignore[arg-type]
    lookups["models"]["mock"] = {"metadata": {"name": "mock"}}
    await cache.get("mock")
    await cache.get("mock")
    assert lookups["gets"] == 1
    clock.now += tenants.MODEL_CACHE_SECONDS + 1
    await cache.get("mock")
    assert lookups["gets"] == 2
