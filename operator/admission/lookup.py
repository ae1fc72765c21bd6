"""Building a run's ``RunConfig`` at admission, with what it refers to looked up.

What belongs here: ``RunConfigs``, which applies the tenant's policy to a run's spec, reads its
AgentModel (cached), resolves the AgentToolServers it names (cached) and hands everything to
the pure rules (``config``); and what the worker's tool catalog adds to a first call's worst
case. What does not: the rules themselves (``config``).
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from agentrun.kernel import schemas
from agentrun.protocol import RunConfig
from agentrun.tools import remote

from .. import agents, runs, tenants, toolservers
from ..platform.spec import SpecError
from .config import Resolved, build_run_config, check_metered, first_call_need


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
    ) -> None:
        """``models``: where AgentModels are read; ``known_tools``: the catalog's tool names →
        pollable; ``tool_specs(names)``: the OpenAI ``tools`` list a worker sends for those
        built-in tools (they count in a call's prompt); ``servers``: where ``SERVER/TOOL``
        names are looked up."""
        self.models = models
        self.known_tools = known_tools
        self.tool_specs = tool_specs
        self.servers = servers

    async def build_config(
        self,
        run: runs.RunKey,
        spec: Mapping[str, Any],
        policy: tenants.TenantPolicy,
        *,
        start_time: float,
    ) -> RunConfig:
        """The run's ``RunConfig``; raises ``SpecError`` naming the field (an AgentModel
        without prices where a cost budget applies, ``config.check_metered``;
        ``ToolServerPending`` when a named AgentToolServer is not discovered yet), or
        ``ApiError`` when the AgentModel or an AgentToolServer cannot be read."""
        applied = policy.apply(runs.AgentRunSpec.of(spec))
        if applied.output.json_schema is not None:
            problem = await asyncio.to_thread(output_schema_problem, applied.output.json_schema)
            if problem is not None:
                raise SpecError(f"spec.output.schema: {problem}")
        found = await self.models.get(applied.model)
        if found is not None:
            check_metered(
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
            rules, tenant = policy.tool_server_rules, policy.name
            toolservers.check_reach(name, server, rules=rules, tenant=tenant)
            if toolservers.is_pending(server):
                raise ToolServerPending(f"spec.tools: {name}: AgentToolServer not discovered yet")
            remote_tools.append(
                toolservers.resolve_tool(
                    name, server, namespace=run.namespace, rules=rules, tenant=tenant
                )
            )
        return build_run_config(
            run,
            applied,
            model=None if found is None else agents.model_config(applied.model, found),
            known_tools=self.known_tools,
            start_time=start_time,
            resolved=Resolved(policy.name, remote_tools, policy.url_rules),
        )

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


def output_schema_problem(schema: Mapping[str, Any]) -> str | None:
    """Why a run's ``spec.output.schema`` cannot be used (``schemas.schema_problem``: too
    large, too deep, a pattern RE2 refuses, invalid), decided once per distinct schema of
    a sensible size: a queued run's config is built again at every pass of its queue."""
    text = json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    if len(text) > schemas.MAX_SCHEMA_BYTES:
        return schemas.schema_problem(schema)  # names the size; not worth remembering
    return _verdict(text)


@functools.lru_cache(maxsize=256)
def _verdict(text: str) -> str | None:
    return schemas.schema_problem(json.loads(text))
