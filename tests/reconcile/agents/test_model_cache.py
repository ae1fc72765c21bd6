"""The operator's AgentModel cache: found models are kept for a while, missing ones are not."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest
from kube_support import FakeKube

from agentrun.operator.agents import models
from agentrun.operator.platform.kubeapi import ApiError, Ref


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Models(FakeKube):
    """The API server port holding AgentModels (``models``: name → object), counting reads;
    ``slow``: reads wait for it to be set."""

    def __init__(self) -> None:
        super().__init__()
        self.models: dict[str, Any] = {}
        self.gets = 0
        self.slow: asyncio.Event | None = None

    async def get(self, ref: Ref) -> dict[str, Any] | None:
        assert ref.plural == "agentmodels" and not ref.namespace
        self._called("get", ref)
        self.gets += 1
        if self.slow is not None:
            await self.slow.wait()
        model: dict[str, Any] | None = self.models.get(ref.name)
        return model


@pytest.fixture
def lookups() -> Models:
    """What the API server holds (name → AgentModel) and how often it was asked."""
    return Models()


async def test_a_model_created_after_a_miss_is_found_at_once(lookups: Models) -> None:
    cache = models.ModelCache(lookups, clock=Clock())
    assert await cache.get("mock") is None
    lookups.models["mock"] = {"metadata": {"name": "mock"}}
    assert await cache.get("mock") == {"metadata": {"name": "mock"}}


async def test_a_found_model_is_read_once_per_cache_period(lookups: Models) -> None:
    clock = Clock()
    cache = models.ModelCache(lookups, clock=clock)
    lookups.models["mock"] = {"metadata": {"name": "mock"}}
    await cache.get("mock")
    await cache.get("mock")
    assert lookups.gets == 1
    clock.now += models.MODEL_CACHE_SECONDS + 1
    await cache.get("mock")
    assert lookups.gets == 2


async def test_concurrent_admissions_read_a_model_once(lookups: Models) -> None:
    lookups.models["mock"] = {"metadata": {"name": "mock"}}
    release = lookups.slow = asyncio.Event()
    cache = models.ModelCache(lookups, clock=Clock())
    waiting = [asyncio.create_task(cache.get("mock")) for _ in range(20)]
    await asyncio.sleep(0)
    release.set()
    assert await asyncio.gather(*waiting) == [{"metadata": {"name": "mock"}}] * 20
    assert lookups.gets == 1


async def test_a_missing_model_is_read_again_after_a_concurrent_miss(
    lookups: Models,
) -> None:
    cache = models.ModelCache(lookups, clock=Clock())
    assert await asyncio.gather(cache.get("mock"), cache.get("mock")) == [None, None]
    assert lookups.gets == 1
    lookups.models["mock"] = {"metadata": {"name": "mock"}}
    assert await cache.get("mock") == {"metadata": {"name": "mock"}}
    assert lookups.gets == 2


async def test_a_failed_read_fails_every_waiter_and_is_tried_again(lookups: Models) -> None:
    lookups.fail("get", 500)
    lookups.fail("get", 500)
    cache = models.ModelCache(lookups, clock=Clock())
    results = await asyncio.gather(cache.get("mock"), cache.get("mock"), return_exceptions=True)
    assert all(isinstance(r, ApiError) and r.status == 500 for r in results)
    with pytest.raises(ApiError):
        await cache.get("mock")
    assert len([call for call in lookups.calls if call[0] == "get"]) == 2


async def test_a_failed_read_whose_callers_were_cancelled_is_not_reported_unretrieved(
    lookups: Models,
) -> None:
    """The read is shared by the callers of one name; one that fails after every caller was
    cancelled (an admission's timeout) has its error retrieved all the same: asyncio reports
    no "Future exception was never retrieved", and the next ``get`` reads again."""
    loop = asyncio.get_running_loop()
    unretrieved: list[object] = []
    handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: unretrieved.append(context))
    lookups.slow = asyncio.Event()
    failing = [True]
    read = lookups.get

    async def get(ref: Ref) -> dict[str, Any] | None:
        found = await read(ref)
        if failing[0]:
            raise ApiError(503, "the API server is away")
        return found

    lookups.get = get  # type: ignore[method-assign]
    cache = models.ModelCache(lookups, clock=Clock())
    try:
        caller = asyncio.create_task(cache.get("mock"))
        await asyncio.sleep(0.01)
        caller.cancel()
        lookups.slow.set()
        for _ in range(5):
            await asyncio.sleep(0)
        del caller
        gc.collect()
        failing[0] = False
        lookups.models["mock"] = {"metadata": {"name": "mock"}}
        assert await cache.get("mock") == {"metadata": {"name": "mock"}}
    finally:
        loop.set_exception_handler(handler)
    assert unretrieved == []
