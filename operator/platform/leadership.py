"""Leader election on a ``coordination.k8s.io/v1`` Lease: at most one operator process acts.

What belongs here: taking, renewing and releasing the Lease, and the rule for when a standby
may take it over. What does not: what the leader then runs (``main``), the API calls (``KubeLeases``
translates records to Lease objects through ``kubeapi`` and holds no decision).

The rule is client-go's: a standby never compares its clock with the holder's. It remembers
when it last saw the Lease change (its ``resourceVersion``) on its own monotonic clock and
takes the Lease over only once it has not changed for the Lease's ``leaseDurationSeconds``.
The leader renews every ``retry`` seconds and stops acting once it has not renewed for
``renew_deadline`` seconds, which is shorter than the Lease duration: the old leader has
stopped before any standby may start. Every write is an update with the ``resourceVersion``
read just before (optimistic concurrency), so two standbys racing for an expired Lease cannot
both win. kopf's own peering is not used: it pauses only the watch streams (not start-up
handlers or this operator's queue pump, ledger sweep and NATS consumers), and peers of equal
priority are not arbitrated.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from .kubeapi import ApiError, KubeApi

log = logging.getLogger(__name__)


class LeaseConflict(Exception):
    """The Lease changed (or was created) since it was read: someone else wrote it."""


@dataclasses.dataclass(frozen=True, slots=True)
class LeaseRecord:
    """What the election reads from and writes to the Lease's spec."""

    holder: str
    """``holderIdentity``; empty when released."""
    duration: float
    """``leaseDurationSeconds``."""
    transitions: int = 0
    """``leaseTransitions``: how often the holder changed."""
    acquired: str = ""
    """``acquireTime`` (RFC 3339 with microseconds) of the current holder."""
    version: str = ""
    """``metadata.resourceVersion`` as read; empty for a record not yet written."""


class LeaseStore(Protocol):
    """Reads and writes the one Lease; raises ``LeaseConflict`` on a lost race, anything else
    on a failed request."""

    async def read(self) -> LeaseRecord | None:
        """The Lease as stored, or None when it does not exist."""

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        """Create the Lease holding ``record``."""

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        """Write ``record`` if the Lease is still at ``record.version``."""


@dataclasses.dataclass(frozen=True, slots=True)
class LeaseTiming:
    """Seconds; ``retry < renew_deadline < duration`` (checked by the settings)."""

    duration: float
    renew_deadline: float
    retry: float


def micro_time(now: datetime.datetime | None = None) -> str:
    """``MicroTime`` as the API server parses it: RFC 3339, always six fraction digits, UTC."""
    moment = now or datetime.datetime.now(datetime.UTC)
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Takes and keeps the Lease for ``identity``."""

    def __init__(
        self,
        store: LeaseStore,
        *,
        identity: str,
        timing: LeaseTiming,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock``: monotonic seconds, used only to age what this process observed."""
        self.store = store
        self.identity = identity
        self.timing = timing
        self.clock = clock
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0

    @property
    def leading(self) -> bool:
        """Whether the last record this process wrote or read names it as holder."""
        return self._observed is not None and self._observed.holder == self.identity

    @property
    def holder(self) -> str:
        """Who the Lease named when this process last read or wrote it (``""``: nobody)."""
        return "" if self._observed is None else self._observed.holder

    async def try_acquire_or_renew(self) -> bool:
        """One attempt: True when this process holds the Lease afterwards.

        Raises what the store raises on a failed request (not on a lost race: False).
        """
        now = self.clock()
        current = await self.store.read()
        if current is None:
            fresh = LeaseRecord(self.identity, self.timing.duration, acquired=micro_time())
            return await self._write(self.store.create, fresh, now)
        if self._observed is None or current.version != self._observed.version:
            self._observed, self._observed_at = current, now
        held_by_other = current.holder not in ("", self.identity)
        if held_by_other and now < self._observed_at + current.duration:
            return False
        taking_over = current.holder != self.identity
        record = dataclasses.replace(
            current,
            holder=self.identity,
            duration=self.timing.duration,
            transitions=current.transitions + (1 if taking_over else 0),
            acquired=micro_time() if taking_over else current.acquired,
        )
        return await self._write(self.store.update, record, now)

    async def peek(self) -> str:
        """Read the Lease and judge it as ``try_acquire_or_renew`` would, writing nothing: its
        holder while it holds it (this process, or another whose Lease changed within its
        duration on this process's clock), else ``""`` (free: missing, released, or expired).
        Raises what the store raises."""
        now = self.clock()
        current = await self.store.read()
        if current is None or not current.holder:
            return ""
        if self._observed is None or current.version != self._observed.version:
            self._observed, self._observed_at = current, now
        if current.holder != self.identity and now >= self._observed_at + current.duration:
            return ""
        return current.holder

    async def _write(self, write: Any, record: LeaseRecord, now: float) -> bool:
        try:
            written: LeaseRecord = await write(record)
        except LeaseConflict:
            return False
        self._observed, self._observed_at = written, now
        return True

    async def acquire(self) -> None:
        """Wait until this process holds the Lease (a standby waits here); failed requests are
        logged and retried."""
        announced = False
        while True:
            try:
                async with asyncio.timeout(self.timing.renew_deadline):
                    acquired = await self.try_acquire_or_renew()
                if acquired:
                    log.info("leading: %s holds the Lease", self.identity)
                    return
            except Exception as err:  # API server away or slow: keep trying, as a standby
                log.warning("could not read or take the Lease: %r", err)
            if not announced and self._observed is not None:
                log.info("standby: the Lease is held by %s", self._observed.holder)
                announced = True
            await asyncio.sleep(self.timing.retry)

    async def hold(self) -> None:
        """Renew every ``retry`` seconds; return once leadership is lost (another holder, or no
        successful renewal for ``renew_deadline`` seconds). The caller must stop acting."""
        last_renewal = self.clock()
        while True:
            await asyncio.sleep(self.timing.retry)
            attempt = self.clock()
            left = self.timing.renew_deadline - (attempt - last_renewal)
            try:  # a hung request must not outlive the deadline
                async with asyncio.timeout(max(left, 0.1)):
                    renewed = await self.try_acquire_or_renew()
            except Exception as err:
                log.warning("could not renew the Lease: %r", err)
                renewed = False
            if renewed:
                last_renewal = self.clock()
                if last_renewal - attempt > self.timing.retry:  # a warning before the loss
                    log.warning(
                        "renewing the Lease took %.1f s (renew deadline %.1f s)",
                        last_renewal - attempt,
                        self.timing.renew_deadline,
                    )
                continue
            if self._observed is not None and self._observed.holder not in ("", self.identity):
                log.error("the Lease was taken over by %s", self._observed.holder)
                return
            if self.clock() - last_renewal >= self.timing.renew_deadline:
                log.error("no renewal of the Lease for %.1f s", self.timing.renew_deadline)
                return

    async def release(self, *, attempts: int = 3) -> None:
        """Give the Lease up at a graceful stop so a standby takes over at once (best effort).

        A renewal that was cut off in flight may have been applied without this process seeing
        its new ``resourceVersion``: on a conflict the Lease is read again and released at the
        version read, as long as it still names this process (up to ``attempts`` writes).
        Failures are logged; the standby then takes over after the Lease duration instead.
        """
        if not self.leading or self._observed is None:
            return
        current: LeaseRecord | None = self._observed
        for _ in range(attempts):
            if current is None or current.holder != self.identity:
                return  # gone, or someone else's already: nothing of ours to give up
            try:
                self._observed = await self.store.update(
                    dataclasses.replace(current, holder="", duration=1.0)
                )
                return
            except LeaseConflict:
                try:
                    current = await self.store.read()
                except Exception as err:
                    log.warning("could not read the Lease to release it: %r", err)
                    return
            except Exception as err:
                log.warning("could not release the Lease: %r", err)
                return
        log.warning("could not release the Lease: it kept changing")


Connect = Callable[[], Awaitable[tuple[LeaseStore, Callable[[], Awaitable[None]]]]]
"""Opens a ``LeaseStore`` on the running event loop: the store and how to close it."""


class RenewalThread:
    """``LeaderElector.hold`` on an event loop of its own, in a thread of its own, over a
    ``LeaseStore`` (an API client) of its own: however busy the operator's event loop is (a
    burst of thousands of AgentRuns to admit), the Lease is renewed on time. A renewal proves
    the process alive, not its event loop responsive: the liveness probe, answered by that
    loop, covers a loop that is stuck.

    ``on_lost`` is called from the renewal thread once leadership is lost (another holder, or
    no renewal for ``renew_deadline``): the caller exits there, without waiting for its own
    event loop. ``stop`` (a graceful stop) ends the renewals and releases the Lease."""

    def __init__(self, elector: LeaderElector, *, connect: Connect, on_lost: Callable[[], None]):
        """``elector``: the one that acquired the Lease (from now on used by the thread only);
        ``connect``: opens its ``LeaseStore`` on the thread's loop."""
        self.elector = elector
        self.connect = connect
        self.on_lost = on_lost
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready = threading.Event()
        self._started = False
        self._thread = threading.Thread(target=self._main, name="lease-renewal", daemon=True)

    def start(self) -> None:
        """Start renewing; returns once the thread's store is open (blocking: call it from a
        thread, e.g. ``asyncio.to_thread``)."""
        self._started = True
        self._thread.start()
        self._ready.wait()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop renewing and release the Lease (best effort; blocking, as ``start``). A thread
        still starting (``start`` called from another thread) is waited for, up to
        ``timeout`` seconds, so that it is stopped too; one never started is left alone."""
        if not self._started:
            return
        self._ready.wait(timeout)
        loop, task = self._loop, self._task
        if loop is not None and task is not None and not loop.is_closed():
            loop.call_soon_threadsafe(task.cancel)
        self._thread.join(timeout)

    def _main(self) -> None:
        asyncio.run(self._renew())

    async def _renew(self) -> None:
        self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
        try:
            store, close = await self.connect()
        except Exception as err:  # no client: no renewal, leadership ends as if lost
            log.error("could not open the Lease's client for its renewals: %r", err)
            self._ready.set()
            self.on_lost()
            return
        self.elector.store = store
        self._ready.set()
        try:
            await self.elector.hold()
        except asyncio.CancelledError:  # a graceful stop: give the Lease up at once
            await self.elector.release()
            return
        finally:
            await close()
        self.on_lost()


class KubeLeases:
    """``LeaseStore`` over the API server (``coordination.k8s.io/v1``)."""

    def __init__(self, api: KubeApi, *, namespace: str, name: str) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name

    async def read(self) -> LeaseRecord | None:
        """The Lease, or None when it does not exist; raises ``ApiError`` otherwise."""
        lease = await self.api.read_lease(self.namespace, self.name)
        if lease is None:
            return None
        spec = lease.get("spec") or {}
        return LeaseRecord(
            holder=str(spec.get("holderIdentity") or ""),
            duration=float(spec.get("leaseDurationSeconds") or 0),
            transitions=int(spec.get("leaseTransitions") or 0),
            acquired=str(spec.get("acquireTime") or ""),
            version=_version(lease),
        )

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        """Create the Lease; ``LeaseConflict`` when it exists already."""
        try:
            lease = await self.api.create_lease(self.namespace, self._body(record))
        except ApiError as err:
            if err.status == 409:
                raise LeaseConflict(f"Lease {self.name} exists") from err
            raise
        return dataclasses.replace(record, version=_version(lease))

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        """Replace the Lease at ``record.version``; ``LeaseConflict`` when it moved on."""
        try:
            lease = await self.api.replace_lease(self.namespace, self.name, self._body(record))
        except ApiError as err:
            if err.status in (404, 409):
                raise LeaseConflict(f"Lease {self.name} changed: HTTP {err.status}") from err
            raise
        return dataclasses.replace(record, version=_version(lease))

    def _body(self, record: LeaseRecord) -> dict[str, Any]:
        """The Lease as JSON (``MicroTime`` in the format the API server parses)."""
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if record.version:
            metadata["resourceVersion"] = record.version
        spec: dict[str, Any] = {
            "holderIdentity": record.holder or None,
            "leaseDurationSeconds": max(1, round(record.duration)),
            "leaseTransitions": record.transitions,
            "renewTime": micro_time(),
        }
        if record.acquired:
            spec["acquireTime"] = record.acquired
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease"}
        return {**body, "metadata": metadata, "spec": spec}


def _version(lease: Mapping[str, Any]) -> str:
    return str((lease.get("metadata") or {}).get("resourceVersion") or "")
