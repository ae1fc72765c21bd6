"""Kubernetes Events: the moments a person looks for in ``kubectl describe`` and event
exporters, recorded rate-limited and never once per turn.

What belongs here: the involved-object reference, the throttle (one event per object and
occasion per ``repeat_after`` seconds, a token bucket per namespace and one over all) and the
background poster (core/v1 Events; a repeat of an occasion already posted raises that
Event's ``count`` like client-go's recorder, instead of adding another). What does not:
deciding when an occasion happens (the dispatcher, the pump, the sweep, the controllers and
the handlers call ``record``) nor the wording of a kind's occasions (its own modules).

kopf's own ``kopf.event`` works only inside a handler's context (its queue is a per-object
context variable); the dispatcher and the pump run outside handlers, hence this recorder.
Posting never blocks the caller and never raises into it: a full queue or an API error drops
the event with a log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import socket
import time
from collections.abc import Callable, Hashable
from typing import Any

import cachetools

from agentrun import display, kube

from .conditions import rfc3339
from .kubeapi import ApiError, KubeApi, Ref

log = logging.getLogger(__name__)

COMPONENT = "agentrun-operator"
"""``source.component`` / ``reportingComponent`` of every event (kubectl's "From" column)."""
MAX_MESSAGE = 1024
CLUSTER_EVENTS_NAMESPACE = "default"
"""Where events about cluster-scoped objects (AgentModel) go, as client-go does: every
tenant's people may read them there, so their messages name no tenant, run or namespace."""
PRIVATE_KINDS = frozenset({"AgentTenant"})
"""Cluster-scoped kinds whose Events carry one tenant's figures (its name, its window's use,
its limits, a rollback of its ledger): posted in the operator's own namespace
(``EventRecorder.private_namespace``), not in ``default``, where another tenant would read
them. The API server takes an Event whose ``involvedObject`` has no namespace only in
``default`` (core/v1 Event validation: ``involvedObject.namespace ... does not match
event.namespace``, HTTP 422), so such an Event names that namespace as its object's; ``kubectl
get events -n NS --field-selector involvedObject.kind=AgentTenant`` lists them, ``kubectl
describe agenttenant`` does not."""
PLURALS = {"AgentRun": kube.RUNS, "AgentTenant": kube.TENANTS, "AgentModel": kube.MODELS}
"""Custom kinds whose uid the poster can look up when a reference lacks it."""


class EventType(enum.StrEnum):
    """An event's ``type``."""

    NORMAL = "Normal"
    WARNING = "Warning"


@dataclasses.dataclass(frozen=True, slots=True)
class Involved:
    """The object an event is about (``involvedObject``); ``namespace`` empty for
    cluster-scoped kinds; ``uid`` empty: looked up before posting (``kubectl describe`` finds
    events by uid)."""

    kind: str
    name: str
    namespace: str = ""
    uid: str = ""

    def reference(self, uid: str) -> dict[str, str]:
        """The ``involvedObject`` as JSON, with ``uid`` (empty: none)."""
        ref = {"apiVersion": f"{kube.GROUP}/{kube.VERSION}", "kind": self.kind, "name": self.name}
        if self.namespace:
            ref["namespace"] = self.namespace
        if uid:
            ref["uid"] = uid
        return ref


@dataclasses.dataclass(frozen=True, slots=True)
class Occasion:
    """One event to post."""

    involved: Involved
    type: EventType
    reason: str
    """CamelCase, e.g. ``Admitted``."""
    message: str
    key: Hashable
    """What counts as the same occasion (throttled together, aggregated into one Event)."""


@dataclasses.dataclass(slots=True)
class _Bucket:
    """A token bucket: ``tokens`` as of ``at`` (monotonic seconds; ``None``: full, untouched)."""

    tokens: float
    at: float | None = None

    def refill(self, now: float, *, rate: float, burst: int) -> None:
        """Add what ``rate`` gave since it was last refilled, at most ``burst``."""
        if self.at is not None:
            self.tokens = min(float(burst), self.tokens + (now - self.at) * rate)
        self.at = now


class Throttle:
    """Decides which occasions are posted. Pure: ``now`` is passed in (monotonic seconds).

    Three limits, all of which an occasion must pass: its key at most once per
    ``repeat_after`` seconds; its namespace (the involved object's; "" for cluster-scoped
    objects) at most ``namespace_rate`` events a second, ``namespace_burst`` at once; and
    ``rate`` a second, ``burst`` at once, over all. The namespace's share is below the whole, so
    one namespace that floods (many runs failing at once, say) uses up its own bucket, not
    every tenant's: another namespace's events are still posted. The recorder may pass a
    tenant's share for its namespaces (``EventRecorder.share_of``), so a tenant spread over
    many namespaces floods one bucket, not the whole.
    """

    def __init__(
        self,
        *,
        repeat_after: float,
        rate: float,
        burst: int,
        namespace_rate: float | None = None,
        namespace_burst: int | None = None,
        memory: int = 10_000,
    ):
        """See the class; ``namespace_rate``/``namespace_burst`` ``None``: the overall ones
        (no namespace limit beyond the whole); remember ``memory`` keys and namespaces."""
        self.repeat_after = repeat_after
        self.rate = rate
        self.burst = burst
        self.namespace_rate = rate if namespace_rate is None else namespace_rate
        self.namespace_burst = burst if namespace_burst is None else namespace_burst
        self.memory = memory
        self._all = _Bucket(float(burst))
        self._namespaces: cachetools.LRUCache[str, _Bucket] = cachetools.LRUCache(memory)
        """Each namespace's bucket; one forgotten is full again, as if it had been quiet."""
        self._last: cachetools.LRUCache[Hashable, float] = cachetools.LRUCache(memory)
        """When each key was last allowed."""

    def allow(self, key: Hashable, now: float, *, namespace: str = "") -> bool:
        """Whether an occasion with ``key`` about an object in ``namespace`` may be posted at
        ``now``; takes a token from its namespace's bucket and the overall one if so."""
        last = self._last.get(key)
        if last is not None and now - last < self.repeat_after:
            return False
        mine = self._namespaces.get(namespace) or _Bucket(float(self.namespace_burst))
        self._namespaces[namespace] = mine
        mine.refill(now, rate=self.namespace_rate, burst=self.namespace_burst)
        self._all.refill(now, rate=self.rate, burst=self.burst)
        if mine.tokens < 1 or self._all.tokens < 1:
            return False
        mine.tokens -= 1
        self._all.tokens -= 1
        self._last[key] = now
        return True


def standard_throttle() -> Throttle:
    """The operator's throttle: an occasion (object and reason, or a finer key) at most once a
    minute; a namespace at most 2 events a second (25 at once), all namespaces together 10 a
    second (100 at once)."""
    return Throttle(repeat_after=60.0, rate=10.0, burst=100, namespace_rate=2.0, namespace_burst=25)


@dataclasses.dataclass(slots=True)
class _Posted:
    name: str
    namespace: str
    count: int


def events_namespace(involved: Involved, *, private: str) -> str:
    """The namespace the Event about ``involved`` is posted in: the object's own; for a
    cluster-scoped one ``CLUSTER_EVENTS_NAMESPACE``, but ``private`` for ``PRIVATE_KINDS``."""
    if involved.namespace:
        return involved.namespace
    return private if involved.kind in PRIVATE_KINDS else CLUSTER_EVENTS_NAMESPACE


class EventRecorder:
    """Queues occasions (``record``, never blocking) and posts them (``run``)."""

    def __init__(
        self,
        api: KubeApi,
        *,
        throttle: Throttle,
        queue_size: int = 1000,
        clock: Callable[[], float] = time.time,
        share_of: Callable[[str], str] | None = None,
        private_namespace: str = CLUSTER_EVENTS_NAMESPACE,
    ) -> None:
        """``api``: where events are posted; ``clock``: epoch seconds (timestamps and the
        throttle); ``share_of``: whose bucket of the throttle a namespace's events take (its
        tenant's, shared by the tenant's namespaces, where it is known; default: its own);
        ``private_namespace``: where the Events of ``PRIVATE_KINDS`` go (the operator's own
        namespace: ``AGENTRUN_LEASE_NAMESPACE``, the chart's release namespace)."""
        self.api = api
        self.private_namespace = private_namespace
        self.throttle = throttle
        self.share_of = share_of
        self.clock = clock
        self.posted = 0
        self.dropped = 0
        self.instance = socket.gethostname()
        self._queue: asyncio.Queue[tuple[Occasion, float]] = asyncio.Queue(queue_size)
        self._events: cachetools.LRUCache[Hashable, _Posted] = cachetools.LRUCache(throttle.memory)
        """The Event posted for each occasion key, to count its repeats on."""
        self._uids: dict[tuple[str, str], str] = {}

    def record(
        self,
        involved: Involved,
        *,
        type: EventType,
        reason: str,
        message: str,
        key: Hashable | None = None,
    ) -> None:
        """Queue an event unless the throttle holds it back. ``key`` (default: the object and
        ``reason``) says which occasions are the same one. The message may quote model or
        tool text: its terminal controls are written as visible escapes
        (``display.printable``), since ``kubectl describe`` prints it as it is."""
        shown = display.printable(message)[:MAX_MESSAGE]
        occasion = Occasion(involved, type, reason, shown, key or (involved, reason))
        now = self.clock()
        share = self.share_of(involved.namespace) if self.share_of else involved.namespace
        if not self.throttle.allow(occasion.key, now, namespace=share):
            self.dropped += 1
            return
        try:
            self._queue.put_nowait((occasion, now))
        except asyncio.QueueFull:
            self.dropped += 1
            log.warning("event queue full; dropped %s %s", reason, involved.name)

    async def run(self) -> None:
        """Post queued events, one at a time, forever."""
        while True:
            occasion, at = await self._queue.get()
            try:
                await self.post(occasion, at=at)
            except Exception as err:  # an event is never worth a crash
                log.warning(
                    "could not post event %s on %s: %r",
                    occasion.reason,
                    occasion.involved.name,
                    err,
                )

    async def drain(self) -> None:
        """Post what is queued now (tests, shutdown)."""
        while not self._queue.empty():
            occasion, at = self._queue.get_nowait()
            with contextlib.suppress(Exception):
                await self.post(occasion, at=at)

    async def post(self, occasion: Occasion, *, at: float) -> None:
        """Create the Event, or raise the count of the one posted for the same key; raises
        ``ApiError``."""
        log.info(
            "event %s %s on %s %s: %s",
            occasion.type,
            occasion.reason,
            occasion.involved.kind,
            occasion.involved.name,
            occasion.message,
        )
        involved = occasion.involved
        namespace = events_namespace(involved, private=self.private_namespace)
        seen = self._events.get(occasion.key)
        if seen is not None:
            seen.count += 1
            body = {"count": seen.count, "lastTimestamp": rfc3339(at), "message": occasion.message}
            try:
                await self.api.patch_event(seen.namespace, seen.name, body)
                self.posted += 1
                return
            except ApiError as err:
                if err.status != 404:  # expired (events live an hour by default): create anew
                    raise
        uid = involved.uid or await self._uid_of(involved)
        name = f"{involved.name}.{time.time_ns():x}"[-253:].lstrip(".-")
        event = self._event(occasion, name=name, namespace=namespace, uid=uid, at=at)
        await self.api.create_event(namespace, event)
        self.posted += 1
        self._events[occasion.key] = _Posted(name, namespace, 1)

    def _event(
        self, occasion: Occasion, *, name: str, namespace: str, uid: str, at: float
    ) -> dict[str, Any]:
        """A new core/v1 Event for ``occasion`` as JSON (count 1, first and last seen ``at``)."""
        stamp = rfc3339(int(at))
        involved = occasion.involved.reference(uid)
        if namespace != CLUSTER_EVENTS_NAMESPACE:
            involved["namespace"] = namespace  # the API server's rule (`PRIVATE_KINDS`)
        return {
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": involved,
            "type": occasion.type.value,
            "reason": occasion.reason,
            "message": occasion.message,
            "count": 1,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "source": {"component": COMPONENT, "host": self.instance},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.instance,
        }

    async def _uid_of(self, involved: Involved) -> str:
        """The object's uid, read once per object; "" when it cannot be read."""
        plural = PLURALS.get(involved.kind)
        cached = self._uids.get((involved.kind, involved.name))
        if cached is not None or plural is None or involved.namespace:
            return cached or ""
        try:
            obj = await self.api.get(Ref(plural, involved.name))
        except ApiError:
            return ""
        if obj is None:
            return ""
        uid = str(obj.get("metadata", {}).get("uid", ""))
        self._uids[(involved.kind, involved.name)] = uid
        return uid
