"""Compare-and-set over JetStream KV values, one or several at once, with group commit.

Every change is read → apply a pure function → write with the read revisions; a lost race
re-reads and re-applies with jittered backoff, and raises ``LedgerUnavailable`` only once
both a number of attempts and a time have passed (``CasStore``: a stream's leader election
answers compare-and-sets with conflicts for as long as it takes, which a count alone spent in
a third of a second). A change of several values is one *atomic batch* (nats-server ≥ 2.12,
ADR-50: every message of a batch carries ``Nats-Expected-Last-Subject-Sequence``, checked when
the batch commits, and the batch is stored whole or not at all), so a change of a run's entry
and its tenant's totals is one write; a change of one value is a plain compare-and-set. Within
one process, changes of one *group* of values (a tenant's) are group-committed: one write at a
time per group, each carrying the changes queued meanwhile (up to ``BATCH_CHANGES``), on top of
the cached last written revisions. So concurrent writers in a process share writes instead of
racing each other; races
remain only between processes, which the compare-and-set resolves (the batch is re-applied).

A value is deleted by a purge marker that expires (``Nats-TTL``): a key whose run ended leaves
nothing behind in the bucket once its marker is gone. The marker carries no ``Nats-Rollup``: the
bucket keeps one message a key (history 1), so the marker replaces the value by itself, and the
bucket takes no rollup at all (``buckets.forbid_rollups``: a rollup of ``all`` sent to a key a
worker may write would purge every key of the bucket, the operator's admission queues too).

No atomic batch carries more than ``MAX_BATCH`` messages (nats-server takes at most 1,000 in one,
``jetstream.limits.batch.max_msgs``, and refuses the whole batch past it): the changes one
write carries are bounded by the values they name (``BATCH_VALUES``), and a change of more
values than one batch takes — a ledger made anew or split — is written in several, guarded
(``_put_guarded``): its values first, each batch checking and rewriting a *guard* key that
every such writer of the group rewrites too, its commit point (a value the others are read
through) in the last batch, which deletes the guard. A writer whose batches stop half-way
(a crash, a lost race) has written only values nobody reads before that commit point; the
next writer reads and rewrites them, and a racing one finds the guard changed and starts
over.

What belongs here: the storage mechanics, generic in what the values mean. What does not:
what the values are (``codec``) and which a change touches (``store``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext, api
from nats.js.kv import KV_OP, KV_PURGE, KeyValue

from agentrun import loops

_Op = tuple[Any, "asyncio.Future[Any]", int]
"""A change queued in a group: its payload, its caller's future and its weight (the values it
names, ``BATCH_VALUES``)."""

WRONG_LAST_SEQUENCE = frozenset({10071, 10164})
"""JetStream errors of a lost compare-and-set (``JSStreamWrongLastSequenceErrF`` and its
constant form)."""
BATCH_BUSY = frozenset({10176, 10210})
"""Atomic batch errors a retry clears: the batch arrived incomplete (a message lost on a
reconnect), the server holds too many batches in flight (``JSAtomicPublishIncompleteBatchErr``,
``JSAtomicPublishTooManyInflight``)."""
BATCH_CHANGES = 64
"""Changes one write carries at most (the others wait for the next): a write's time grows with
the values it reads and writes, so a burst is cut into writes of bounded size, each answered
as it lands."""
MAX_BATCH = 256
"""Messages one atomic batch carries at most: a quarter of the 1,000 nats-server takes
(``jetstream.limits.batch.max_msgs``; past it the server refuses the whole batch, ``atomic
publish batch is too large``). A write of more values is cut into guarded batches
(``_put_guarded``) or refused (``_put``)."""
BATCH_VALUES = 128
"""The weight (values named, besides the group's own: a tenant's totals and the runs inline in
them) the changes one write carries may add up to; a change heavier than this goes alone, and
a caller with more values cuts them into several changes. Half of ``MAX_BATCH``: the rest is
room for the values a change writes beside those it names."""
GUARD_IDLE = 60.0
"""Seconds after its last batch that a guard (``_put_guarded``) is taken for abandoned: a
guarded write's batches follow each other within milliseconds."""
LIST_READS = 256
"""Reads a listing has in flight at most (each key's last message is one request)."""
DELETED_MARKER_TTL = 60.0
"""Seconds a deleted value's purge marker stays in the bucket (then nothing of it is left)."""


PATIENCE = 5.0
"""Default seconds a batch keeps retrying lost compare-and-sets (with ``attempts`` spent too):
longer than a JetStream stream's leader election takes (a step-down on a loaded three-server
cluster lost 40 attempts within about 0.4 s, the count's whole backoff)."""


class LedgerUnavailable(Exception):
    """The values kept changing under us for every attempt (or are unreadable)."""


class Conflict(Exception):
    """A write lost its compare-and-set (or the server asked for the batch again): re-read the
    values and re-apply the changes."""


@dataclasses.dataclass(frozen=True, slots=True)
class Stored:
    """A key as read: its revision (of its last message, a purge marker's too; 0: never
    written or its marker expired) and its value (``None``: missing or deleted)."""

    revision: int
    data: bytes | None


@dataclasses.dataclass(frozen=True, slots=True)
class Write:
    """Set ``key`` to ``value`` (``None``: delete it) if it is still at ``revision``."""

    key: str
    value: bytes | None
    revision: int


Attempt = Callable[[list[Any], int], Awaitable[list[tuple[bool, Any]] | None]]
"""One attempt at a group's batch of changes: given their payloads and the attempt's number
(0: the first, which may read every value from the cache; later ones read fresh what may have
changed), apply them and write; the result of each (ok, value or error), or ``None`` when
nothing had to be written as judged on cached copies (then it is tried again on fresh ones).
Raises ``Conflict`` on a lost race."""


class CasStore:
    """Compare-and-set access to the values of one KV bucket, group-committed per group."""

    def __init__(
        self,
        kv: KeyValue,
        *,
        attempts: int = 40,
        patience: float = PATIENCE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kv = kv
        self.attempts = attempts
        """Lost compare-and-sets of one batch before it may fail."""
        self.patience = patience
        """Seconds of lost compare-and-sets of one batch before it may fail: it fails only
        once both ``attempts`` and this are spent."""
        self.clock = clock
        self._cache: dict[str, tuple[int, bytes | None]] = {}
        self._pending: dict[str, list[_Op]] = {}
        self._flushers: dict[str, asyncio.Task[None]] = {}
        self.conflicts = 0
        """Compare-and-set attempts lost to another writer (for benchmarks and tests)."""
        self.writes = 0
        """Writes made (each may carry several group-committed changes, and several values)."""
        self.batches = 0
        """Of ``writes``, atomic batches of more than one value."""
        self.largest_batch = 0
        """Messages of the largest atomic batch written."""
        self.bytes_written = 0
        """Bytes of the values written (and deleted: 0)."""

    @property
    def _js(self) -> JetStreamContext:
        js: JetStreamContext = self.kv._js
        return js

    def _subject(self, key: str) -> str:
        prefix: str = self.kv._pre
        return f"{prefix}{key}"

    # --- reading ----------------------------------------------------------------------------------

    async def _get(self, key: str, *, fresh: bool = True) -> Stored:
        """The key's revision and value: from the server, or (``fresh`` false) the copy this
        store last read or wrote, if any."""
        if not fresh and key in self._cache:
            return Stored(*self._cache[key])
        try:
            entry = await self.kv._get(key)
        except nats.js.errors.KeyDeletedError as err:  # a purge marker: its revision counts
            self._cache[key] = (err.entry.revision or 0, None)
            return Stored(err.entry.revision or 0, None)
        except nats.js.errors.KeyNotFoundError:
            self._cache[key] = (0, None)
            return Stored(0, None)
        revision: int = entry.revision or 0
        data: bytes = entry.value or b""
        self._cache[key] = (revision, data)
        return Stored(revision, data)

    async def _list(
        self, pattern: str, *, values: bool = True, deleted: bool = False
    ) -> dict[str, Stored]:
        """Every live key matching ``pattern`` (a subject wildcard below the bucket, e.g.
        ``run.<tenant>.*``) with its revision and value (``values`` false: not cached), as of
        now. Creates no consumer (the account limits those, and a listing in a polling loop
        would create them faster than the server removes them): the stream's info names every
        subject that holds a message (``subjects_filter``), and each one's last message is read
        (``LIST_READS`` at a time); a purge marker, or a key gone meanwhile, is left out
        (``deleted``: kept, its value ``None``; a key not listed then held nothing as of the
        listing: revision 0)."""
        keys = await self._subjects(pattern)
        found: dict[str, Stored] = {}
        for start in range(0, len(keys), LIST_READS):
            chunk = keys[start : start + LIST_READS]
            read = await asyncio.gather(*map(self._get, chunk))
            for key, stored in zip(chunk, read, strict=True):
                if stored.data is not None or deleted:
                    found[key] = stored
                if not values:
                    self._cache.pop(key, None)
        return found

    async def _subjects(self, pattern: str) -> list[str]:
        """The keys matching ``pattern`` that hold a message (purge markers included), from the
        stream's info, page by page (the server pages its subject details)."""
        prefix: str = self.kv._pre
        stream: str = self.kv._stream
        jsm = self._js._jsm
        keys: list[str] = []
        while True:
            request = {"subjects_filter": f"{prefix}{pattern}", "offset": len(keys)}
            answer = await jsm._api_request(
                f"{jsm._prefix}.STREAM.INFO.{stream}",
                json.dumps(request).encode(),
                timeout=self._js._timeout,
            )
            subjects = (answer.get("state") or {}).get("subjects") or {}
            keys += sorted(subject.removeprefix(prefix) for subject in subjects)
            if not subjects or len(keys) >= int(answer.get("total") or 0):
                return keys

    # --- writing ----------------------------------------------------------------------------------

    async def _put(self, writes: Sequence[Write]) -> None:
        """Write every one of ``writes`` or none: a plain compare-and-set for one value, an
        atomic batch for several. Caches what it wrote. Raises ``ValueError`` for more than
        ``MAX_BATCH`` writes (nothing sent: ``_put_guarded`` writes more), ``Conflict`` on a
        lost race (counted in ``conflicts``) or a batch the server asks for again, else what
        NATS raised; either way the cached copies of ``writes`` are dropped."""
        if len(writes) > MAX_BATCH:
            raise ValueError(f"{len(writes)} values for one atomic batch; at most {MAX_BATCH}")
        try:
            if len(writes) == 1:
                revisions = [await self._put_one(writes[0])]
            else:
                revisions = await self._put_batch(writes)
        except nats.js.errors.APIError as err:
            for write in writes:
                self._cache.pop(write.key, None)
            if err.err_code in WRONG_LAST_SEQUENCE or err.err_code in BATCH_BUSY:
                self.conflicts += 1
                raise Conflict(str(err)) from err
            raise
        except Exception:
            for write in writes:
                self._cache.pop(write.key, None)
            raise
        for write, revision in zip(writes, revisions, strict=True):
            self._cache[write.key] = (revision, write.value)
            self.bytes_written += len(write.value or b"")
        self.writes += 1
        self.batches += len(writes) > 1
        self.largest_batch = max(self.largest_batch, len(writes))

    async def _put_guarded(self, writes: Sequence[Write], *, guard: str, revision: int) -> None:
        """Write ``writes`` in order, in atomic batches of at most ``MAX_BATCH`` messages,
        each carrying the key ``guard`` too: rewritten (with the time, ``guard_since``) in
        every batch but the last, deleted in the last, each time by compare-and-set on the
        revision the batch before left (the first: ``revision``, read before ``writes`` were
        decided). So every batch lands only while no other guarded write of ``guard`` has
        landed since ``writes`` were decided, and the last of ``writes`` (the caller's commit
        point: the value through which the others are read) lands in the last batch.

        The caller's part: every value but the commit point is read by nobody until the last
        batch lands, and is written only by guarded writes until then. Raises as ``_put``;
        the batches before the one that failed stay written (values nobody reads: the next
        guarded write rewrites or deletes them)."""
        body = list(writes)
        while len(body) > MAX_BATCH - 1:
            chunk, body = body[: MAX_BATCH - 1], body[MAX_BATCH - 1 :]
            since = json.dumps({"since": self.clock()}).encode()
            await self._put([*chunk, Write(guard, since, revision)])
            revision = self._cache[guard][0]
        await self._put([*body, Write(guard, None, revision)])

    async def _purge(self, key: str) -> None:
        """Delete ``key`` whatever its revision (its purge marker expires)."""
        headers = self._headers(Write(key, None, 0))
        del headers[api.Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value]
        ack = await self._js.publish(self._subject(key), b"", headers=headers)
        self._cache[key] = (ack.seq, None)
        self.writes += 1

    @staticmethod
    def _headers(write: Write) -> dict[str, str]:
        headers = {api.Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value: str(write.revision)}
        if write.value is None:
            headers.update(
                {
                    KV_OP: KV_PURGE,
                    api.Header.MSG_TTL.value: str(int(DELETED_MARKER_TTL)),
                }
            )
        return headers

    async def _put_one(self, write: Write) -> int:
        ack = await self._js.publish(
            self._subject(write.key), write.value or b"", headers=self._headers(write)
        )
        return ack.seq

    async def _put_batch(self, writes: Sequence[Write]) -> list[int]:
        """One atomic batch (ADR-50): every message but the last published as is, the last
        with the commit header, as a request whose answer is the batch's ack. The messages
        take consecutive stream sequences, the last one's in the ack."""
        nc = self._js._nc
        batch = uuid.uuid4().hex
        count = len(writes)
        reply = None
        for index, write in enumerate(writes, start=1):
            headers = self._headers(write)
            headers[api.Header.BATCH_ID.value] = batch
            headers[api.Header.BATCH_SEQUENCE.value] = str(index)
            subject, payload = self._subject(write.key), write.value or b""
            if index < count:
                await nc.publish(subject, payload, headers=headers)
            else:
                headers[api.Header.BATCH_COMMIT.value] = "1"
                reply = await nc.request(
                    subject, payload, headers=headers, timeout=self._js._timeout
                )
        assert reply is not None
        answer = json.loads(reply.data)
        if "error" in answer:
            raise nats.js.errors.APIError.from_error(answer["error"])
        if answer.get("count") != count:
            raise nats.js.errors.APIError(description=f"batch ack for {answer.get('count')}")
        last = int(answer["seq"])
        return [last - count + index for index in range(1, count + 1)]

    # --- group commit -----------------------------------------------------------------------------

    async def _submit(self, group: str, payload: Any, attempt: Attempt, *, weight: int = 1) -> Any:
        """Apply the change ``payload`` with the other changes of ``group`` queued meanwhile,
        by ``attempt``, and return its result (or raise its error).

        Changes of one group are group-committed: while a write is in flight, later changes
        queue, and the next attempt applies all of them in order (each caller gets its own
        result), as many as ``BATCH_CHANGES`` and their ``weight`` (the values each names)
        ``BATCH_VALUES`` allow. On a lost race the whole batch is re-applied to the values as
        they now are. A change may therefore be applied several times and must be
        deterministic given the values; it is applied only while its caller still waits.
        """
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(group, []).append((payload, future, weight))
        if group not in self._flushers:
            flusher = asyncio.create_task(self._flush(group, attempt), name=f"ledger-{group}")
            loops.log_failure(flusher, what=f"the ledger writer of {group}")  # nobody awaits it
            self._flushers[group] = flusher
        return await future

    async def _flush(self, group: str, attempt: Attempt) -> None:
        """Write the group's queued changes, batch after batch, until none is left. No caller
        waits for ever on a flusher that is gone: a batch that ends by an error of its own (an
        attempt whose answer does not match its batch: a bug) fails its callers with it and
        the next batch goes on; a flusher cancelled fails every change it writes or that is
        queued (``LedgerUnavailable``)."""
        try:
            while batch := self._take(group, []):
                with contextlib.suppress(Exception):  # its callers heard it (``_write_batch``)
                    await self._write_batch(group, batch, attempt)
        except BaseException:
            _fail(self._pending.pop(group, []), _stopped(group))
            raise
        finally:
            del self._flushers[group]

    def _take(self, group: str, batch: list[_Op]) -> list[_Op]:
        """``batch`` (the changes of an attempt lost) topped up from the group's queue in
        order, at most ``BATCH_CHANGES`` weighing at most ``BATCH_VALUES`` together (a heavier
        one alone), those whose callers gave up left out; the rest stay queued."""
        pending = self._pending.get(group, [])
        batch = [op for op in batch if not op[1].done()]
        weight = sum(op[2] for op in batch)
        taken = 0
        for op in pending[: max(0, BATCH_CHANGES - len(batch))]:
            if (batch or taken) and weight + op[2] > BATCH_VALUES:
                break
            weight += op[2]
            taken += 1
        batch += pending[:taken]
        del pending[:taken]
        if not pending:
            self._pending.pop(group, None)
        return [op for op in batch if not op[1].done()]

    async def _write_batch(self, group: str, batch: list[_Op], attempt: Attempt) -> None:
        """Apply and write ``batch`` (topped up from the queue at each attempt), answering each
        of its callers; one that ends by an error of its own (an attempt whose answer does not
        match the batch), or cancelled, fails them with it (cancelled: ``LedgerUnavailable``)
        before it raises."""
        started = time.monotonic()
        number = 0
        try:
            while number < self.attempts or time.monotonic() - started < self.patience:
                batch = self._take(group, batch)
                if not batch:
                    return
                try:
                    results = await attempt([op[0] for op in batch], number)
                except Conflict:
                    number += 1
                    await asyncio.sleep(random.uniform(0, min(0.02, 0.0002 * 2 ** min(number, 7))))
                    continue
                except Exception as err:  # unreadable values or NATS trouble: every caller hears
                    _fail(batch, err)
                    return
                if results is None:
                    # nothing to write, judged on cached copies: another process may have
                    # changed the values since (a raised limit, a released hold), so the answer
                    # (a refusal, "nothing to repair") counts only once confirmed on a fresh read
                    number += 1
                    continue
                _resolve(batch, results)
                return
        except BaseException as err:
            _fail(batch, err if isinstance(err, Exception) else _stopped(group))
            raise
        lost = f"{number} compare-and-set attempts lost in {time.monotonic() - started:.1f}s"
        _fail(batch, LedgerUnavailable(f"{group}: {lost}"))


def apply_all(fns: Sequence[Callable[[Any], Any]], entry: Any) -> list[tuple[bool, Any]]:
    """Apply each change to ``entry`` in order; each one's (ok, result or error): a bug in one
    change must not sink the others."""
    results: list[tuple[bool, Any]] = []
    for fn in fns:
        try:
            results.append((True, fn(entry)))
        except Exception as err:
            results.append((False, err))
    return results


def guard_since(data: bytes | None) -> float:
    """When the guarded write whose guard (``_put_guarded``) holds ``data`` wrote its last
    batch, epoch seconds (0: no guard, or not one this module wrote)."""
    try:
        since = json.loads(data or b"null")["since"]
    except (ValueError, TypeError, KeyError):
        return 0.0
    return float(since) if isinstance(since, int | float) else 0.0


def _resolve(batch: list[_Op], results: list[tuple[bool, Any]]) -> None:
    for (_, future, _weight), (ok, value) in zip(batch, results, strict=True):
        if future.done():
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


def _stopped(group: str) -> LedgerUnavailable:
    """What the callers of a group's changes hear when its flusher was cancelled."""
    return LedgerUnavailable(f"{group}: the ledger's writer stopped before writing the change")


def _fail(batch: list[_Op], err: BaseException) -> None:
    for _, future, _weight in batch:
        if not future.done():
            future.set_exception(err)
