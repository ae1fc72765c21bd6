"""Discovering AgentToolServers' tools in the background and writing their ``.status``.

``ToolServerRefresher`` runs one discovery task per server (talking to the MCP server through
``agentrun.tools.remote``), each bounded by the server's own discovery timeout (a hard bound:
connect, handshake and every page), so a server that hangs delays nothing but its own status.
A failed refresh keeps the last good list (runs keep being admitted with it) and says so in the
condition. The operator's kopf handlers only tell the refresher about objects
(``observe``/``forget``); no finalizer is involved, so deleting an AgentToolServer never waits
for the operator.

What does not belong here: the spec's shape (``spec``), the status bodies (``status``) and
resolving a run's ``SERVER/TOOL`` names at admission (``resolve``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from agentrun import kernel
from agentrun.tools import remote

from ..platform.kubeapi import ApiError, KubeApi, Ref
from ..platform.loops import sleep_until_set
from ..platform.spec import ObjectMeta, SpecError
from .spec import TOOL_SERVERS, AgentToolServerSpec
from .status import Reason, discovered_status, failed_status, keep_transition

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Known:
    """What the refresher knows of one AgentToolServer."""

    body: Mapping[str, Any]
    refreshed_at: float | None = None
    """Monotonic seconds of our last discovery attempt (``None``: none yet)."""
    refreshed_generation: int = 0
    running: asyncio.Task[None] | None = None


class ToolServerRefresher:
    """Discovers every known AgentToolServer when it appears, when its spec changes and every
    ``spec.refreshInterval``, and writes its status."""

    def __init__(
        self,
        api: KubeApi,
        *,
        tick: float = 2.0,
        concurrency: int = 16,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``tick``: seconds between two looks for due servers; ``concurrency``: discoveries
        running at once (the others wait their turn; none blocks anything else)."""
        self._api = api
        self._tick = tick
        self._clock = clock
        self._wall = wall
        self._known: dict[tuple[str, str], _Known] = {}
        self._kick = asyncio.Event()
        self._stopped = False
        self._gate = asyncio.Semaphore(concurrency)

    def observe(self, body: Mapping[str, Any]) -> None:
        """An AgentToolServer was listed, added or changed (a kopf watch event)."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        known = self._known.get(key)
        if known is None:
            self._known[key] = _Known(body)
        else:
            known.body = body
        self._kick.set()

    def forget(self, namespace: str, name: str) -> None:
        """An AgentToolServer was deleted: stop refreshing it."""
        known = self._known.pop((namespace, name), None)
        if known is not None and known.running is not None:
            known.running.cancel()

    def stop(self) -> None:
        """End ``run`` after its current tick; cancel discoveries in flight."""
        self._stopped = True
        self._kick.set()
        for known in self._known.values():
            if known.running is not None:
                known.running.cancel()

    def _due(self, known: _Known, now: float) -> bool:
        if known.running is not None and not known.running.done():
            return False
        meta = ObjectMeta.of(known.body)
        if known.refreshed_at is None or known.refreshed_generation != meta.generation:
            return True
        try:
            interval = AgentToolServerSpec.of(known.body.get("spec")).refresh_interval.seconds
        except SpecError:
            return False  # an invalid spec is reported once per generation
        return now - known.refreshed_at >= interval

    async def run(self) -> None:
        """Start a discovery task for each due server, every ``tick`` seconds (or at once when
        an object is observed), until ``stop``."""
        while not self._stopped:
            now = self._clock()
            for key, known in list(self._known.items()):
                if self._due(known, now):
                    known.refreshed_at = now
                    known.refreshed_generation = ObjectMeta.of(known.body).generation
                    known.running = asyncio.create_task(
                        self.refresh(known.body), name=f"discover {key[0]}/{key[1]}"
                    )
            self._kick.clear()
            await sleep_until_set(self._kick, self._tick)

    async def refresh(self, body: Mapping[str, Any]) -> None:
        """Discover one server and write its status; never raises (failures are logged)."""
        meta = body.get("metadata") or {}
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        generation = int(meta.get("generation") or 1)
        previous = body.get("status") or {}
        now = self._wall()
        try:
            spec = AgentToolServerSpec.of(body.get("spec"))
        except SpecError as err:
            status = failed_status({}, str(err), generation=generation, now=now)
            status["conditions"][0]["reason"] = Reason.INVALID_SPEC
        else:
            async with self._gate:
                status = await self._discover(
                    spec, namespace, generation=generation, previous=previous
                )
        try:
            await self._api.patch_status(
                Ref(TOOL_SERVERS, name, namespace), keep_transition(status, previous)
            )
        except ApiError as err:
            if err.status != 404:
                log.warning("AgentToolServer %s/%s: status not written: %s", namespace, name, err)
        except Exception as err:  # the API server is away: the next refresh writes it
            log.warning("AgentToolServer %s/%s: status not written: %r", namespace, name, err)

    async def _discover(
        self,
        spec: AgentToolServerSpec,
        namespace: str,
        *,
        generation: int,
        previous: Mapping[str, Any],
    ) -> dict[str, Any]:
        try:
            headers = await self._headers(spec, namespace)
            endpoint = remote.Endpoint(
                spec.url, spec.transport, headers, timeout=spec.timeouts.discovery.seconds
            )
            found = await remote.discover(endpoint)
        except remote.RemoteError as err:
            return failed_status(previous, err.message, generation=generation, now=self._wall())
        return discovered_status(spec, found, generation=generation, now=self._wall())

    async def _headers(self, spec: AgentToolServerSpec, namespace: str) -> dict[str, str]:
        if spec.headers_from is None:
            return {}
        secret = spec.headers_from.secret_ref.name
        try:
            return await self._api.secret_values(namespace, secret)
        except (ApiError, ValueError) as err:
            reason = f"HTTP {err.status}" if isinstance(err, ApiError) else str(err)
            raise remote.RemoteError(
                f"cannot read Secret {namespace}/{secret} (spec.headersFrom): {reason}",
                fault=kernel.ToolFault.TRANSPORT,
            ) from None
