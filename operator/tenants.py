"""The operator's registries read from the API server: AgentTenants (with the binding of
namespaces to them) and a short-lived cache of AgentModels.

What belongs here: keeping those objects current and answering "which tenant, which model".
What does not: queues, the ledger, status writes (``pump``, ``sweep``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from agentrun import kube, metrics
from agentrun.protocol import DEFAULT_TENANT, RunConfig
from agentrun.tools import remote

from . import admission, tenancy, toolservers
from .runs import QueueWait, RunKey, WaitReason
from .specs import ObjectMeta
from .tenancy import TenantPolicy

MODEL_CACHE_SECONDS = 5.0
"""How long an AgentModel read is reused: a burst of admissions reads it once; an edited price
applies to runs admitted a few seconds later."""


class NoTenant(Exception):
    """The run's namespace is bound to no AgentTenant (and no default tenant applies)."""


async def get_model(api: client.ApiClient, name: str) -> dict[str, Any] | None:
    """The cluster-scoped AgentModel ``name`` or ``None``; raises ``ApiException`` otherwise."""
    try:
        found: dict[str, Any] = await client.CustomObjectsApi(api).get_cluster_custom_object(
            kube.GROUP, kube.VERSION, kube.MODELS, name
        )
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    return found


class ModelCache:
    """AgentModels by name, each read at most once per ``MODEL_CACHE_SECONDS``.

    Only models found are cached: a model that does not exist is asked for again next time,
    so a run applied together with its AgentModel (or just before it) is not refused for
    the cache's lifetime. Callers asking for a model while it is being read wait for that
    read (a burst of admissions reads it once, not once per run).
    """

    def __init__(
        self, api: client.ApiClient | None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """``api`` ``None`` (no API server) finds no model; ``clock`` is monotonic seconds."""
        self._api = api
        self._clock = clock
        self._models: dict[str, tuple[float, dict[str, Any]]] = {}
        self._reading: dict[str, asyncio.Future[dict[str, Any] | None]] = {}

    async def get(self, name: str) -> dict[str, Any] | None:
        """The AgentModel object or ``None`` if it does not exist; raises ``ApiException``."""
        if self._api is None:
            return None
        cached = self._models.get(name)
        if cached is not None and cached[0] > self._clock():
            return cached[1]
        reading = self._reading.get(name)
        if reading is None:
            reading = asyncio.ensure_future(self._read(self._api, name))
            self._reading[name] = reading
            reading.add_done_callback(lambda _: self._reading.pop(name, None))
        return await asyncio.shield(reading)

    def put(self, name: str, model: dict[str, Any] | None) -> None:
        """What a watch saw of AgentModel ``name`` (``None``: deleted), so a change (new
        prices, ``pricing.free``) applies to the next admission, not after the cache's
        lifetime."""
        if model is None:
            self._models.pop(name, None)
        else:
            self._models[name] = (self._clock() + MODEL_CACHE_SECONDS, model)

    async def _read(self, api: client.ApiClient, name: str) -> dict[str, Any] | None:
        now = self._clock()
        model = await get_model(api, name)
        if model is None:
            self._models.pop(name, None)
        else:
            self._models[name] = (now + MODEL_CACHE_SECONDS, model)
        return model


class ToolServerPending(admission.InvalidSpec):
    """An AgentToolServer the run names exists but has not been discovered yet: admission
    should be tried again shortly (a run applied together with its server)."""


class RunConfigs:
    """Builds a run's ``RunConfig`` under its tenant's policy from its AgentModel (cached),
    the worker's tool catalog and the AgentToolServers it names (cached)."""

    def __init__(
        self,
        models: ModelCache,
        *,
        known_tools: Mapping[str, bool],
        tool_specs: Callable[[tuple[str, ...]], Sequence[Any]],
        servers: toolservers.ToolServerCache | None = None,
    ) -> None:
        """``known_tools``: the catalog's tool names → pollable; ``tool_specs(names)``: the
        OpenAI ``tools`` list a worker sends for those built-in tools (they count in a call's
        prompt); ``servers``: where ``SERVER/TOOL`` names are looked up (``None``: nowhere)."""
        self.models = models
        self.known_tools = known_tools
        self.tool_specs = tool_specs
        self.servers = servers or toolservers.ToolServerCache(None)

    async def build_config(
        self, run: RunKey, spec: Mapping[str, Any], policy: TenantPolicy, *, start_time: float
    ) -> RunConfig:
        """The run's ``RunConfig``; raises ``admission.InvalidSpec`` naming the field (an
        AgentModel without prices where a cost budget applies, ``admission.check_metered``;
        ``ToolServerPending`` when a named AgentToolServer is not discovered yet), or
        ``ApiException`` when the AgentModel or an AgentToolServer cannot be read."""
        applied = policy.apply(admission.parse_run_spec(spec))
        found = await self.models.get(applied.model)
        if found is not None:
            admission.check_metered(
                applied.model,
                found,
                spec=applied,
                tenant=policy.name,
                tenant_cost=policy.limits.cost_usd is not None,
            )
        remote_tools = []
        for name in applied.tools:
            parts = toolservers.split_reference(name)
            if parts is None:
                continue
            server = await self.servers.get(run.namespace, parts[0])
            if toolservers.is_pending(server):
                raise ToolServerPending(f"spec.tools: {name}: AgentToolServer not discovered yet")
            remote_tools.append(toolservers.resolve_tool(name, server, namespace=run.namespace))
        return admission.build_run_config(
            run,
            applied,
            model=None if found is None else admission.model_config(applied.model, found),
            known_tools=self.known_tools,
            start_time=start_time,
            resolved=admission.Resolved(policy.name, remote_tools, policy.url_rules),
        )

    def first_call_need(self, config: RunConfig) -> tuple[int, Decimal]:
        """(tokens, USD) the run's first model call may use at worst (see
        ``admission.first_call_need``)."""
        remote_names = {t.name for t in config.remote_tools}
        builtin = tuple(t for t in config.tools if t not in remote_names)
        tools = [
            *self.tool_specs(builtin),
            *(remote.spec_of(t).as_openai_tool() for t in config.remote_tools),
        ]
        return admission.first_call_need(config, tools=tools)


class Tenants:
    """The AgentTenants the operator knows (kept current by a kopf watch) and the binding of
    namespaces to them."""

    def __init__(self, api: client.ApiClient | None, *, default: str | None = None) -> None:
        """``api`` reads namespace labels for selectors (``None``: no labels); ``default`` is
        the tenant charged for namespaces no AgentTenant binds."""
        self.api = api
        self.default = default or None
        for known in {DEFAULT_TENANT, self.default or DEFAULT_TENANT}:
            metrics.know_tenant(known)  # runs no tenant binds are counted under the default
        self.policies: dict[str, TenantPolicy] = {}
        self.invalid: dict[str, tuple[int, str]] = {}
        """AgentTenants that cannot be enforced: (generation, why), shown in their status."""
        self._invalid_namespaces: dict[str, frozenset[str]] = {}

    def put(self, obj: Mapping[str, Any]) -> TenantPolicy | None:
        """Add or replace an AgentTenant; an invalid one binds nothing (its runs are rejected
        with the reason rather than run unbudgeted)."""
        meta = ObjectMeta.of(obj)  # kopf's watch hands over well-formed metadata
        name = meta.name
        metrics.know_tenant(name)  # its run-end counters exist from now on, at 0
        try:
            policy = TenantPolicy.of(obj)
        except tenancy.InvalidTenant as err:
            self.policies.pop(name, None)
            self.invalid[name] = (meta.generation, str(err))
            self._invalid_namespaces[name] = tenancy.bound_namespaces(obj)
            return None
        self.invalid.pop(name, None)
        self._invalid_namespaces.pop(name, None)
        self.policies[name] = policy
        return policy

    def remove(self, name: str) -> None:
        """Forget a deleted AgentTenant (its ledger entry stays until its runs end)."""
        self.policies.pop(name, None)
        self.invalid.pop(name, None)
        self._invalid_namespaces.pop(name, None)

    def why_missing(self, tenant: str) -> QueueWait:
        """Why runs queued in ``tenant`` wait when it has no policy (invalid or deleted)."""
        invalid = self.invalid.get(tenant)
        if invalid is not None:
            return QueueWait(
                WaitReason.TENANT_INVALID, f"AgentTenant {tenant!r} is invalid: {invalid[1]}"
            )
        return QueueWait(WaitReason.TENANT_MISSING, f"AgentTenant {tenant!r} not found")

    async def _labels(self, namespace: str) -> Mapping[str, str]:
        if self.api is None or not any(p.selector is not None for p in self.policies.values()):
            return {}
        ns = await client.CoreV1Api(self.api).read_namespace(namespace)
        return dict(ns.metadata.labels or {})

    async def resolve(self, namespace: str) -> TenantPolicy:
        """The tenant of runs in ``namespace``; raises ``NoTenant`` with a message for the run's
        status when none (or several) applies, ``ApiException`` if the namespace is unreadable."""
        for name, namespaces in self._invalid_namespaces.items():
            if namespace in namespaces:  # never fall through to another tenant's budget
                raise NoTenant(
                    f"AgentTenant {name!r} binds namespace {namespace!r} but is invalid: "
                    f"{self.invalid[name][1]}"
                )
        try:
            found = tenancy.resolve(
                self.policies.values(),
                namespace,
                await self._labels(namespace),
                default=self.default,
            )
        except tenancy.Ambiguous as err:
            raise NoTenant(str(err)) from err
        if found is not None:
            return found
        raise NoTenant(self._unbound(namespace))

    def _unbound(self, namespace: str) -> str:
        if self.default and self.default in self.invalid:
            return (
                f"default AgentTenant {self.default!r} is invalid: {self.invalid[self.default][1]}"
            )
        if self.default:
            return (
                f"namespace {namespace!r} is bound to no AgentTenant and the default tenant "
                f"{self.default!r} does not exist"
            )
        return (
            f"namespace {namespace!r} is bound to no AgentTenant; a platform admin must list it "
            "in an AgentTenant's spec.namespaces or match it with spec.namespaceSelector"
        )
