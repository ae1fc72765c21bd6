"""AgentModels as admission reads them: a short-lived cache over the API server.

What belongs here: ``ModelCache``, which reads an AgentModel at most once per
``MODEL_CACHE_SECONDS`` (a burst of admissions reads it once; an edited price applies to runs
admitted a few seconds later). What does not: the AgentModel's spec and its ``ModelConfig``
(``spec``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import cachetools

from agentrun import kube

from ..platform.kubeapi import KubeApi, Ref

MODELS = kube.MODELS
"""The plural of ``AgentModel``."""
MODEL_CACHE_SECONDS = 5.0
"""How long an AgentModel read is reused: a burst of admissions reads it once; an edited price
applies to runs admitted a few seconds later."""
MODEL_CACHE_SIZE = 4096
"""The most AgentModels cached at once (the least recently used forgotten first)."""
MISSING_SECONDS = 2.0
"""How long a model found missing is taken as missing by the callers that accept it
(``get(..., recent_miss=True)``: the queued runs waiting for it, each pass of their queue):
runs waiting for a deleted AgentModel cost one read of it per ``MISSING_SECONDS``, not one
per run and pass. Its creation seen by the watch (``put``) ends it at once."""


class ModelCache:
    """AgentModels by name, each read at most once per ``MODEL_CACHE_SECONDS``.

    Only models found are cached for every caller: a model that does not exist is asked for
    again next time, so a run applied together with its AgentModel (or just before it) is
    not refused for the cache's lifetime; a miss is remembered ``MISSING_SECONDS`` for the
    callers that ask for it (``recent_miss``). Callers asking for a model while it is being
    read wait for that read (a burst of admissions reads it once, not once per run).
    """

    def __init__(self, api: KubeApi, *, clock: Callable[[], float] = time.monotonic) -> None:
        """``api``: where AgentModels are read; ``clock`` is monotonic seconds."""
        self._api = api
        self._models: cachetools.TTLCache[str, dict[str, Any]] = cachetools.TTLCache(
            MODEL_CACHE_SIZE, MODEL_CACHE_SECONDS, timer=clock
        )
        """The models found, each until ``MODEL_CACHE_SECONDS`` after it was read or seen."""
        self._missing: cachetools.TTLCache[str, bool] = cachetools.TTLCache(
            MODEL_CACHE_SIZE, MISSING_SECONDS, timer=clock
        )
        """The models found missing, each until ``MISSING_SECONDS`` after it was read."""
        self._reading: dict[str, asyncio.Future[dict[str, Any] | None]] = {}

    async def get(self, name: str, *, recent_miss: bool = False) -> dict[str, Any] | None:
        """The AgentModel object or ``None`` if it does not exist (``recent_miss``: or was
        found missing within ``MISSING_SECONDS`` and not seen made since); raises
        ``ApiError``."""
        with contextlib.suppress(KeyError):  # not cached, or expired (one clock read)
            return self._models[name]
        if recent_miss and self._missing.get(name):
            return None
        reading = self._reading.get(name)
        if reading is None:
            reading = asyncio.ensure_future(self._read(name))
            self._reading[name] = reading
            reading.add_done_callback(lambda done: self._read_ended(name, done))
        return await asyncio.shield(reading)

    def _read_ended(self, name: str, reading: asyncio.Future[dict[str, Any] | None]) -> None:
        """The shared read of ``name`` ended: the next ``get`` reads again if it must. Its
        error is retrieved here: its callers got it, and one whose every caller was cancelled
        meanwhile was reported "Future exception was never retrieved"."""
        self._reading.pop(name, None)
        if not reading.cancelled():
            reading.exception()

    def put(self, name: str, model: dict[str, Any] | None) -> None:
        """What a watch saw of AgentModel ``name`` (``None``: deleted), so a change (new
        prices, ``pricing.free``) applies to the next admission, not after the cache's
        lifetime."""
        if model is None:
            with contextlib.suppress(KeyError):  # not cached (or expired: dropped all the same)
                del self._models[name]
        else:
            self._models[name] = model
            self._missing.pop(name, None)

    async def _read(self, name: str) -> dict[str, Any] | None:
        model = await self._api.get(Ref(MODELS, name))
        self.put(name, model)
        if model is None:
            self._missing[name] = True
        return model
