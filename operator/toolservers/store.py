"""AgentToolServers as admission reads them: a short-lived cache over the API server.

What belongs here: ``ToolServerCache`` (each server read at most once per
``SERVER_CACHE_SECONDS``; one not looked at yet is read again soon). What does not: resolving a
run's tools (``resolve``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Any

import cachetools

from ..platform.kubeapi import KubeApi, Ref
from .resolve import is_pending
from .spec import TOOL_SERVERS

SERVER_CACHE_SECONDS = 5.0
"""How long admission reuses an AgentToolServer read (a burst of runs reads it once)."""
SERVER_CACHE_SIZE = 4096
"""The most AgentToolServers cached at once (the least recently used forgotten first)."""


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
        self._cache: cachetools.TTLCache[tuple[str, str], dict[str, Any] | None] = (
            cachetools.TTLCache(SERVER_CACHE_SIZE, SERVER_CACHE_SECONDS, timer=clock)
        )
        """Ready servers and servers not found, each for ``SERVER_CACHE_SECONDS``."""

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The AgentToolServer object or ``None``; raises ``ApiError`` on other errors."""
        with contextlib.suppress(KeyError):  # not cached, or expired (one clock read)
            return self._cache[(namespace, name)]
        found = await self._api.get(Ref(TOOL_SERVERS, name, namespace))
        if found is not None and (is_pending(found) or not _ready(found)):
            # read again next time: a server not ready yet (not looked at, refused, failed)
            # may be discovered any moment, and a run must not be refused on a stale copy
            with contextlib.suppress(KeyError):  # not cached (or expired: dropped all the same)
                del self._cache[(namespace, name)]
        else:
            self._cache[(namespace, name)] = found
        return found
