"""kopf handlers of Agents: an Agent's ``Ready`` condition, and the AgentEvals that run it.

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

from ..agents import resolve
from ..agents.store import write_ready_status
from ..platform.events import EventType, Involved
from ..platform.kubeapi import ApiError
from ..wiring import OperatorMemo

AGENT = (kube.GROUP, kube.VERSION, kube.AGENTS)


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
    found = resolve.readiness(body, model_found=model is not None, known_tools=parts.known_tools)
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
    await write_ready_status(parts.api, body, new)


@kopf.on.event(*AGENT)
async def eval_agent_changed(
    *, namespace: str | None, name: str, memo: OperatorMemo, **_: Any
) -> None:
    """An Agent changed: reconcile the suites that run it."""
    if namespace is not None:
        memo.running().agents.evals.agent_changed(namespace, name)
