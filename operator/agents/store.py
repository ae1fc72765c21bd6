"""Agents on the API server: reading an Agent, recording a run's resolution, writing ``Ready``.

What belongs here: the calls through the API server port that the Agent rules (``resolve``)
need. What does not: the rules themselves (``resolve``, pure), AgentModels (``models``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentrun import kube

from .. import runs
from ..platform.kubeapi import ApiError, KubeApi, Ref
from ..platform.spec import not_found
from .resolve import InvalidRef, recorded, resolve

AGENTS = kube.AGENTS
"""The plural of ``Agent``."""


async def get_agent(api: KubeApi, namespace: str, name: str) -> dict[str, Any] | None:
    """The Agent ``namespace/name`` or ``None``; raises ``ApiError`` otherwise."""
    return await api.get(Ref(AGENTS, name, namespace))


async def resolve_run(
    api: KubeApi, run: runs.RunKey, spec: Mapping[str, Any], status: Mapping[str, Any]
) -> Mapping[str, Any]:
    """The spec ``run`` executes: ``spec`` itself without ``agentRef``; the recorded
    resolution if there is one; else its Agent resolved now and recorded in the run's status
    (before it is queued, so an operator restart finds it).

    Raises ``InvalidRef`` naming the field, ``ApiError`` when the Agent cannot be read or the
    status not written.
    """
    if "agentRef" not in spec:
        return spec
    known = recorded(status)
    if known is not None:
        return known.spec
    name = str((spec.get("agentRef") or {}).get("name", ""))
    agent = await get_agent(api, run.namespace, name)
    if agent is None:
        raise InvalidRef(f"spec.agentRef.name: {not_found('Agent', name, namespace=run.namespace)}")
    resolution = resolve(spec, agent)
    await api.patch_status(run.ref, resolution.status(), uid=run.uid)
    return resolution.spec


async def write_ready_status(
    api: KubeApi, agent: Mapping[str, Any], body: Mapping[str, Any]
) -> None:
    """Patch ``body`` (``resolve.ready_status``) into the Agent object ``agent``'s ``.status``,
    only if it is still the object of that uid; an Agent gone or replaced is left alone. Raises
    ``ApiError`` on other API errors."""
    await write_status(api, agent, body, plural=AGENTS)


async def write_status(
    api: KubeApi, obj: Mapping[str, Any], body: Mapping[str, Any], *, plural: str
) -> None:
    """Patch ``body`` into ``obj``'s ``.status`` (namespaced, or cluster-scoped when it has no
    namespace: an AgentModel's ``Priced``), only if it is still the object of that uid; gone or
    replaced is left alone. Raises ``ApiError`` on other API errors."""
    meta = obj.get("metadata") or {}
    ref = Ref(plural, str(meta.get("name", "")), str(meta.get("namespace") or ""))
    try:
        await api.patch_status(ref, body, uid=str(meta.get("uid") or ""))
    except ApiError as err:
        if err.status not in (404, 409):  # gone, or replaced by a new object of the name
            raise
