"""Compare-and-set over JetStream KV entries, with per-key group commit.

Every change is read → apply a pure function → write with the read revision; a lost race
re-reads and re-applies, a bounded number of times with jittered backoff, then raises
``LedgerUnavailable``. Within one process, changes to one key are group-committed: one write at
a time per key, each carrying every change queued meanwhile, on top of the cached last written
revision. So concurrent writers in a process share writes instead of racing each other; races
remain only between processes, which the compare-and-set resolves (the batch is re-applied).

What belongs here: the storage mechanics, generic in the entry type. What does not: what the
entries mean (``book``, ``store``).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

import nats.js.errors
from nats.js.kv import KeyValue

_Op = tuple[Callable[[Any], Any], "asyncio.Future[Any]"]


class LedgerUnavailable(Exception):
    """The entry kept changing under us for every attempt (or is unreadable)."""


class CasStore:
    """Compare-and-set access to the entries of one KV bucket, group-committed per key."""

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
            fresh = attempt > 0 or key not in self._cache
            try:
                current, entry = await self._read(key, decode, fresh=fresh)
            except Exception as err:  # unreadable entry or NATS trouble: every caller hears it
                _fail(batch, err)
                return
            revision, data = current if current is not None else (0, None)
            results = _apply_all(batch, entry)
            new = encode(entry)
            if new != data:
                try:
                    revision = await self._write(key, new, revision=revision)
                except nats.js.errors.KeyWrongLastSequenceError:
                    await asyncio.sleep(random.uniform(0, min(0.02, 0.0002 * 2**attempt)))
                    continue
                except Exception as err:
                    _fail(batch, err)
                    return
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

    async def _read(
        self, key: str, decode: Callable[[bytes | None], Any], *, fresh: bool
    ) -> tuple[tuple[int, bytes] | None, Any]:
        """The entry ``key`` as (revision, bytes) — ``None`` if missing — and decoded: from the
        server if ``fresh``, else the cached copy last written. The decoded entry kept from the
        last write is reused at the same revision; it is handed out once (it gets mutated)."""
        current = await self._get(key) if fresh else self._cache.get(key)
        revision, data = current if current is not None else (0, None)
        kept = self._decoded.pop(key, None)
        entry = kept[1] if kept is not None and kept[0] == revision else decode(data)
        return current, entry

    async def _write(self, key: str, new: bytes, *, revision: int) -> int:
        """Write ``new`` over ``revision`` of ``key`` and cache it; returns the new revision.
        Revision 0 creates the key, also over a delete or purge marker (a key that was deleted
        is written again, e.g. a tenant's book the ledger lost). Raises
        ``KeyWrongLastSequenceError`` on a lost race (counted in ``conflicts``), or whatever
        NATS raised; either way the cached copy is dropped."""
        try:
            if revision == 0:
                written = await self.kv.create(key, new)
            else:
                written = await self.kv.update(key, new, last=revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            self.conflicts += 1
            self._cache.pop(key, None)
            raise
        except Exception:
            self._cache.pop(key, None)
            raise
        self._cache[key] = (written, new)
        self.writes += 1
        return written


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
