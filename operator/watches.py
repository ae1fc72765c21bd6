"""kopf handlers of the objects runs refer to: AgentTenants, Agents, AgentModels,
AgentToolServers.

Each keeps a registry current or writes a status; none starts or ends a run. What does not
belong here: the AgentRun handlers (``runhandlers``), kopf's configuration (``handlers``).
"""

from __future__ import annotations

import time
from typing import Any

import kopf
from kubernetes_asyncio.client.exceptions import ApiException

from agentrun import kube

from . import admission, agents
from .recorder import EventType, Involved
from .specs import AgentModelSpec, SpecError
from .toolservers import TOOL_SERVERS
from .wiring import OperatorMemo

TENANT = (kube.GROUP, kube.VERSION, kube.TENANTS)
AGENT = (kube.GROUP, kube.VERSION, kube.AGENTS)
TOOL_SERVER = (kube.GROUP, kube.VERSION, TOOL_SERVERS)
MODEL = (kube.GROUP, kube.VERSION, kube.MODELS)


@kopf.on.event(*TENANT)
async def tenant_changed(
    *, type: str | None, body: kopf.Body, name: str, memo: OperatorMemo, **_: Any
) -> None:
    """Keep the tenant registry current; a changed tenant (more budget, more slots) is pumped."""
    parts = memo.running()
    if type == "DELETED":
        parts.tenants.remove(name)
        return
    if parts.tenants.put(body) is not None:
        parts.board.kick(name)


@kopf.on.event(*AGENT)
async def agent_changed(
    *,
    type: str | None,
    body: kopf.Body,
    namespace: str | None,
    name: str,
    memo: OperatorMemo,
    **_: Any,
) -> None:
    """Keep an Agent's ``Ready`` condition current: checked whenever the Agent changes and
    whenever kopf re-lists (at least every ``settings.watching.server_timeout`` seconds), so
    an AgentModel created later turns it Ready."""
    if type == "DELETED" or namespace is None:
        return
    parts = memo.running()
    spec_model = str((body.get("spec") or {}).get("model", ""))
    try:
        model = await parts.configs.models.get(spec_model) if spec_model else None
    except ApiException as err:
        raise kopf.TemporaryError(
            f"cannot read the AgentModel: HTTP {err.status}", delay=5
        ) from err
    found = agents.readiness(
        body, model_found=model is not None, known_tools=parts.configs.known_tools
    )
    generation = int(body.get("metadata", {}).get("generation") or 1)
    new = agents.ready_status(
        found, generation=generation, previous=body.get("status") or {}, now=time.time()
    )
    if new is None:
        return
    if not found.ready:
        parts.events.record(
            Involved("Agent", name, namespace, str(body.get("metadata", {}).get("uid", ""))),
            type=EventType.WARNING,
            reason=found.reason,
            message=f"runs of this Agent would end invalid_spec: {found.message}",
            key=(name, namespace, found.reason, generation),
        )
    await agents.write_ready_status(parts.api, body, new)


@kopf.on.event(*MODEL)
async def model_changed(
    *, type: str | None, body: kopf.Body, name: str, memo: OperatorMemo, **_: Any
) -> None:
    """Keep the AgentModel cache current (a change applies to the next admission) and its
    ``Priced`` condition: ``False`` (reason ``Unpriced``, and a Warning Event) while it has no
    prices and is not declared free — runs with a cost budget, their own or their tenant's,
    are refused on it (``admission.check_metered``)."""
    parts = memo.running()
    parts.configs.models.put(name, None if type == "DELETED" else dict(body))
    if type == "DELETED":
        return
    try:
        pricing = AgentModelSpec.of(name, body.get("spec")).pricing
    except SpecError:
        return  # runs naming it end invalid_spec with the field
    generation = int(body.get("metadata", {}).get("generation") or 1)
    if pricing.unpriced:
        found = agents.Readiness(False, "Unpriced", f"no prices: {admission.UNPRICED_HINT}")
        why = "runs with a cost budget (theirs or their AgentTenant's) are refused on it"
        parts.events.record(
            Involved("AgentModel", name, "", str(body.get("metadata", {}).get("uid", ""))),
            type=EventType.WARNING,
            reason="Unpriced",
            message=f"this AgentModel has no prices: {why}; {admission.UNPRICED_HINT}",
            key=(name, "Unpriced", generation),
        )
    else:
        free = "declared free (pricing.free: true)" if pricing.free else "prices set"
        found = agents.Readiness(True, "Free" if pricing.free else "PricesSet", free)
    new = agents.ready_status(
        found,
        generation=generation,
        previous=body.get("status") or {},
        now=time.time(),
        condition="Priced",
    )
    if new is not None:
        await agents.write_status(parts.api, body, new, plural=kube.MODELS)


@kopf.on.event(*TOOL_SERVER)
async def tool_server_changed(
    *,
    type: str | None,
    body: kopf.Body,
    namespace: str | None,
    name: str,
    memo: OperatorMemo,
    **_: Any,
) -> None:
    """Tell the refresher about AgentToolServers; it discovers their tools in the background
    (never in this handler) and writes their status."""
    parts = memo.running()
    if type == "DELETED":
        parts.toolservers.forget(str(namespace), name)
        return
    parts.toolservers.observe(body)
