"""The operator's AgentModel cache: found models are kept for a while, missing ones are not."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

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


async def test_concurrent_admissions_read_a_model_once(
    lookups: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    lookups["models"]["mock"] = {"metadata": {"name": "mock"}}
    release = asyncio.Event()

    async def slow_get(api: Any, name: str) -> dict[str, Any] | None:
        lookups["gets"] += 1
        await release.wait()
        model: dict[str, Any] | None = lookups["models"].get(name)
        return model

    monkeypatch.setattr(tenants, "get_model", slow_get)
    cache = tenants.ModelCache(object(), clock=Clock())  # type: ignore[arg-type]
    waiting = [asyncio.create_task(cache.get("mock")) for _ in range(20)]
    await asyncio.sleep(0)
    release.set()
    assert await asyncio.gather(*waiting) == [{"metadata": {"name": "mock"}}] * 20
    assert lookups["gets"] == 1


async def test_a_missing_model_is_read_again_after_a_concurrent_miss(
    lookups: dict[str, Any],
) -> None:
    cache = tenants.ModelCache(object(), clock=Clock())  # type: ignore[arg-type]
    assert await asyncio.gather(cache.get("mock"), cache.get("mock")) == [None, None]
    assert lookups["gets"] == 1
    lookups["models"]["mock"] = {"metadata": {"name": "mock"}}
    assert await cache.get("mock") == {"metadata": {"name": "mock"}}
    assert lookups["gets"] == 2


async def test_a_failed_read_fails_every_waiter_and_is_tried_again(
    lookups: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def failing(api: Any, name: str) -> dict[str, Any] | None:
        lookups["gets"] += 1
        raise ApiException(status=500, reason="test")

    monkeypatch.setattr(tenants, "get_model", failing)
    cache = tenants.ModelCache(object(), clock=Clock())  # type: ignore[arg-type]
    results = await asyncio.gather(cache.get("mock"), cache.get("mock"), return_exceptions=True)
    assert all(isinstance(r, ApiException) for r in results)
    with pytest.raises(ApiException):
        await cache.get("mock")
    assert lookups["gets"] == 2
