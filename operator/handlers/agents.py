"""kopf handlers of Agents and AgentModels: an Agent's ``Ready`` condition, the AgentEvals that
run it, and an AgentModel's ``Priced`` condition with the admission cache kept current.

An Agent changed (or was listed): check it against what exists (its AgentModel, the worker's
tools) and write its ``Ready`` condition; reconcile the AgentEval suites that run it (a new
round starts when its generation moved). Neither starts nor ends a run. What does not belong
here: resolving a run's ``spec.agentRef`` (``runs``, at admission).
"""

from __future__ import annotations

import time
from typing import Any

import kopf

from agentrun import kube

from ..admission.config import UNPRICED_HINT
from ..agents import resolve
from ..agents.spec import AgentModelSpec
from ..agents.store import write_ready_status, write_status
from ..platform.events import EventType, Involved
from ..platform.kubeapi import ApiError
from ..platform.spec import SpecError
from ..wiring import OperatorMemo

AGENT = (kube.GROUP, kube.VERSION, kube.AGENTS)
MODEL = (kube.GROUP, kube.VERSION, kube.MODELS)


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
    parts = memo.running().agents
    spec_model = str((body.get("spec") or {}).get("model", ""))
    try:
        model = await parts.models.get(spec_model) if spec_model else None
    except ApiError as err:
        raise kopf.TemporaryError(
            f"cannot read the AgentModel: HTTP {err.status}", delay=5
        ) from err
    found = await parts.checks.run(  # the output schema's check: bounded CPU, off the loop
        namespace,
        resolve.readiness,
        body,
        model_found=model is not None,
        known_tools=parts.known_tools,
    )
    generation = int(body.get("metadata", {}).get("generation") or 1)
    new = resolve.ready_status(
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
    subject = f"Agent {namespace}/{name}"
    try:
        await write_ready_status(parts.api, body, new)
    except ApiError as err:  # the next watch event writes it again; logged once
        parts.failures.failed(("Agent", namespace, name), err, subject=subject)
        return
    parts.failures.succeeded(("Agent", namespace, name), subject=subject)


@kopf.on.event(*AGENT)
async def eval_agent_changed(
    *, namespace: str | None, name: str, memo: OperatorMemo, **_: Any
) -> None:
    """An Agent changed: reconcile the suites that run it."""
    if namespace is not None:
        memo.running().agents.evals.agent_changed(namespace, name)


@kopf.on.event(*MODEL)
async def model_changed(
    *, type: str | None, body: kopf.Body, name: str, memo: OperatorMemo, **_: Any
) -> None:
    """Keep the AgentModel cache current (a change applies to the next admission) and its
    ``Priced`` condition: ``False`` (reason ``Unpriced``, and a Warning Event) while it lacks
    an input or an output price and is not declared free — runs with a cost budget, their
    own or their tenant's, are refused on it (``admission.check_metered``)."""
    parts = memo.running().agents
    parts.models.put(name, None if type == "DELETED" else dict(body))
    if type == "DELETED":
        return
    try:
        pricing = AgentModelSpec.of(name, body.get("spec")).pricing
    except SpecError:
        return  # runs naming it end invalid_spec with the field
    generation = int(body.get("metadata", {}).get("generation") or 1)
    if pricing.unpriced:
        lacks = pricing.unpriced_text()
        found = resolve.Readiness(False, "Unpriced", f"{lacks}: {UNPRICED_HINT}")
        why = "runs with a cost budget (theirs or their AgentTenant's) are refused on it"
        parts.events.record(
            Involved("AgentModel", name, "", str(body.get("metadata", {}).get("uid", ""))),
            type=EventType.WARNING,
            reason="Unpriced",
            message=f"this AgentModel has {lacks}: {why}; {UNPRICED_HINT}",
            key=(name, "Unpriced", generation),
        )
    else:
        free = "declared free (pricing.free: true)" if pricing.free else "prices set"
        found = resolve.Readiness(True, "Free" if pricing.free else "PricesSet", free)
    new = resolve.ready_status(
        found,
        generation=generation,
        previous=body.get("status") or {},
        now=time.time(),
        condition="Priced",
    )
    if new is None:
        return
    try:
        await write_status(parts.api, body, new, plural=kube.MODELS)
    except ApiError as err:  # the next watch event writes it again; logged once
        parts.failures.failed(("AgentModel", name), err, subject=f"AgentModel {name}")
        return
    parts.failures.succeeded(("AgentModel", name), subject=f"AgentModel {name}")
