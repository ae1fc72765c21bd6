"""AgentToolServers as admission reads them: a short-lived cache over the API server.

What belongs here: ``ToolServerCache`` (each server read at most once per
``SERVER_CACHE_SECONDS``; one not looked at yet is read again soon). What does not: resolving a
run's tools (``resolve``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from ..platform.kubeapi import KubeApi, Ref
from .resolve import is_pending
from .spec import TOOL_SERVERS

SERVER_CACHE_SECONDS = 5.0
"""How long admission reuses an AgentToolServer read (a burst of runs reads it once)."""


def _ready(server: Mapping[str, Any]) -> bool:
    """Whether the server's ``Ready`` condition is ``True`` (its tools discovered)."""
    conditions = (server.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


class ToolServerCache:
    """AgentToolServers by (namespace, name), each ready one read at most once per
    ``SERVER_CACHE_SECONDS`` (one not ready is read every time: it may be ready any moment)."""

    def __init__(self, api: KubeApi, *, clock: Callable[[], float] = time.monotonic) -> None:
        """``api``: where AgentToolServers are read; ``clock``: monotonic seconds."""
        self._api = api
        self._clock = clock
        self._cache: dict[tuple[str, str], tuple[float, dict[str, Any] | None]] = {}

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The AgentToolServer object or ``None``; raises ``ApiError`` on other errors."""
        now = self._clock()
        hit = self._cache.get((namespace, name))
        if hit is not None and hit[0] > now:
            return hit[1]
        found = await self._api.get(Ref(TOOL_SERVERS, name, namespace))
        if found is not None and (is_pending(found) or not _ready(found)):
            # read again next time: a server not ready yet (not looked at, refused, failed)
            # may be discovered any moment, and a run must not be refused on a stale copy
            self._cache.pop((namespace, name), None)
        else:
            self._cache[(namespace, name)] = (now + SERVER_CACHE_SECONDS, found)
        return found
