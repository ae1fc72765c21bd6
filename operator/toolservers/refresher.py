"""Discovering AgentToolServers' tools in the background and writing their ``.status``.

``ToolServerRefresher`` runs one discovery task per server (talking to the MCP server through
``agentrun.tools.remote``), each bounded by the server's own discovery timeout (a hard bound:
connect, handshake and every page), so a server that hangs delays nothing but its own status.
Discoveries share ``CONCURRENCY`` slots (``DiscoverySlots``), at most ``PER_NAMESPACE`` of them
held by the servers of one namespace and at most ``PER_TENANT`` by those of one tenant, every
namespace of it together (the default tenant's too): servers that hang hold their namespace's
and their tenant's share, never more than a third of the slots, however many namespaces a
tenant spreads them over, so another tenant's servers are still discovered at once, and
another namespace of the same tenant within the tenant's share.
A server's next discovery is due ``spec.refreshInterval`` after its last began, plus up to
``JITTER`` of the interval drawn anew each time (as client-go's ``wait.Jitter``): servers made
together, or found together when the operator starts, do not keep refreshing in the same tick.
A failed refresh keeps the last good list (runs keep being admitted with it) and says so in the
condition. A server whose URL its namespace's tenant does not allow (``spec.toolServers``) is
never contacted: ``Ready=False``, reason ``NotAllowed``, no tools; an allowed one is reached
only at addresses its rule allows (``agentrun.tools.reach``), every request of its session
under the rule's path prefix (``agentrun.tools.endpoint.Bounds``), its ``headersFrom`` Secret
read for the listed keys only. The operator's kopf handlers only tell the refresher about objects
(``observe``/``forget``); no finalizer is involved, so deleting an AgentToolServer never waits
for the operator.

What does not belong here: the spec's shape (``spec``), the status bodies (``status``) and
resolving a run's ``SERVER/TOOL`` names at admission (``resolve``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Protocol

from agentrun import display, kernel, loops, peers
from agentrun.kernel import schemas
from agentrun.protocol import UrlRule
from agentrun.tools import remote

from ..platform.failures import Failures
from ..platform.fairwork import FairWork
from ..platform.kubeapi import ApiError, KubeApi, Ref
from ..platform.spec import ObjectMeta, SpecError
from ..platform.weighed import WeighedCache
from .resolve import url_rule
from .spec import TOOL_SERVERS, AgentToolServerSpec
from .status import Reason, discovered_status, failed_status, keep_transition, refused_status

log = logging.getLogger(__name__)

CONCURRENCY = 24
"""Discoveries running at once, over all namespaces."""
PER_TENANT = 8
"""Discoveries of the servers of one tenant's namespaces running at once (a third of all: what
one tenant's hanging servers can hold, over any number of its namespaces; two tenants' still
leave a third)."""
PER_NAMESPACE = 4
"""Discoveries of one namespace's servers running at once."""


class _Shares:
    """At most ``limit`` holders of each key at once, the waiters first come first served; a
    key nobody holds or waits for is forgotten."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._keys: dict[str, tuple[asyncio.Semaphore, int]] = {}
        """key → (its semaphore, holders and waiters)."""

    @contextlib.asynccontextmanager
    async def held(self, key: str) -> AsyncIterator[None]:
        """Hold one of ``key``'s places (waiting for one) for the block."""
        semaphore, users = self._keys.get(key) or (asyncio.Semaphore(self.limit), 0)
        self._keys[key] = (semaphore, users + 1)
        try:
            async with semaphore:
                yield
        finally:
            semaphore, users = self._keys[key]
            if users <= 1:
                del self._keys[key]
            else:
                self._keys[key] = (semaphore, users - 1)

    def users(self, key: str) -> int:
        """Holders and waiters of ``key``."""
        return self._keys.get(key, (None, 0))[1]


class DiscoverySlots:
    """At most ``total`` discoveries at once, at most ``per_tenant`` of one tenant's servers
    and ``per_namespace`` of one namespace's.

    A discovery first takes a slot of its namespace (``of_namespace``), learns its namespace's
    tenant while it holds it, then takes one of that tenant and one of all (``of_tenant``):
    the servers of one namespace or tenant wait for their own slots, not in front of others'
    servers, and the shared slots go first come first served among those within their shares.
    """

    def __init__(self, total: int, *, per_namespace: int, per_tenant: int | None = None) -> None:
        """``per_tenant`` defaults to ``total``. Raises ``ValueError`` unless
        ``0 < per_namespace <= per_tenant <= total``."""
        per_tenant = total if per_tenant is None else per_tenant
        if not 0 < per_namespace <= per_tenant <= total:
            raise ValueError(
                f"need 0 < per_namespace ({per_namespace}) <= per_tenant ({per_tenant}) "
                f"<= total ({total})"
            )
        self._all = asyncio.Semaphore(total)
        self._namespaces = _Shares(per_namespace)
        self._tenants = _Shares(per_tenant)

    @classmethod
    def standard(cls) -> DiscoverySlots:
        """The operator's: ``CONCURRENCY`` in all, ``PER_TENANT`` of one tenant's servers,
        ``PER_NAMESPACE`` of one namespace's."""
        return cls(CONCURRENCY, per_namespace=PER_NAMESPACE, per_tenant=PER_TENANT)

    def of_namespace(self, namespace: str) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold a slot of ``namespace``, waiting for one, for the block (``async with``)."""
        return self._namespaces.held(namespace)

    @contextlib.asynccontextmanager
    async def of_tenant(self, tenant: str) -> AsyncIterator[None]:
        """Hold a slot of ``tenant`` and then one of all, waiting for each, for the block;
        inside ``of_namespace`` of the discovery's namespace."""
        async with self._tenants.held(tenant), self._all:
            yield

    def users(self, namespace: str) -> int:
        """Discoveries of ``namespace`` holding or waiting for a slot."""
        return self._namespaces.users(namespace)

    def tenant_users(self, tenant: str) -> int:
        """Discoveries counted against ``tenant`` holding or waiting for its slot (not those
        still waiting for their namespace's)."""
        return self._tenants.users(tenant)


class ReachRules(Protocol):
    """The tenant of a namespace and its ``spec.toolServers.allow`` rules (the tenants'
    port, given by the wiring)."""

    async def __call__(self, namespace: str) -> tuple[str, Sequence[UrlRule]]:
        """(tenant name, rules); raises ``LookupError`` saying why the namespace has no
        tenant, ``ApiError`` when its labels cannot be read."""
        ...


@dataclasses.dataclass
class _Known:
    """What the refresher knows of one AgentToolServer (small whatever its object: the object
    itself is kept within ``BODIES_MEMORY``)."""

    generation: int
    interval: float | None
    """``spec.refreshInterval`` in seconds (``None``: the spec does not parse)."""
    refreshed_at: float | None = None
    """Monotonic seconds of our last discovery attempt (``None``: none yet)."""
    refreshed_generation: int = 0
    running: asyncio.Task[None] | None = None
    jitter: float = 0.0
    """Seconds added to ``interval`` before the next discovery is due (``JITTER``)."""

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> _Known:
        """What to know of ``body`` (an AgentToolServer as a dict)."""
        try:
            interval = AgentToolServerSpec.of(body.get("spec")).refresh_interval.seconds
        except SpecError:
            interval = None  # an invalid spec is reported once per generation
        return cls(ObjectMeta.of(body).generation, interval)


TICK = 2.0
"""Seconds between two looks for AgentToolServers due a discovery."""
JITTER = 0.1
"""The most a server's next discovery comes after ``spec.refreshInterval``, as a fraction of
it, drawn at each discovery."""
BODIES_MEMORY = 64 * 2**20
"""Bytes of AgentToolServer objects kept as last seen, about (each weighed by
``schemas.footprint``; the least recently used forgotten first; one forgotten is read again,
one GET, when its discovery is due). Each object's status holds its tools' input schemas and
descriptions as the server listed them (up to 512 KiB of schemas' JSON: some 11 MiB parsed, of
dense ones): kept whole for every server, a tenant's 100 servers held a gigabyte."""


class ToolServerRefresher:
    """Discovers every known AgentToolServer when it appears, when its spec changes and every
    ``spec.refreshInterval``, and writes its status."""

    def __init__(
        self,
        api: KubeApi,
        *,
        reach: ReachRules,
        slots: DiscoverySlots | None = None,
        max_timeout: float = 30.0,
        checks: FairWork | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``reach``: the rules a server's URL must meet (its namespace's tenant's);
        ``slots``: the discoveries
        running at once (default: ``DiscoverySlots.standard``; the others wait their turn, none
        blocks anything else); ``max_timeout``: the most seconds one discovery may take (the
        platform's cap on ``spec.timeouts.discovery``); ``checks``: the threads the discovered
        input schemas are checked on (default: threads of its own)."""
        self._api = api
        self._reach = reach
        self._max_timeout = max_timeout
        self._tick = TICK
        self._clock = clock
        self._known: dict[tuple[str, str], _Known] = {}
        self._bodies: WeighedCache[tuple[str, str], Mapping[str, Any]] = WeighedCache(
            BODIES_MEMORY, schemas.footprint
        )
        """The objects as last seen, ``BODIES_MEMORY`` at most (one forgotten is read again)."""
        self._kick = asyncio.Event()
        self._stopping = asyncio.Event()
        self.failures = Failures(log, what="status write")
        """Servers whose status could not be written (each logged once)."""
        self.discoveries = Failures(log, what="discovery")
        """Servers whose discovery failed by an error no branch of it expects (a bug, a fault
        of a kind nobody named; each logged once, with its traceback)."""
        self._slots = slots or DiscoverySlots.standard()
        self._checks = checks or FairWork()

    def observe(self, body: Mapping[str, Any]) -> None:
        """An AgentToolServer was listed, added or changed (a kopf watch event)."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        seen = _Known.of(body)
        known = self._known.get(key)
        if known is None:
            self._known[key] = seen
        else:
            known.generation, known.interval = seen.generation, seen.interval
        self._bodies[key] = body
        self._kick.set()

    def forget(self, namespace: str, name: str) -> None:
        """An AgentToolServer was deleted: stop refreshing it."""
        known = self._known.pop((namespace, name), None)
        self._bodies.pop((namespace, name), None)
        self.discoveries.forget((namespace, name))
        if known is not None and known.running is not None:
            known.running.cancel()

    def stop(self) -> None:
        """End ``run`` after its current tick; cancel discoveries in flight."""
        self._stopping.set()
        self._kick.set()
        for known in self._known.values():
            if known.running is not None:
                known.running.cancel()

    def _due(self, known: _Known, now: float) -> bool:
        if known.running is not None and not known.running.done():
            return False
        if known.refreshed_at is None or known.refreshed_generation != known.generation:
            return True
        if known.interval is None:
            return False  # an invalid spec is reported once per generation
        return now - known.refreshed_at >= known.interval + known.jitter

    async def run(self) -> None:
        """Start a discovery task for each due server, every ``tick`` seconds (or at once when
        an object is observed), until ``stop``."""
        await loops.every(
            self._tick,
            self._start_due,
            what="tool server refresh",
            stopping=self._stopping,
            wake=self._kick,
        )

    async def _start_due(self) -> None:
        """Start a discovery task for each server due now."""
        now = self._clock()
        for key, known in list(self._known.items()):
            if self._due(known, now):
                known.refreshed_at = now
                known.refreshed_generation = known.generation
                known.jitter = (known.interval or 0.0) * JITTER * random.random()
                known.running = asyncio.create_task(
                    self._refresh_key(key), name=f"discover {key[0]}/{key[1]}"
                )
                what = f"discovery of AgentToolServer {key[0]}/{key[1]}"
                loops.log_failure(known.running, what=what)  # ``refresh`` raises nothing

    async def _refresh_key(self, key: tuple[str, str]) -> None:
        """``refresh`` the AgentToolServer ``key`` as last seen, read again when its object
        was forgotten (``BODIES_MEMORY``): one found gone is forgotten, one that cannot be
        read now is tried again at the next tick."""
        body = self._bodies.get(key)
        if body is None:
            try:
                body = await self._api.get(Ref(TOOL_SERVERS, key[1], key[0]))
            except ApiError as err:
                known = self._known.get(key)
                if known is not None:
                    known.refreshed_at = None  # due again
                subject = f"AgentToolServer {key[0]}/{key[1]}"
                self.discoveries.failed(key, err, subject=subject)  # logged once
                return
            if body is None:
                self.forget(*key)
                return
        await self.refresh(body)

    async def refresh(self, body: Mapping[str, Any]) -> None:
        """Discover one server and write its status; never raises (failures are logged, and
        a discovery's unexpected error is a failed discovery: ``_discovered``)."""
        meta = body.get("metadata") or {}
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        generation = int(meta.get("generation") or 1)
        previous = body.get("status") or {}
        now = time.time()
        ref = Ref(TOOL_SERVERS, name, namespace)
        try:
            spec = AgentToolServerSpec.of(body.get("spec"))
        except SpecError as err:
            status = failed_status({}, str(err), generation=generation, now=now)
            status["conditions"][0]["reason"] = Reason.INVALID_SPEC
        else:
            status = await self._discovered(spec, ref, generation=generation, previous=previous)
        try:
            await self._api.patch_status(ref, keep_transition(status, previous))
        except Exception as err:
            await self._not_written(ref, err, previous=previous, generation=generation)
            return
        self.failures.succeeded((namespace, name), subject=f"AgentToolServer {namespace}/{name}")

    async def _discovered(
        self, spec: AgentToolServerSpec, ref: Ref, *, generation: int, previous: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The status of one discovery of ``spec``'s server (``ref``), in its namespace's slot
        (``_discover``). An error no branch of it expects (a bug, a fault of a kind nobody
        named) is a failed discovery too: logged once naming the server, with its traceback
        (``discoveries``), the status says it (``Ready=False``, ``DiscoveryFailed``, or
        ``RefreshFailed`` keeping the last good list), and the next refresh tries again,
        rather than ending the discovery's task unseen with the status unwritten."""
        subject = f"AgentToolServer {ref.namespace}/{ref.name}"
        try:
            with peers.serving(ref.namespace, ref.name):  # what the SDK logs, by server
                async with self._slots.of_namespace(ref.namespace):
                    status = await self._discover(
                        spec, ref.namespace, generation=generation, previous=previous
                    )
        except Exception as err:
            self.discoveries.failed((ref.namespace, ref.name), err, subject=subject)
            # a Secret value the error quotes is taken out before the cut (``display.KNOWN``)
            text = display.KNOWN.redact(f"{type(err).__name__}: {err}")
            why = f"discovery failed: {text}; tried again at the next refresh"
            return failed_status(previous, why[:1000], generation=generation, now=time.time())
        self.discoveries.succeeded((ref.namespace, ref.name), subject=subject)
        return status

    async def _not_written(
        self, ref: Ref, err: Exception, *, previous: Mapping[str, Any], generation: int
    ) -> None:
        """The status write failed: gone (404) is fine; a transient failure waits for the next
        refresh; a status refused as it is (too large, invalid: e.g. input schemas the API
        server cannot store) is replaced by a failed one saying so, keeping the last good
        list. Logged once per server."""
        if isinstance(err, ApiError) and err.status == 404:
            return
        subject = f"AgentToolServer {ref.namespace}/{ref.name}"
        failure = self.failures.failed((ref.namespace, ref.name), err, subject=subject)
        if failure.transient:
            return
        message = f"what discovery found could not be written to the status ({err})"
        body = failed_status(previous, message[:1000], generation=generation, now=time.time())
        try:
            await self._api.patch_status(ref, keep_transition(body, previous))
        except Exception as again:  # refused too: the log says it, once
            self.failures.failed((ref.namespace, ref.name, "failed"), again, subject=subject)

    async def _discover(
        self,
        spec: AgentToolServerSpec,
        namespace: str,
        *,
        generation: int,
        previous: Mapping[str, Any],
    ) -> dict[str, Any]:
        """The status of one discovery of ``spec``'s server, within its namespace's slot:
        refused (its namespace has no tenant, or its tenant does not allow its URL) or failed
        (its tenant cannot be read) without contacting it; otherwise discovered within its
        tenant's share of the slots, the tenant read once for both."""
        try:
            tenant, rules = await self._reach(namespace)
            rule = url_rule(spec.url, rules, tenant=tenant)
        except (LookupError, SpecError) as err:
            return refused_status(str(err), generation=generation, now=time.time())
        except ApiError as err:
            why = f"the tenant of namespace {namespace} cannot be read: HTTP {err.status}"
            return failed_status(previous, why, generation=generation, now=time.time())
        async with self._slots.of_tenant(tenant):
            return await self._reached(
                spec, namespace, rule, generation=generation, previous=previous
            )

    async def _reached(
        self,
        spec: AgentToolServerSpec,
        namespace: str,
        rule: UrlRule,
        *,
        generation: int,
        previous: Mapping[str, Any],
    ) -> dict[str, Any]:
        """The status of the discovery of an allowed server, reached under ``rule``."""
        asked = spec.timeouts.discovery.seconds
        timeout = min(asked, self._max_timeout)
        try:
            headers = await self._headers(spec, namespace)
            endpoint = remote.Endpoint(
                spec.url,
                spec.transport,
                headers,
                timeout=timeout,
                private_network=rule.private_network,
                path_prefix=rule.path_prefix,
            )
            found = await remote.discover(endpoint)
        except remote.RemoteError as err:
            message = err.message
            if timeout < asked:
                message += (
                    f" (spec.timeouts.discovery {spec.timeouts.discovery} is clamped to the "
                    f"platform's {timeout:g}s)"
                )
            return failed_status(previous, message, generation=generation, now=time.time())
        # the server's input schemas are checked (bounded CPU, on a thread, in the turn of its
        # namespace's tenant: the event loop serves every other tenant meanwhile), each
        # allowlisted one a turn of its own (a running check holds its thread to its end: 128
        # schemas as one piece held it for a minute or two), then the status from the verdicts
        # remembered
        by_name = {tool.name: tool for tool in found}  # as ``discovered_status`` reads them
        for offered in spec.tools:
            if (tool := by_name.get(offered.name)) is not None:
                await self._checks.run(namespace, schemas.known_problem, dict(tool.input_schema))
        return await self._checks.run(
            namespace, discovered_status, spec, found, generation=generation, now=time.time()
        )

    async def _headers(self, spec: AgentToolServerSpec, namespace: str) -> dict[str, str]:
        if spec.headers_from is None:
            return {}
        secret = spec.headers_from.secret_ref.name
        try:
            return await self._api.secret_values(namespace, secret, keys=spec.headers_from.keys)
        except (ApiError, ValueError) as err:
            reason = f"HTTP {err.status}" if isinstance(err, ApiError) else str(err)
            raise remote.RemoteError(
                f"cannot read Secret {namespace}/{secret} (spec.headersFrom): {reason}",
                fault=kernel.ToolFault.TRANSPORT,
            ) from None
