"""The trajectory API's HTTPS server: TLS that trusts only the front proxy, then one read.

Every request arrives through the kube-apiserver (see ``access``). The TLS layer asks for a
client certificate and verifies any it gets against the cluster's request-header CA; a
request is then authenticated from that certificate and the front proxy's headers, authorised
by a SubjectAccessReview, and answered from NATS with a reader minted for that request's
namespace only (``agentrun.natsauth``: the readers' scoped signing key, the same the operator
holds; the user expires after ``READER_TTL`` seconds), so this process can read no other
namespace's events on behalf of a request. ``/healthz`` answers anyone (probes).

What belongs here: the aiohttp application, the TLS context, the Kubernetes calls (the
front-proxy ConfigMap, SubjectAccessReview) and the NATS reads. Decisions live in ``access``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import ssl
import tempfile
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import cachetools
import nats.errors
from aiohttp import web
from kubernetes_asyncio import client

from agentrun import bus, bytebudget, kube, natsclient
from agentrun.natsauth import authority, jwt
from agentrun.natsauth.permissions import Role
from agentrun.trajectoryapi import access, tenants

log = logging.getLogger("agentrun.trajectoryapi")

READER_TTL = 3600
"""Seconds a per-request NATS reader is valid: a ``follow`` lasts at most this long."""
READ_TIMEOUT = 30.0
"""Seconds a (non-follow) read may wait for NATS to name the run's last event before it is
answered 503."""
ANSWER_TIMEOUT = 55.0
"""Seconds a whole read's answer may take once started (NATS's reads and the writes to the
client): a little under the kube-apiserver's own timeout for a request it does not count as
long-running (60 s by default), which would end it then anyway."""
FOLLOW_LIMIT = READER_TTL - 60
"""Seconds a follow lasts at most: it ends before its reader expires (the client opens it
again), so no connection outlives its credentials."""
KEEPALIVE = 15.0
"""Seconds between blank lines on a quiet follow: a client that left is noticed by the write
(and the API server's proxy keeps the stream open); clients skip blank lines."""
MAX_READS = 16
"""Whole-trajectory reads served at once (each holds the one event it writes, at most the
bus's largest message: ``read_payloads``); more wait up to ``SLOT_WAIT`` seconds for a slot,
then get 429. It takes 8 namespaces holding every read they may, or 8 users, or 4 tenants, to
hold them all."""
READS_PER_NAMESPACE = 2
"""Whole reads of one namespace's runs served at once, and whole reads of one user's: a
namespace whose reads hang (a client that does not read its answer, a slow NATS), or a user
reading in every namespace they may, leaves the others the rest."""
VERDICT_SECONDS = 10.0
"""How long a SubjectAccessReview's verdict (allowed or denied) is reused for the same user,
groups, extra and run: the default of Kubernetes' delegating authoriser, which aggregated API
servers use. A flood of one user's reads asks the API server once per run per this interval,
not once a request; a RoleBinding removed takes up to this long to refuse. A verdict with an
evaluation error is not kept."""
VERDICTS_PER_USER = 64
"""Verdicts kept at most for one user (the least recently made forgotten first): a user asking
about ever new runs forgets their own verdicts, not another user's."""
USERS_KEPT = 64
"""Users whose verdicts are kept at most (the least recently asking forgotten first): with
``VERDICTS_PER_USER``, 4,096 verdicts at most (about 1 KiB each)."""
MAX_REVIEWS = 32
"""SubjectAccessReviews this server asks at once. They are asked as the server's own service
account, so the API server's fairness (API Priority and Fairness) sees one flow whoever they are
made for: without a bound of ours, one user's flood of requests about ever new runs would queue
every other user's review behind its own."""
REVIEWS_PER_USER = 4
"""SubjectAccessReviews asked at once for one user: more wait their turn (``SLOT_WAIT``
seconds at most, then 429 naming the user), and the other users keep the rest."""
REVIEWS_PER_NAMESPACE = 8
"""SubjectAccessReviews asked at once about one namespace's runs, whoever asks: users are
cheap to make (a namespace's admin makes service accounts), so it takes 4 namespaces, not 8
users, to hold every review."""
MAX_FOLLOWS = 64
"""Follows served at once (each holds a NATS connection); more get 429 as above."""
FOLLOWS_PER_NAMESPACE = 8
"""Follows of one namespace's runs served at once, and follows of one user's: a follow lasts
up to ``FOLLOW_LIMIT``, so one namespace's users, or one user of many namespaces, opening
follows would otherwise hold every one of them. It takes 8 namespaces, or 8 users, to hold
them all."""
READS_PER_TENANT = 4
"""Whole reads of the runs of one AgentTenant's namespaces, together, served at once: a tenant
spanning many namespaces holds a quarter of ``MAX_READS``, as many as two of its namespaces,
not 2 a namespace."""
FOLLOWS_PER_TENANT = 16
"""Follows of the runs of one AgentTenant's namespaces, together, served at once: a quarter of
``MAX_FOLLOWS`` (a tenant of 8 namespaces held every follow with 8 each)."""
SLOT_WAIT = 10.0
"""Seconds a request waits for its places before it is answered 429."""
BUDGET_SHARES = 4
"""A tenant's reads and follows hold at most ``EVENT_BUDGET // BUDGET_SHARES`` bytes of
records at once (``bytebudget.Shares``): beyond, they wait for their own records to be written,
and the other tenants keep the rest."""
FOLLOW_BUFFER = 2
"""Event records a follow reads ahead of what its client has taken: what a follow holds is
these and the one it is writing, however long the run (each at most the bus's largest
message), within the server's ``EVENT_BUDGET``."""
EVENT_BUDGET = 32 * 2**20
"""Bytes of event records the server holds at once across every read and follow (a
`bytebudget.ByteBudget`). By count alone that was up to 64 follows × 3 records and 16 reads × 1,
each up to NATS's ``max_payload`` (1 MiB by default), 208 MiB, beside a process of about
100 MiB in a pod limited to 256 MiB (the chart's default). Outside the budget each of those
80 connections may still hold the one event NATS delivered while it waits for room (80 MiB
at most) and its connection's buffers: 100 + 32 + 80 leaves the rest of the limit to them. A
record waits for room before it is made and while it is written; none is dropped or cut.
``--event-budget-mib`` (the chart's ``trajectoryApi.eventBudgetMiB``) sets it: raise it
with the pod's memory limit."""
WRITE_STALL = 30.0
"""Seconds a follow's write may wait for its client to take it (the kube-apiserver, reading
for the user) before the follow ends: a client that stopped reading gives back the budget its
records hold (the plugin opens the follow again and skips what it printed)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Scope:
    """A set of requests with a limit of its own: ``kind`` (``user``, ``tenant``,
    ``namespace``; ``server``: all of them) and its ``name``."""

    kind: str
    name: str


@dataclasses.dataclass(frozen=True, slots=True)
class Full:
    """No place came in time: the first ``scope`` whose ``limit`` places were all held."""

    scope: Scope
    limit: int


class Slots:
    """At most ``total`` requests at once, at most ``limits[kind]`` of each scope a request
    names (its user, its tenant, its namespace): a request takes a place of each of its scopes
    in the order named, then one of all, so one scope's requests wait behind each other, never
    in front of another's. A request names its user first: a user whose places are all held
    waits holding none of a tenant's or a namespace's. A scope nobody holds or waits for is
    forgotten."""

    def __init__(self, total: int, *, limits: Mapping[str, int]) -> None:
        """``limits``: places of one scope of each kind (at most ``total``)."""
        self.total = total
        self.limits = {kind: min(limit, total) for kind, limit in limits.items()}
        self._all = asyncio.Semaphore(total)
        self._scopes: dict[Scope, tuple[asyncio.Semaphore, int]] = {}
        """scope → (its semaphore, holders and waiters)."""

    async def take(self, *scopes: Scope, wait: float) -> Callable[[], None] | Full:
        """A place of each of ``scopes`` and one of all, waiting ``wait`` seconds at most for
        them: the function that gives them back, or the scope that was `Full` when they did
        not come in time."""
        taken: list[asyncio.Semaphore] = []
        order = [*((scope, self._join(scope)) for scope in scopes), (None, self._all)]
        waiting: Scope | None = None
        try:
            async with asyncio.timeout(wait):
                for scope, semaphore in order:
                    waiting = scope
                    await semaphore.acquire()
                    taken.append(semaphore)
        except BaseException as err:
            self._give_back(taken, scopes)
            if isinstance(err, TimeoutError):
                if waiting is None:
                    return Full(Scope("server", ""), self.total)
                return Full(waiting, self.limits[waiting.kind])
            raise
        return functools.partial(self._give_back, taken, scopes)

    def _give_back(self, taken: Sequence[asyncio.Semaphore], scopes: Sequence[Scope]) -> None:
        for semaphore in taken:
            semaphore.release()
        self._leave(scopes)

    def _join(self, scope: Scope) -> asyncio.Semaphore:
        found = self._scopes.get(scope)
        semaphore, users = found or (asyncio.Semaphore(self.limits[scope.kind]), 0)
        self._scopes[scope] = (semaphore, users + 1)
        return semaphore

    def _leave(self, scopes: Sequence[Scope]) -> None:
        for scope in scopes:
            semaphore, users = self._scopes[scope]
            if users <= 1:
                del self._scopes[scope]
            else:
                self._scopes[scope] = (semaphore, users - 1)


def read_slots() -> Slots:
    """The places of whole reads: ``MAX_READS``, of each user and namespace
    ``READS_PER_NAMESPACE``, of each tenant ``READS_PER_TENANT``."""
    return _slots(MAX_READS, per_namespace=READS_PER_NAMESPACE, per_tenant=READS_PER_TENANT)


def follow_slots() -> Slots:
    """The places of follows: ``MAX_FOLLOWS``, of each user and namespace
    ``FOLLOWS_PER_NAMESPACE``, of each tenant ``FOLLOWS_PER_TENANT``."""
    return _slots(MAX_FOLLOWS, per_namespace=FOLLOWS_PER_NAMESPACE, per_tenant=FOLLOWS_PER_TENANT)


def review_slots() -> Slots:
    """The places of SubjectAccessReviews asked at once: ``MAX_REVIEWS``, of each user
    ``REVIEWS_PER_USER``, of each namespace ``REVIEWS_PER_NAMESPACE``."""
    return Slots(MAX_REVIEWS, limits={"user": REVIEWS_PER_USER, "namespace": REVIEWS_PER_NAMESPACE})


class TooManyReviews(Exception):
    """A user's SubjectAccessReviews, or all of them, stayed at their limit for
    ``SLOT_WAIT`` seconds (``full`` names which)."""

    def __init__(self, full: Full) -> None:
        super().__init__(f"{full.scope.kind} {full.scope.name!r}: {full.limit} reviews at once")
        self.full = full


def _verdicts_of_user() -> cachetools.TTLCache[str, dict[str, Any]]:
    return cachetools.TTLCache(VERDICTS_PER_USER, VERDICT_SECONDS)


def _slots(total: int, *, per_namespace: int, per_tenant: int) -> Slots:
    limits = {"user": per_namespace, "namespace": per_namespace, "tenant": per_tenant}
    return Slots(total, limits=limits)


@dataclasses.dataclass(frozen=True, slots=True)
class Reader:
    """How to reach NATS as a reader: the URL, the server's CA, and the readers' signing key
    with the account's public key (the operator Secret's ``reader-signer.nk``,
    ``account.pub``)."""

    url: str
    signer: jwt.NKey
    account: str
    ca_file: Path | None = None

    @classmethod
    def from_files(
        cls, url: str, *, signer_file: Path, account_file: Path, ca_file: Path | None
    ) -> Reader:
        """Read the seed and the account's public key; raises OSError or ValueError."""
        signer = jwt.NKey.from_seed(signer_file.read_text().strip())
        return cls(url, signer, account_file.read_text().strip(), ca_file)


@dataclasses.dataclass(slots=True)
class Server:
    """The application's state: the front proxy it trusts, the Kubernetes client it asks
    SubjectAccessReviews with, and the NATS reader it mints."""

    proxy: access.FrontProxy
    api: client.ApiClient
    reader: Reader
    scratch: Path
    """A private directory (0700) for the per-request creds files nats-py reads."""
    reads: Slots = dataclasses.field(default_factory=lambda: read_slots())
    follows: Slots = dataclasses.field(default_factory=lambda: follow_slots())
    parties: tenants.Parties = dataclasses.field(default_factory=lambda: tenants.Parties(None))
    """Whose share each namespace's requests take (``tenants``)."""
    reviews: Slots = dataclasses.field(default_factory=lambda: review_slots())
    """The SubjectAccessReviews asked at once (``MAX_REVIEWS``, ``REVIEWS_PER_USER``)."""
    verdicts: cachetools.LRUCache[str, cachetools.TTLCache[str, dict[str, Any]]] = (
        dataclasses.field(default_factory=lambda: cachetools.LRUCache(USERS_KEPT))
    )
    """User name → SubjectAccessReview statuses by the review's canonical JSON (``_review``;
    ``VERDICTS_PER_USER`` a user, ``USERS_KEPT`` users)."""
    user_verdicts: Callable[[], cachetools.TTLCache[str, dict[str, Any]]] = _verdicts_of_user
    """Makes one user's verdict cache (``VERDICTS_PER_USER``, ``VERDICT_SECONDS``)."""
    event_bytes: bytebudget.ByteBudget = dataclasses.field(
        default_factory=lambda: bytebudget.ByteBudget(EVENT_BUDGET)
    )
    """The bytes of event records every read and follow hold together (``EVENT_BUDGET``)."""
    shares: bytebudget.Shares | None = None
    """Each party's share of ``event_bytes`` (``BUDGET_SHARES``; made from it when not given)."""

    def __post_init__(self) -> None:
        if self.shares is None:
            self.shares = bytebudget.Shares(self.event_bytes, parts=BUDGET_SHARES)

    def app(self) -> web.Application:
        """The aiohttp application: ``/healthz``, discovery and the trajectory."""
        application = web.Application()
        application.router.add_get("/healthz", _healthz)
        application.router.add_get("/{tail:.*}", self.handle)
        return application

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Route, authenticate, authorise, answer (see the module docstring)."""
        target = access.route(request.path)
        if target is None:
            return _refuse(access.Refusal(404, "NotFound", f"{request.path} is not served"))
        peer = _peer_common_names(request)
        if isinstance(target, access.Discovery) and access.discovery_without_user(
            self.proxy, peer_common_names=peer
        ):
            return web.json_response(access.discovery(target.level))
        user = access.authenticate(
            self.proxy,
            peer_common_names=peer,
            header=lambda name: request.headers.getall(name, []),
            header_names=lambda: list(request.headers.keys()),
        )
        if isinstance(user, access.Refusal):
            return _refuse(user)
        if isinstance(target, access.Discovery):
            return web.json_response(access.discovery(target.level))
        try:
            review = await self._review(user, target)
        except TooManyReviews as err:
            what = "access reviews"
            return _refuse(
                access.too_many(target.namespace, target.name, limit=_limit(err.full, what))
            )
        except (client.ApiException, aiohttp.ClientError, TimeoutError) as err:
            log.warning("access review of %s failed: %r", user.name, err)
            return _refuse(access.review_failed(target.namespace, target.name))
        refusal = access.authorize(user, review, namespace=target.namespace, name=target.name)
        if refusal is not None:
            log.info("refused %s: %s", user.name, refusal.message)
            return _refuse(refusal)
        return await self._serve(request, user, target)

    async def _serve(
        self, request: web.Request, user: access.User, target: access.TrajectoryPath
    ) -> web.StreamResponse:
        """Take the request's places (its user's, its tenant's, its namespace's, one of all)
        and its party's share of the byte budget, then read or follow; 429 naming the scope
        whose places stayed held for ``SLOT_WAIT``."""
        follow = request.query.get("follow") == "true"
        party = await self.parties.party(target.namespace)
        scopes = [Scope("user", user.name)]
        if party.startswith("tenant:"):
            scopes.append(Scope("tenant", party.removeprefix("tenant:")))
        scopes.append(Scope("namespace", target.namespace))
        give_back = await (self.follows if follow else self.reads).take(*scopes, wait=SLOT_WAIT)
        if isinstance(give_back, Full):
            what = "follows" if follow else "reads"
            return _refuse(
                access.too_many(target.namespace, target.name, limit=_limit(give_back, what))
            )
        assert self.shares is not None
        try:
            with self.shares.using(party) as held:
                if follow:
                    return await self._follow(request, target, held)
                return await self._read(request, target, held)
        finally:
            give_back()

    async def _read(
        self, request: web.Request, target: access.TrajectoryPath, held: bytebudget.Bytes
    ) -> web.StreamResponse:
        """The whole trajectory, each event record written as it is read: the run's events are
        never held at once (see ``read_payloads``). 503 when NATS cannot be reached or does not
        name the run's last event within ``READ_TIMEOUT``; once the answer has started, the
        rest (the reads and the writes to the client) gets ``ANSWER_TIMEOUT``, and an answer
        that does not finish in it (a store that stops answering, a client that does not read)
        is cut: its body ends unfinished, which no client takes for a trajectory."""
        async with contextlib.AsyncExitStack() as stack:
            try:
                async with asyncio.timeout(READ_TIMEOUT):
                    reader = await stack.enter_async_context(self._bus(target.namespace))
                    last = await reader.events.last_sequence(
                        target.namespace, target.name, any_replica=True
                    )
            except (TimeoutError, OSError, nats.errors.Error) as err:
                log.warning("reading %s/%s failed: %r", target.namespace, target.name, err)
                return _refuse(access.unavailable(target.namespace, target.name))
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            response.enable_chunked_encoding()
            await response.prepare(request)
            try:
                async with asyncio.timeout(ANSWER_TIMEOUT):
                    await _write_trajectory(response, reader, target, through=last, held=held)
            except (TimeoutError, OSError, nats.errors.Error) as err:
                log.warning("reading %s/%s cut: %r", target.namespace, target.name, err)
                if request.transport is not None:
                    request.transport.close()
            return response

    async def _review(self, user: access.User, target: access.TrajectoryPath) -> dict[str, Any]:
        """The SubjectAccessReview status of ``user`` reading ``target``: made again at most
        every ``VERDICT_SECONDS`` for the same question (``verdicts``), at most
        ``REVIEWS_PER_USER`` of one user's, ``REVIEWS_PER_NAMESPACE`` about one namespace and
        ``MAX_REVIEWS`` in all at once (``reviews``). Raises ``TooManyReviews`` when no place
        came within ``SLOT_WAIT`` seconds, and what the Kubernetes client raises
        (``ApiException``, an ``aiohttp`` error, ``TimeoutError``)."""
        body = access.access_review(user, namespace=target.namespace, name=target.name)
        key = json.dumps(body["spec"], sort_keys=True)
        with contextlib.suppress(KeyError):  # not asked lately (one clock read)
            return self._verdicts_of(user.name)[key]
        scopes = (Scope("user", user.name), Scope("namespace", target.namespace))
        give_back = await self.reviews.take(*scopes, wait=SLOT_WAIT)
        if isinstance(give_back, Full):
            raise TooManyReviews(give_back)
        try:
            with contextlib.suppress(KeyError):  # asked while this one waited for its place
                return self._verdicts_of(user.name)[key]
            reviews = client.AuthorizationV1Api(self.api)
            result = await reviews.create_subject_access_review(
                body,  # type: ignore[arg-type]
                _request_timeout=kube.REQUEST_TIMEOUT,
            )
        finally:
            give_back()
        status: dict[str, Any] = self.api.sanitize_for_serialization(result).get("status") or {}
        if not status.get("evaluationError"):
            self._verdicts_of(user.name)[key] = status
        return status

    def _verdicts_of(self, user: str) -> cachetools.TTLCache[str, dict[str, Any]]:
        """User ``user``'s verdicts (``verdicts``), made empty when not kept (and marked as
        recently asking)."""
        kept = self.verdicts.get(user)
        if kept is None:
            kept = self.verdicts[user] = self.user_verdicts()
        return kept

    async def _follow(
        self, request: web.Request, target: access.TrajectoryPath, held: bytebudget.Bytes
    ) -> web.StreamResponse:
        """One JSON event record a line, every event then each new one, until the client
        goes away (it knows when the run ended) or stops taking them for ``WRITE_STALL``, the
        event store fails (the stream ends; the client opens it again) or ``READER_TTL`` ends
        the reader. Each record read ahead takes its bytes of ``held`` (its party's share of
        ``event_bytes``) first, and gives them back once written. Raises what connecting to
        NATS raises, before anything is sent."""
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        async with self._bus(target.namespace) as reader:
            await response.prepare(request)
            queue: asyncio.Queue[tuple[bytes, int]] = asyncio.Queue(maxsize=FOLLOW_BUFFER)
            reading = asyncio.create_task(
                _read_ahead(reader, target, queue, held), name="trajectory-follow"
            )
            try:
                async with asyncio.timeout(FOLLOW_LIMIT):
                    await _write_followed(response, queue, reading, held)
            except (TimeoutError, OSError, nats.errors.Error) as err:  # the client left or
                # stalled, NATS failed, or the follow reached its limit: the client opens it again
                log.info("follow of %s/%s ended: %r", target.namespace, target.name, err)
            finally:
                reading.cancel()
                await asyncio.gather(reading, return_exceptions=True)
                while not queue.empty():  # read ahead, never written
                    held.give(queue.get_nowait()[1])
        return response

    @asynccontextmanager
    async def _bus(self, namespace: str) -> AsyncIterator[ReaderBus]:
        """A NATS connection as a reader of ``namespace`` alone, minted for this request, with
        the one consumer name its credential may create: its public key
        (``permissions.reader``)."""
        reader = authority.mint_user(
            self.reader.signer,
            account=self.reader.account,
            role=Role.READER,
            name=f"agentrun-trajectory:{namespace}",
            namespace=namespace,
            expires=int(time.time()) + READER_TTL,
        )
        with tempfile.NamedTemporaryFile("w", dir=self.scratch, suffix=".creds") as creds:
            creds.write(reader.text())
            creds.flush()
            auth = natsclient.NatsAuth(creds_file=Path(creds.name), ca_file=self.reader.ca_file)
            nc = await natsclient.connect_nats(
                self.reader.url, name="agentrun-trajectory", auth=auth
            )
            events = bus.Bus(nc, nc.jetstream(timeout=10), bus.BusSettings(url=self.reader.url))
            try:
                yield ReaderBus(events, reader.public)
            finally:
                await events.close()


async def _read_ahead(
    reader: ReaderBus,
    target: access.TrajectoryPath,
    queue: asyncio.Queue[tuple[bytes, int]],
    held: bytebudget.Bytes,
) -> None:
    """Queue the record of each of the run's events, every one then each new one, with the
    bytes it took of ``held``: taken before the record is made (it waits for room there,
    holding the one event NATS delivered), given back by the writer. Neither the event nor
    its record is kept here while the next is awaited (a follow may wait for hours)."""
    payloads = reader.events.follow_payloads(
        target.namespace, target.name, consumer=reader.consumer
    )
    async with contextlib.aclosing(payloads):
        async for seq, payload in payloads:
            taken = await held.take(len(payload) + access.RECORD_EXTRA)
            line = _record(target, seq, payload)
            del payload
            if line is None:
                held.give(taken)
                continue
            try:
                await queue.put((line, taken))
            except BaseException:
                held.give(taken)
                raise
            del line


async def _write_followed(
    response: web.StreamResponse,
    queue: asyncio.Queue[tuple[bytes, int]],
    reading: asyncio.Task[None],
    held: bytebudget.Bytes,
) -> None:
    """Write each record line ``reading`` queues and give its bytes back to ``held`` once
    written, and a blank line after ``KEEPALIVE`` quiet seconds; returns when ``reading``
    ends (raising what ended it). A write to a client that left raises
    (``ConnectionResetError``), one it does not take in ``WRITE_STALL`` ``TimeoutError``."""
    while True:
        try:
            async with asyncio.timeout(KEEPALIVE):
                line, taken = await queue.get()
        except TimeoutError:
            if reading.done():
                reading.result()
                return
            async with asyncio.timeout(WRITE_STALL):
                await response.write(b"\n")
            continue
        try:
            async with asyncio.timeout(WRITE_STALL):
                await response.write(line)
                await response.write(b"\n")
        finally:
            del line
            held.give(taken)


async def _write_trajectory(
    response: web.StreamResponse,
    reader: ReaderBus,
    target: access.TrajectoryPath,
    *,
    through: int,
    held: bytebudget.Bytes,
) -> None:
    """Write the ``AgentRunTrajectory`` object, its events up to the sequence ``through``
    (``read_payloads``) one record at a time, each holding its bytes of ``held`` until it is
    written, and end the answer."""
    empty = json.dumps(access.trajectory(target.namespace, target.name, []))
    head, _, tail = empty.rpartition("[]")
    await response.write(f"{head}[".encode())
    separator = b""
    payloads = read_payloads(reader, target.namespace, target.name, through=through)
    async with contextlib.aclosing(payloads):
        async for seq, payload in payloads:
            async with held.holding(len(payload) + access.RECORD_EXTRA):
                line = _record(target, seq, payload)
                del payload  # not kept while the next event is awaited
                if line is not None:
                    await response.write(separator)
                    await response.write(line)
                    separator = b","
                del line
    await response.write(f"]{tail}".encode())
    await response.write_eof()


@dataclasses.dataclass(frozen=True, slots=True)
class ReaderBus:
    """A namespace reader's bus and the one consumer name its credential may create."""

    events: bus.Bus
    consumer: str


async def read_payloads(
    reader: ReaderBus, namespace: str, name: str, *, through: int
) -> AsyncGenerator[tuple[int, bytes], None]:
    """``(stream sequence, payload)`` of every event of the run up to the sequence
    ``through`` (its last event's when the read began: ``Bus.last_sequence``, a direct get any
    replica may answer, so at worst an event committed a moment ago is left for the next
    read), oldest first, read as a reader may (an ordered consumer on the run's subject). One
    payload at a time, as stored and never parsed: what a read holds is the event it is
    writing, however long the run."""
    if through <= 0:
        return
    payloads = reader.events.follow_payloads(namespace, name, consumer=reader.consumer)
    async with contextlib.aclosing(payloads):
        async for seq, payload in payloads:
            yield seq, payload
            if seq >= through:
                return


def _record(target: access.TrajectoryPath, seq: int, payload: bytes) -> bytes | None:
    """``access.record``, or None (logged) for a payload that is not an event's."""
    try:
        return access.record(seq, payload)
    except ValueError as err:
        log.warning("%s/%s: left out: %s", target.namespace, target.name, err)
        return None


def _refuse(refusal: access.Refusal) -> web.Response:
    headers = {} if refusal.retry_after is None else {"Retry-After": str(refusal.retry_after)}
    return web.json_response(refusal.status(), status=refusal.code, headers=headers)


def _limit(full: Full, what: str) -> str:
    """The limit a request found full, in the 429's words."""
    scope = full.scope
    if scope.kind == "server":
        return f"the server serves at most {full.limit} trajectory {what} at once"
    whose = {"user": "user", "tenant": "AgentTenant", "namespace": "namespace"}[scope.kind]
    return f"{whose} {scope.name!r} holds its {full.limit} trajectory {what} at once"


async def _healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok")


def _peer_common_names(request: web.Request) -> list[str] | None:
    """The common names of the client certificate the TLS layer verified; None if none."""
    transport = request.transport
    peer = transport.get_extra_info("peercert") if transport is not None else None
    if not peer:
        return None
    return [value for rdn in peer.get("subject", ()) for key, value in rdn if key == "commonName"]


def tls_context(*, cert_file: Path, key_file: Path, client_ca: str) -> ssl.SSLContext:
    """A server context with ``cert_file``/``key_file`` that asks every client for a
    certificate and verifies any it gets against ``client_ca`` (PEM); a client without one
    gets through TLS (for ``/healthz``) and is refused 401 by `access.authenticate`."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert_file), str(key_file))
    context.load_verify_locations(cadata=client_ca)
    context.verify_mode = ssl.CERT_OPTIONAL
    return context


async def front_proxy(api: client.ApiClient, *, trust_any_name: bool) -> access.FrontProxy:
    """The cluster's front-proxy configuration (``kube-system/extension-apiserver-
    authentication``), logged once when its headers cannot be believed
    (`access.FrontProxy.untrusted`, naming the fix) or are believed only by the opt-in
    ``trust_any_name``. Raises ApiException (e.g. 403 without the
    ``extension-apiserver-authentication-reader`` Role) or ValueError (see
    `access.FrontProxy.from_configmap`)."""
    configmap = await client.CoreV1Api(api).read_namespaced_config_map(
        access.CONFIGMAP_NAME, access.CONFIGMAP_NAMESPACE
    )
    proxy = access.FrontProxy.from_configmap(configmap.data or {}, trust_any_name=trust_any_name)
    if (why := proxy.untrusted()) is not None:
        log.error("every trajectory read will be refused (401): %s", why)
    elif proxy.shares_cluster_ca:
        log.warning(
            "believing any client certificate of the cluster's client CA as the front proxy "
            "(--trust-any-front-proxy-certificate): any user holding one may claim to be anyone"
        )
    return proxy
