"""Whose share a namespace's trajectory reads and follows take: the AgentTenant binding it.

The server shares its places and its byte budget by *party* (as the operator shares its own
fair queues): ``tenant:<name>`` for every namespace an AgentTenant binds, together, however
many; ``namespace:<name>`` for a namespace no tenant binds (or one several bind: the operator
refuses its runs), its own. The binding rule is the operator's (``agentrun.tenancy``).

What it reads, and needs RBAC for: the AgentTenants (``list`` and ``watch``, cluster-scoped),
and a namespace's labels (``get`` namespaces, kept ``LABELS_SECONDS``) only while some
AgentTenant selects namespaces by label. Until the first list answers, and while a
namespace's labels cannot be read, a namespace is its own party (the per-namespace limits
still hold). What does not belong here: the places and bytes themselves (``server``,
``budget``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

import aiohttp
import cachetools
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from agentrun import kube, tenancy

log = logging.getLogger("agentrun.trajectoryapi")

LABELS_SECONDS = 30.0
"""How long a namespace's labels, once read, decide its party (a relabelled namespace moves
within this long)."""
LABELS_KEPT = 4096
"""Namespaces whose labels are kept at most."""
LABELS_TIMEOUT = 5.0
"""Seconds a read of a namespace's labels may take (then the namespace is its own party for
the request)."""
WATCH_SECONDS = 300
"""Seconds one watch of the AgentTenants lasts before it is opened again."""
WATCH_TIMEOUT = aiohttp.ClientTimeout(sock_connect=10.0, sock_read=WATCH_SECONDS + 30.0)
"""Bounds on one watch's connection: the API server ends a watch after ``WATCH_SECONDS``, so
one silent for 30 s longer died without a reset (its ``TimeoutError`` opens it again after
``RETRY_SECONDS``; before, it waited for ever, the tenants' bindings frozen)."""
RETRY_SECONDS = 5.0
"""Wait before listing the AgentTenants again after a failed list or watch."""

Failure = (ApiException, aiohttp.ClientError, TimeoutError, OSError, ValueError)
"""What a Kubernetes read may raise."""


class TenantSource(Protocol):
    """The reads the party of a namespace needs (``KubeTenants`` in a cluster)."""

    async def list_tenants(self) -> tuple[list[Mapping[str, Any]], str]:
        """Every AgentTenant and the list's ``resourceVersion``."""
        ...

    def watch_tenants(self, since: str) -> AsyncIterator[tuple[str, Mapping[str, Any]]]:
        """(``ADDED`` | ``MODIFIED`` | ``DELETED``, the AgentTenant) after ``since``, until
        the watch ends; raises as a list does (``410``: list again)."""
        ...

    async def namespace_labels(self, namespace: str) -> Mapping[str, str]:
        """The namespace's labels (none when it does not exist)."""
        ...


class Parties:
    """The AgentTenants as last listed or watched, and the party of a namespace."""

    def __init__(self, source: TenantSource | None) -> None:
        """``source``: ``None`` knows no tenant (every namespace its own party)."""
        self.source = source
        self.bindings: dict[str, tenancy.Binding] = {}
        self._labels: cachetools.TTLCache[str, Mapping[str, str]] = cachetools.TTLCache(
            LABELS_KEPT, LABELS_SECONDS
        )
        self._failing = False

    def put(self, obj: Mapping[str, Any]) -> None:
        """Add or replace an AgentTenant."""
        binding = tenancy.Binding.of(obj)
        self.bindings[binding.name] = binding

    def remove(self, obj: Mapping[str, Any]) -> None:
        """Forget a deleted AgentTenant."""
        self.bindings.pop(tenancy.Binding.of(obj).name, None)

    async def party(self, namespace: str) -> str:
        """``tenant:<name>`` of the AgentTenant binding ``namespace``, else
        ``namespace:<namespace>``. Never raises: labels that cannot be read make the namespace
        its own party for this request (logged once until a read succeeds)."""
        own = f"namespace:{namespace}"
        if not self.bindings:
            return own
        labels: Mapping[str, str] = {}
        if any(b.selector is not None for b in self.bindings.values()):
            found = await self._namespace_labels(namespace)
            if found is None:
                return own
            labels = found
        try:
            tenant = tenancy.resolve(self.bindings.values(), namespace, labels)
        except tenancy.Ambiguous:
            return own
        return own if tenant is None else f"tenant:{tenant.name}"

    async def _namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        with contextlib.suppress(KeyError):
            return self._labels[namespace]
        if self.source is None:
            return {}
        try:
            async with asyncio.timeout(LABELS_TIMEOUT):
                labels = await self.source.namespace_labels(namespace)
        except Failure as err:
            if not self._failing:
                log.warning("cannot read namespace %s's labels: %r", namespace, err)
            self._failing = True
            return None
        self._failing = False
        self._labels[namespace] = labels
        return labels

    async def follow(self) -> None:
        """Keep ``bindings`` current for ever: list, then watch from the list, again after a
        watch ends (at once) or fails (after ``RETRY_SECONDS``). Each failure is logged."""
        if self.source is None:
            return
        while True:
            try:
                await self._list_and_watch(self.source)
            except Failure as err:
                log.warning("cannot read the AgentTenants: %r", err)
                await asyncio.sleep(RETRY_SECONDS)

    async def _list_and_watch(self, source: TenantSource) -> None:
        items, version = await source.list_tenants()
        self.bindings = {}
        for item in items:
            self.put(item)
        log.info("sharing by AgentTenant: %d listed, watching from %s", len(items), version)
        async for kind, obj in source.watch_tenants(version):
            if kind == "DELETED":
                self.remove(obj)
            elif kind in ("ADDED", "MODIFIED"):
                self.put(obj)


class KubeTenants:
    """``TenantSource`` through the Kubernetes API."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    async def list_tenants(self) -> tuple[list[Mapping[str, Any]], str]:
        found = await client.CustomObjectsApi(self.api).list_cluster_custom_object(
            kube.GROUP, kube.VERSION, kube.TENANTS, _request_timeout=kube.REQUEST_TIMEOUT
        )
        return list(found.get("items") or ()), str(found["metadata"]["resourceVersion"])

    async def watch_tenants(self, since: str) -> AsyncIterator[tuple[str, Mapping[str, Any]]]:
        objects = client.CustomObjectsApi(self.api)
        async with watch.Watch() as stream:
            async for event in stream.stream(
                objects.list_cluster_custom_object, kube.GROUP, kube.VERSION, kube.TENANTS,
                resource_version=since, timeout_seconds=WATCH_SECONDS,
                _request_timeout=WATCH_TIMEOUT,
            ):  # fmt: skip
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":
                    raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                yield kind, obj

    async def namespace_labels(self, namespace: str) -> Mapping[str, str]:
        try:
            found = await client.CoreV1Api(self.api).read_namespace(namespace)
        except ApiException as err:
            if err.status == 404:
                return {}
            raise
        return dict(found.metadata.labels or {})
