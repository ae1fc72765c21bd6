"""Building a run's ``RunConfig`` at admission, with what it refers to looked up.

What belongs here: ``RunConfigs``, which applies the tenant's policy to a run's spec, reads its
AgentModel (cached), resolves the AgentToolServers it names (cached) and hands everything to
the pure rules (``config``); and what the worker's tool catalog adds to a first call's worst
case. What does not: the rules themselves (``config``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from agentrun.kernel import schemas
from agentrun.protocol import RunConfig
from agentrun.tools import remote

from .. import agents, runs, tenants, toolservers
from ..platform.fairwork import FairWork
from ..platform.spec import SpecError
from ..platform.weighed import WeighedCache
from .config import Resolved, build_run_config, check_metered, first_call_need, run_timeout

BUILT_MEMORY = 64 * 2**20
"""Bytes of runs' last configs built kept, about (each weighed by ``schemas.footprint`` of the
spec it was built from, which its config holds again; the least recently built forgotten
first): tens of thousands of ordinary runs (under 1 KB each), fewer with large output
schemas, whatever they are. A run forgotten is built again when its queue next passes it."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Built:
    """A run's config as built, and what it was built from."""

    spec: bytes
    """The run's spec's digest (``_digest``): equal for equal specs, and small."""
    policy: tenants.TenantPolicy
    model_name: str
    model: dict[str, Any] | None
    """Its AgentModel as read (``None``: not found)."""
    server_names: tuple[str, ...]
    servers: tuple[dict[str, Any] | None, ...]
    """Each AgentToolServer it names, as read, in the order of ``server_names``."""
    timeout: float
    """``config.run_timeout`` of the applied spec: the deadline's distance from the start."""
    config: RunConfig
    weight: int
    """``schemas.footprint`` of the spec it was built from: about what the config holds."""


class ToolServerPending(SpecError):
    """An AgentToolServer the run names exists but has not been discovered yet: admission
    should be tried again shortly (a run applied together with its server)."""


class RunConfigs:
    """Builds a run's ``RunConfig`` under its tenant's policy from its AgentModel (cached),
    the worker's tool catalog and the AgentToolServers it names (cached)."""

    def __init__(
        self,
        models: agents.ModelCache,
        *,
        known_tools: Mapping[str, bool],
        tool_specs: Callable[[tuple[str, ...]], Sequence[Any]],
        servers: toolservers.ToolServerCache,
        checks: FairWork | None = None,
    ) -> None:
        """``models``: where AgentModels are read; ``known_tools``: the catalog's tool names →
        pollable; ``tool_specs(names)``: the OpenAI ``tools`` list a worker sends for those
        built-in tools (they count in a call's prompt); ``servers``: where ``SERVER/TOOL``
        names are looked up; ``checks``: the threads a run's output schema is checked on
        (default: threads of its own)."""
        self.models = models
        self.known_tools = known_tools
        self.tool_specs = tool_specs
        self.servers = servers
        self.checks = checks or FairWork()
        self._built: WeighedCache[str, _Built] = WeighedCache(BUILT_MEMORY, _weight)
        """Each run's last config built, by uid (``build_config``), ``BUILT_MEMORY`` at most."""

    async def build_config(
        self,
        run: runs.RunKey,
        spec: Mapping[str, Any],
        policy: tenants.TenantPolicy,
        *,
        start_time: float,
        queued: bool = False,
    ) -> RunConfig:
        """The run's ``RunConfig``; raises ``SpecError`` naming the field (an AgentModel
        without prices where a cost budget applies, ``config.check_metered``;
        ``ReferenceMissing`` when its AgentModel or a named AgentToolServer does not exist;
        ``ToolServerPending`` when a named AgentToolServer is not discovered yet), or
        ``ApiError`` when the AgentModel or an AgentToolServer cannot be read. ``queued``: the
        run waits in its queue, and an AgentModel found missing a moment ago is taken as
        missing still (``ModelCache.get``'s ``recent_miss``).

        Built once per run while what it is built from stays the same: the config of the
        run's last build is reused, its deadline counted from ``start_time``, when the spec
        and the policy are equal to that build's and its AgentModel and AgentToolServers read
        now are too (the create handler's build to validate, then the pump's at admission
        and at each pass of a queue, cost one build). Every rule is a function of those
        inputs, so a reused config is the one a build would make."""
        built = self._built.get(run.uid)
        digest = _digest(spec)
        if built is not None and built.spec == digest and built.policy == policy:
            model = await self.models.get(built.model_name, recent_miss=queued)
            servers = [await self.servers.get(run.namespace, s) for s in built.server_names]
            if model == built.model and servers == list(built.servers):
                return dataclasses.replace(built.config, deadline=start_time + built.timeout)
        built = await self._build(run, spec, policy, start_time=start_time, queued=queued)
        self._built[run.uid] = dataclasses.replace(
            built, spec=digest, weight=schemas.footprint(spec)
        )
        return built.config

    def forget(self, uid: str) -> None:
        """Drop what is kept of run ``uid``'s last build (it was admitted or left its queue)."""
        self._built.pop(uid, None)

    async def _check_output(self, run: runs.RunKey, schema: Any) -> None:
        """Raises ``SpecError`` naming ``spec.output.schema`` when the run's output schema
        (``None``: none) cannot be used; checked on the check threads in its tenant's turn."""
        if schema is not None:
            problem = await self.checks.run(run.namespace, schemas.known_problem, schema)
            if problem is not None:
                raise SpecError(f"spec.output.schema: {problem}")

    async def _build(
        self,
        run: runs.RunKey,
        spec: Mapping[str, Any],
        policy: tenants.TenantPolicy,
        *,
        start_time: float,
        queued: bool,
    ) -> _Built:
        """The run's config built anew, with what it was built from (see ``build_config``)."""
        applied = policy.apply(runs.AgentRunSpec.of(spec))
        await self._check_output(run, applied.output.json_schema)
        found = await self.models.get(applied.model, recent_miss=queued)
        if found is not None:
            check_metered(
                applied.model,
                found,
                spec=applied,
                tenant=policy.name,
                tenant_cost=policy.limits.cost_usd is not None,
            )
        remote_tools, names, servers = [], [], []
        for name in applied.tools:
            parts = toolservers.split_reference(name)
            if parts is None:
                continue
            server = await self.servers.get(run.namespace, parts[0])
            names.append(parts[0])
            servers.append(server)
            rules, tenant = policy.tool_server_rules, policy.name
            toolservers.check_reach(name, server, rules=rules, tenant=tenant)
            if toolservers.is_pending(server):
                raise ToolServerPending(f"spec.tools: {name}: AgentToolServer not discovered yet")
            remote_tools.append(
                toolservers.resolve_tool(
                    name, server, namespace=run.namespace, rules=rules, tenant=tenant
                )
            )
        config = build_run_config(
            run,
            applied,
            model=None if found is None else agents.model_config(applied.model, found),
            known_tools=self.known_tools,
            start_time=start_time,
            resolved=Resolved(policy.name, remote_tools, policy.url_rules),
        )
        inputs = (applied.model, found, tuple(names), tuple(servers))
        return _Built(b"", policy, *inputs, run_timeout(applied), config, weight=0)

    def first_call_need(self, config: RunConfig) -> tuple[int, Decimal]:
        """(tokens, USD) the run's first model call may use at worst (see
        ``config.first_call_need``)."""
        remote_names = {t.name for t in config.remote_tools}
        builtin = tuple(t for t in config.tools if t not in remote_names)
        tools = [
            *self.tool_specs(builtin),
            *(remote.spec_of(t).as_openai_tool() for t in config.remote_tools),
        ]
        return first_call_need(config, tools=tools)


def _weight(built: _Built) -> int:
    return built.weight


def _digest(spec: Mapping[str, Any]) -> bytes:
    """SHA-256 of ``spec`` as compact JSON, keys sorted: equal for equal specs."""
    text = json.dumps(dict(spec), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).digest()
