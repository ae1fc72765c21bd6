"""Coalesced ``.status`` writes: at most one patch per run per interval; terminal ones at once.

A run with 50 fast turns must not cause 50 API writes: each submission replaces the run's
pending body (the newest projection wins, ordered by event sequence), and a run is patched at
most once per ``interval`` seconds — except its first and its terminal status, which are written
at once. At most ``concurrency`` patches are in flight, so a burst reuses a few connections.

Every patch carries the run's ``metadata.uid`` as a precondition: a write meant for a deleted
run can neither land on a new object of the same name (409) nor re-create one (404). Either
answer means the run is gone: the write is dropped and the run is handed out by
``next_gone``, so the dispatcher stops whatever of that run is still going. A body the API
server refuses (422, e.g. a value outside the schema) is replaced once by a minimal status,
never retried in a loop.
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

from .runs import RunKey

log = logging.getLogger(__name__)

MERGE_PATCH: dict[str, Any] = {"_content_type": "application/merge-patch+json"}
"""kubernetes_asyncio picks JSON Patch for list bodies only; force RFC 7386 merge patch."""

GONE = frozenset({404, 409})
"""Answers that mean the object we meant (by uid) no longer exists."""

MINIMAL_KEYS = ("phase", "terminalReason", "outcome", "completionTime", "observedGeneration")


Patcher = Callable[[RunKey, Mapping[str, Any]], Awaitable[None]]
"""``patch(run, status_body)``; raises ``ApiException``."""


def kube_patcher(api: client.ApiClient) -> Patcher:
    """A ``Patcher`` that merge-patches the AgentRun status subresource, uid as precondition."""
    objects = client.CustomObjectsApi(api)

    async def patch(run: RunKey, status: Mapping[str, Any]) -> None:
        await objects.patch_namespaced_custom_object_status(
            kube.GROUP,
            kube.VERSION,
            run.namespace,
            kube.RUNS,
            run.name,
            {"metadata": {"uid": run.uid}, "status": dict(status)},
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

    def __init__(
        self,
        patch: Patcher,
        *,
        interval: float = 5.0,
        concurrency: int = 8,
    ) -> None:
        """``interval``: least seconds between two patches of one run; ``concurrency``: patches
        in flight at most."""
        self.patch = patch
        self.interval = interval
        self.writes = 0
        self._slots = asyncio.Semaphore(concurrency)
        self._pending: dict[RunKey, _Pending] = {}
        self._written_seq: dict[RunKey, int] = {}
        self._last_write: dict[RunKey, float] = {}
        self._wake = asyncio.Event()
        self._gone: asyncio.Queue[RunKey] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the flushing task."""
        self._task = asyncio.create_task(self._run(), name="status-writer")

    async def flush_and_stop(self) -> None:
        """Flush what is pending (best effort), then stop."""
        await self.flush()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def submit(self, run: RunKey, body: Mapping[str, Any], *, seq: int, terminal: bool) -> None:
        """Queue ``body`` as the run's status unless a newer one (higher ``seq``) is known."""
        current = self._pending.get(run)
        if current is not None and current.seq > seq:
            return
        if self._written_seq.get(run, -1) > seq:
            return
        urgent = terminal or (current is not None and current.seq == seq and current.terminal)
        self._pending[run] = _Pending(body, seq, urgent)
        self._wake.set()

    async def next_gone(self) -> RunKey:
        """Wait for the next run whose object turned out to be gone (404/409 on a patch)."""
        return await self._gone.get()

    def forget(self, run: RunKey) -> None:
        """Drop everything about a deleted run."""
        self._pending.pop(run, None)
        self._written_seq.pop(run, None)
        self._last_write.pop(run, None)

    async def flush(self) -> None:
        """Write every pending body now."""
        for run in list(self._pending):
            await self._write(run)

    async def _write(self, run: RunKey) -> None:
        pending = self._pending.pop(run, None)
        if pending is None:
            return
        self._last_write[run] = time.monotonic()
        try:
            async with self._slots:  # few connections, reused: no TLS handshake per write
                await self.patch(run, pending.body)
            self.writes += 1
            self._written_seq[run] = pending.seq
        except ApiException as err:
            await self._failed(run, pending, err)
        except Exception:
            log.exception("status patch of %s/%s failed; will retry", run.namespace, run.name)
            self._retry(run, pending)

    async def _failed(self, run: RunKey, pending: _Pending, err: ApiException) -> None:
        if err.status in GONE:
            log.info("%s/%s (uid %s) is gone; status dropped", run.namespace, run.name, run.uid)
            self.forget(run)
            self._gone.put_nowait(run)
            return
        if err.status == 422 and set(pending.body) - set(MINIMAL_KEYS) - {"message"}:
            log.error(
                "the API server refused the status of %s/%s: %s; writing a minimal status",
                run.namespace,
                run.name,
                err.body,
            )
            minimal = {k: pending.body[k] for k in MINIMAL_KEYS if k in pending.body}
            minimal["message"] = f"full status refused by the API server (HTTP 422): {err.reason}"
            self._retry(run, _Pending(minimal, pending.seq, pending.terminal))
            return
        if 400 <= (err.status or 0) < 500 and err.status != 429:
            log.error(
                "status of %s/%s refused (HTTP %s); dropped", run.namespace, run.name, err.status
            )
            return
        log.warning(
            "status patch of %s/%s failed (HTTP %s); retrying", run.namespace, run.name, err.status
        )
        self._retry(run, pending)

    def _retry(self, run: RunKey, pending: _Pending) -> None:
        """Re-queue a failed write after ``interval`` (even a terminal one: no hot loop)."""
        if run not in self._pending:
            pending.terminal = False
            self._pending[run] = pending
            self._wake.set()

    async def _run(self) -> None:
        while True:
            now = time.monotonic()
            due: list[RunKey] = []
            wait = 3600.0
            for run, pending in self._pending.items():
                ready_at = self._last_write.get(run, 0.0) + self.interval
                if pending.terminal or ready_at <= now:
                    due.append(run)
                else:
                    wait = min(wait, ready_at - now)
            if due:
                await asyncio.gather(*(self._write(run) for run in due))
                continue
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()
