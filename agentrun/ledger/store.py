"""Ledger entries in JetStream KV, changed only by compare-and-set on the entry's revision.

Two keys per tenant in bucket ``AGENTRUN_LEDGER``: ``book.<tenant>`` (a ``Book``: usage,
holds, active runs) and ``queue.<tenant>`` (the FIFO admission queue, written by the operator
only). Every change is read → apply a pure function → write with the read revision
(``Nats-Expected-Last-Subject-Sequence``); a lost race re-reads and re-applies, a bounded number
of times with jittered backoff, then raises ``LedgerUnavailable``.

Within one process, changes to one key are group-committed: one write at a time per key, each
carrying every change queued meanwhile, on top of the cached last written revision. So
concurrent reservers in a process share writes instead of racing each other; races remain only
between processes, which the compare-and-set resolves (the batch is re-applied).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

import nats.js.errors
from nats.js import JetStreamContext, api
from nats.js.kv import KeyValue

from agentrun.ledger.book import Book, TenantLimits

BUCKET = "AGENTRUN_LEDGER"
T = TypeVar("T")
_Op = tuple[Callable[[Any], Any], "asyncio.Future[Any]"]


class LedgerUnavailable(Exception):
    """The entry kept changing under us for every attempt (or is unreadable)."""


@dataclasses.dataclass(frozen=True, slots=True)
class QueuedRun:
    """A run waiting in its tenant's admission queue."""

    uid: str
    namespace: str
    name: str
    at: float
    """The AgentRun's creation time, epoch seconds: the queue's order (ties: arrival order)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON shape."""
        return {"uid": self.uid, "ns": self.namespace, "name": self.name, "at": round(self.at, 3)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QueuedRun:
        """Inverse of ``as_dict``."""
        return cls(str(data["uid"]), str(data["ns"]), str(data["name"]), float(data["at"]))


def book_key(tenant: str) -> str:
    """``book.<tenant>`` (tenant names are DNS subdomains: valid KV key characters)."""
    return f"book.{tenant}"


def queue_key(tenant: str) -> str:
    """``queue.<tenant>``."""
    return f"queue.{tenant}"


class LedgerStore:
    """Compare-and-set access to tenant ledger entries. Create with ``LedgerStore.open``."""

    def __init__(
        self,
        kv: KeyValue,
        *,
        attempts: int = 40,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kv = kv
        self.attempts = attempts
        self.clock = clock
        self._cache: dict[str, tuple[int, bytes]] = {}
        self._decoded: dict[str, tuple[int, Any]] = {}
        """The cached entry, decoded, at the cached revision (saves a decode per write)."""
        self._pending: dict[str, list[_Op]] = {}
        self._flushers: dict[str, asyncio.Task[None]] = {}
        self.conflicts = 0
        """Compare-and-set attempts lost to another writer (for benchmarks and tests)."""
        self.writes = 0
        """Entries written (each may carry several group-committed changes)."""

    @classmethod
    async def open(
        cls, js: JetStreamContext, *, bucket: str = BUCKET, **kwargs: Any
    ) -> LedgerStore:
        """Bind (creating it if missing) the ledger bucket (``AGENTRUN_LEDGER``; another name
        keeps a second ledger apart on the same server, e.g. for tests)."""
        try:
            kv = await js.key_value(bucket)
        except nats.js.errors.BucketNotFoundError:
            kv = await js.create_key_value(
                api.KeyValueConfig(bucket=bucket, history=1, storage=api.StorageType.FILE)
            )
        return cls(kv, **kwargs)

    async def _get(self, key: str) -> tuple[int, bytes] | None:
        try:
            entry = await self.kv.get(key)
        except nats.js.errors.KeyNotFoundError:  # includes deleted keys
            return None
        assert entry.revision is not None
        return entry.revision, entry.value or b""

    async def _submit(
        self,
        key: str,
        fn: Callable[[Any], Any],
        decode: Callable[[bytes | None], Any],
        encode: Callable[[Any], bytes],
    ) -> Any:
        """Apply ``fn`` to the decoded entry ``key`` and write it back by compare-and-set.

        Changes to one key are group-committed: while a write is in flight, later changes
        queue, and the next write applies all of them in order to one decoded entry (each
        caller gets its own result). On a lost race the whole batch is re-applied to the
        entry as it now is. ``fn`` may therefore run several times and must be deterministic
        given the entry; it runs only while its caller still waits.
        """
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(key, []).append((fn, future))
        if key not in self._flushers:
            self._flushers[key] = asyncio.create_task(
                self._flush(key, decode, encode), name=f"ledger-{key}"
            )
        return await future

    async def _flush(
        self, key: str, decode: Callable[[bytes | None], Any], encode: Callable[[Any], bytes]
    ) -> None:
        try:
            while batch := self._pending.pop(key, None):
                await self._write_batch(key, batch, decode, encode)
        finally:
            del self._flushers[key]

    async def _write_batch(
        self,
        key: str,
        batch: list[_Op],
        decode: Callable[[bytes | None], Any],
        encode: Callable[[Any], bytes],
    ) -> None:
        for attempt in range(self.attempts):
            batch = [op for op in batch + self._pending.pop(key, []) if not op[1].done()]
            if not batch:
                return
            try:
                current = self._cache.get(key) if attempt == 0 else None
                fresh = current is None
                if current is None:
                    current = await self._get(key)
                revision, data = current if current is not None else (0, None)
                kept = self._decoded.pop(key, None)  # mutated below: valid only if written
                entry = kept[1] if kept is not None and kept[0] == revision else decode(data)
            except Exception as err:  # unreadable entry or NATS trouble: every caller hears it
                _fail(batch, err)
                return
            results = _apply_all(batch, entry)
            new = encode(entry)
            if new != data:
                try:
                    written = await self.kv.update(key, new, last=revision)
                except nats.js.errors.KeyWrongLastSequenceError:
                    self.conflicts += 1
                    self._cache.pop(key, None)
                    await asyncio.sleep(random.uniform(0, min(0.02, 0.0002 * 2**attempt)))
                    continue
                except Exception as err:
                    self._cache.pop(key, None)
                    _fail(batch, err)
                    return
                self._cache[key] = (written, new)
                self.writes += 1
                revision = written
            elif not fresh:
                # nothing to write, judged on our cached copy: another process may have
                # changed the entry since (a raised limit, a released hold), so the answer
                # (a refusal, "nothing to repair") counts only once confirmed on a fresh read
                continue
            elif current is not None:
                self._cache[key] = current
            if all(ok for ok, _ in results):  # a change that raised may have left it half-done
                self._decoded[key] = (revision, entry)
            _resolve(batch, results)
            return
        _fail(batch, LedgerUnavailable(f"{key}: {self.attempts} compare-and-set attempts lost"))

    # --- books -----------------------------------------------------------------------------------

    async def read(self, tenant: str) -> Book | None:
        """The tenant's entry as stored now, or ``None``."""
        found = await self._get(book_key(tenant))
        return None if found is None else Book.decode(found[1])

    async def change(
        self, tenant: str, fn: Callable[[Book], T], *, limits: TenantLimits | None = None
    ) -> T:
        """Apply ``fn`` to the tenant's entry and write it back by compare-and-set.

        A missing entry starts empty with ``limits`` (unlimited if not given: the operator
        writes the real limits when it admits the tenant's first run). ``fn`` may run more than
        once (on lost races) and must be deterministic given the entry.
        """

        def decode(data: bytes | None) -> Book:
            if data is None:
                return Book.new(tenant, limits or TenantLimits(), now=self.clock())
            return Book.decode(data)

        result: T = await self._submit(book_key(tenant), fn, decode, Book.encode)
        return result

    # --- admission queues ------------------------------------------------------------------------

    async def queue(self, tenant: str) -> list[QueuedRun]:
        """The tenant's admission queue, head first."""
        found = await self._get(queue_key(tenant))
        return [] if found is None else _decode_queue(found[1])

    async def change_queue(self, tenant: str, fn: Callable[[list[QueuedRun]], T]) -> T:
        """Apply ``fn`` to the tenant's queue (a list it may edit in place) by compare-and-set."""

        def decode(data: bytes | None) -> list[QueuedRun]:
            return [] if data is None else _decode_queue(data)

        result: T = await self._submit(queue_key(tenant), fn, decode, _encode_queue)
        return result

    async def enqueue(self, tenant: str, run: QueuedRun) -> int:
        """Queue ``run`` unless already queued: after every run created no later than it (FIFO
        by creation time, so runs created together queue in creation order even when their
        admissions reach here out of order). Returns its 1-based position."""

        def add(runs: list[QueuedRun]) -> int:
            for index, queued in enumerate(runs):
                if queued.uid == run.uid:
                    return index + 1
            index = len(runs)
            while index > 0 and runs[index - 1].at > run.at:
                index -= 1
            runs.insert(index, run)
            return index + 1

        return await self.change_queue(tenant, add)

    async def dequeue(self, tenant: str, uid: str) -> bool:
        """Remove the run ``uid`` from the queue; False if it was not there."""

        def remove(runs: list[QueuedRun]) -> bool:
            for index, queued in enumerate(runs):
                if queued.uid == uid:
                    del runs[index]
                    return True
            return False

        return await self.change_queue(tenant, remove)

    async def tenants(self) -> list[str]:
        """Tenants with a book entry."""
        try:
            keys = await self.kv.keys()  # nats-py filters by substring, not subject wildcard
        except nats.js.errors.NoKeysError:
            return []
        return [key.removeprefix("book.") for key in keys if key.startswith("book.")]


def _apply_all(batch: list[_Op], entry: Any) -> list[tuple[bool, Any]]:
    results: list[tuple[bool, Any]] = []
    for fn, _ in batch:
        try:
            results.append((True, fn(entry)))
        except Exception as err:  # a bug in one change must not sink the others
            results.append((False, err))
    return results


def _resolve(batch: list[_Op], results: list[tuple[bool, Any]]) -> None:
    for (_, future), (ok, value) in zip(batch, results, strict=True):
        if future.done():
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


def _fail(batch: list[_Op], err: BaseException) -> None:
    for _, future in batch:
        if not future.done():
            future.set_exception(err)


def _encode_queue(runs: list[QueuedRun]) -> bytes:
    return json.dumps([r.as_dict() for r in runs], separators=(",", ":")).encode()


def _decode_queue(data: bytes) -> list[QueuedRun]:
    try:
        return [QueuedRun.from_dict(item) for item in json.loads(data)]
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"malformed admission queue: {err!r}") from err
