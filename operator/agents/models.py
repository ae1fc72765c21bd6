"""AgentModels as admission reads them: a short-lived cache over the API server.

What belongs here: ``ModelCache``, which reads an AgentModel at most once per
``MODEL_CACHE_SECONDS`` (a burst of admissions reads it once; an edited price applies to runs
admitted a few seconds later). What does not: the AgentModel's spec and its ``ModelConfig``
(``spec``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from agentrun import kube

from ..platform.kubeapi import KubeApi, Ref

MODELS = kube.MODELS
"""The plural of ``AgentModel``."""
MODEL_CACHE_SECONDS = 5.0
"""How long an AgentModel read is reused: a burst of admissions reads it once; an edited price
applies to runs admitted a few seconds later."""


class ModelCache:
    """AgentModels by name, each read at most once per ``MODEL_CACHE_SECONDS``.

    Only models found are cached: a model that does not exist is asked for again next time,
    so a run applied together with its AgentModel (or just before it) is not refused for
    the cache's lifetime. Callers asking for a model while it is being read wait for that
    read (a burst of admissions reads it once, not once per run).
    """

    def __init__(self, api: KubeApi, *, clock: Callable[[], float] = time.monotonic) -> None:
        """``api``: where AgentModels are read; ``clock`` is monotonic seconds."""
        self._api = api
        self._clock = clock
        self._models: dict[str, tuple[float, dict[str, Any]]] = {}
        self._reading: dict[str, asyncio.Future[dict[str, Any] | None]] = {}

    async def get(self, name: str) -> dict[str, Any] | None:
        """The AgentModel object or ``None`` if it does not exist; raises ``ApiError``."""
        cached = self._models.get(name)
        if cached is not None and cached[0] > self._clock():
            return cached[1]
        reading = self._reading.get(name)
        if reading is None:
            reading = asyncio.ensure_future(self._read(name))
            self._reading[name] = reading
            reading.add_done_callback(lambda _: self._reading.pop(name, None))
        return await asyncio.shield(reading)

    def put(self, name: str, model: dict[str, Any] | None) -> None:
        """What a watch saw of AgentModel ``name`` (``None``: deleted), so a change (new
        prices, ``pricing.free``) applies to the next admission, not after the cache's
        lifetime."""
        if model is None:
            self._models.pop(name, None)
        else:
            self._models[name] = (self._clock() + MODEL_CACHE_SECONDS, model)

    async def _read(self, name: str) -> dict[str, Any] | None:
        now = self._clock()
        model = await self._api.get(Ref(MODELS, name))
        if model is None:
            self._models.pop(name, None)
        else:
            self._models[name] = (now + MODEL_CACHE_SECONDS, model)
        return model
