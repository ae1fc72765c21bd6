"""Coalesced ``.status`` writes: at most one patch per run per interval; terminal ones at once.

A run with 50 fast turns must not cause 50 API writes: each submission replaces the run's
pending body (the newest projection wins, ordered by event sequence), and a run is patched at
most once per ``interval`` seconds — except its first and its terminal status, which are written
at once. At most ``concurrency`` patches are in flight, so a burst reuses a few connections.
A 404 means the object is gone (deleted mid-run, case C21): the write is dropped, never retried
into a re-creation.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from agentrun import kube

log = logging.getLogger(__name__)

MERGE_PATCH: dict[str, Any] = {"_content_type": "application/merge-patch+json"}
"""kubernetes_asyncio picks JSON Patch for list bodies only; force RFC 7386 merge patch."""

Patcher = Callable[[str, str, Mapping[str, Any]], Awaitable[None]]
"""``patch(namespace, name, status_body)``; raises ``ApiException``."""


def kube_patcher(api: client.ApiClient) -> Patcher:
    """A ``Patcher`` that merge-patches the AgentRun status subresource."""
    objects = client.CustomObjectsApi(api)

    async def patch(namespace: str, name: str, status: Mapping[str, Any]) -> None:
        await objects.patch_namespaced_custom_object_status(
            kube.GROUP,
            kube.VERSION,
            namespace,
            kube.RUNS,
            name,
            {"status": dict(status)},
            **MERGE_PATCH,
        )

    return patch


@dataclasses.dataclass(slots=True)
class _Pending:
    body: Mapping[str, Any]
    seq: int
    terminal: bool


class StatusWriter:
    """Background writer; ``submit`` never blocks on the API server."""

    def __init__(self, patch: Patcher, *, interval: float = 2.0, concurrency: int = 8) -> None:
        self.patch = patch
        self.interval = interval
        self._slots = asyncio.Semaphore(concurrency)
        self.writes = 0
        self._pending: dict[tuple[str, str], _Pending] = {}
        self._written_seq: dict[tuple[str, str], int] = {}
        self._last_write: dict[tuple[str, str], float] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the flushing task."""
        self._task = asyncio.create_task(self._run(), name="status-writer")

    async def close(self) -> None:
        """Flush what is pending (best effort), then stop."""
        await self.flush()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def submit(
        self, namespace: str, name: str, body: Mapping[str, Any], *, seq: int, terminal: bool
    ) -> None:
        """Queue ``body`` as the run's status unless a newer one (higher ``seq``) is known."""
        key = (namespace, name)
        current = self._pending.get(key)
        if current is not None and current.seq > seq:
            return
        if self._written_seq.get(key, -1) > seq:
            return
        self._pending[key] = _Pending(
            body, seq, terminal or (current.terminal if current and current.seq == seq else False)
        )
        self._wake.set()

    def forget(self, namespace: str, name: str) -> None:
        """Drop everything about a deleted run."""
        key = (namespace, name)
        self._pending.pop(key, None)
        self._written_seq.pop(key, None)
        self._last_write.pop(key, None)

    async def flush(self) -> None:
        """Write every pending body now."""
        for key in list(self._pending):
            await self._write(key)

    async def _write(self, key: tuple[str, str]) -> None:
        pending = self._pending.pop(key, None)
        if pending is None:
            return
        self._last_write[key] = time.monotonic()
        try:
            async with self._slots:  # few connections, reused: no TLS handshake per write
                await self.patch(key[0], key[1], pending.body)
            self.writes += 1
            self._written_seq[key] = pending.seq
        except ApiException as err:
            if err.status == 404:
                log.info("%s/%s is gone; status write dropped", *key)
                self.forget(*key)
                return
            log.warning(
                "status patch of %s/%s failed (HTTP %s); will retry", key[0], key[1], err.status
            )
            self._retry(key, pending)
        except Exception:
            log.exception("status patch of %s/%s failed; will retry", *key)
            self._retry(key, pending)

    def _retry(self, key: tuple[str, str], pending: _Pending) -> None:
        """Re-queue a failed write after ``interval`` (even a terminal one: no hot loop)."""
        if key not in self._pending:
            pending.terminal = False
            self._pending[key] = pending

    async def _run(self) -> None:
        while True:
            now = time.monotonic()
            due: list[tuple[str, str]] = []
            wait = 3600.0
            for key, pending in self._pending.items():
                ready_at = self._last_write.get(key, 0.0) + self.interval
                if pending.terminal or ready_at <= now:
                    due.append(key)
                else:
                    wait = min(wait, ready_at - now)
            if due:
                await asyncio.gather(*(self._write(key) for key in due))
                continue
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()
