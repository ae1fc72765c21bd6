"""kopf entry points: start-up, admission on create/resume, cancellation, review, deletion.

Handlers stay thin: they resolve what admission needs and hand over to the parts built by
``wiring`` (carried in kopf's memo, an ``OperatorMemo``). kopf keeps its own bookkeeping in
annotations (prefix ``kopf.agentrun.dev``), never in ``.status``, which is ours alone (a
projection of the run's events).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from typing import Any, cast

import kopf
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from agentrun import kernel, kube

from . import admission, agents, wiring
from .recorder import EventType, Involved
from .runs import CANCEL_ANNOTATION, RunKey
from .specs import ObjectMeta, RunObject
from .statuswriter import MERGE_PATCH
from .tenants import NoTenant, ToolServerPending
from .toolservers import TOOL_SERVERS
from .wiring import OperatorMemo, Parts

log = logging.getLogger(__name__)

KUBECTL_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
APPROVE_ANNOTATION = "agentrun.dev/approve"
"""Set to the digest in ``.status.pendingApproval`` to approve that held call."""
DENY_ANNOTATION = "agentrun.dev/deny"
"""Set to the digest in ``.status.pendingApproval`` to deny that held call."""
FINALIZER = "agentrun.dev/finalizer"
RUN = (kube.GROUP, kube.VERSION, kube.RUNS)
TENANT = (kube.GROUP, kube.VERSION, kube.TENANTS)
AGENT = (kube.GROUP, kube.VERSION, kube.AGENTS)
TOOL_SERVER = (kube.GROUP, kube.VERSION, TOOL_SERVERS)


class MetadataDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's last-handled-configuration without ``spec``.

    An AgentRun's spec is immutable (CEL ``self == oldSelf``), so the only changes the handlers
    react to are annotations (cancel, approve, deny). Leaving the spec out keeps the annotation
    small — kopf would otherwise copy the whole spec into an annotation, which the API server
    refuses past 256 KiB (a long non-ASCII goal, a large output schema), leaving the object
    undeletable — and saves a deep copy of the spec on every watch event.
    """

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        """The essence kopf compares: labels and annotations only.

        kopf's own build deep-copies the whole object (managed fields, spec, status) before it
        drops all but the labels and annotations; it runs on every watch event — each status
        write of every run causes one — so it is given only what it keeps (unless a handler
        asked for extra fields).
        """
        if not extra_fields:
            meta = body.get("metadata", {})
            kept: dict[str, Any] = {
                "apiVersion": body.get("apiVersion"),
                "kind": body.get("kind"),
                "metadata": {k: meta[k] for k in ("labels", "annotations") if k in meta},
            }
            body = kopf.Body(cast(kopf.RawBody, kept))
        essence: dict[str, Any] = dict(super().build(body=body, extra_fields=extra_fields))
        essence.pop("spec", None)
        annotations: dict[str, Any] = essence.get("metadata", {}).get("annotations", {})
        annotations.pop(KUBECTL_LAST_APPLIED, None)  # a copy of the whole object
        return cast(kopf.BodyEssence, essence)


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, memo: OperatorMemo, **_: Any) -> None:
    """Configure kopf, connect to the API server, list AgentTenants, start the parts."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix="kopf.agentrun.dev"
    )
    settings.persistence.diffbase_storage = MetadataDiffBaseStorage(
        prefix="kopf.agentrun.dev", key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    api = await kube.api_client()
    memo.parts = await wiring.start_parts(
        memo.settings, tenant_objects=await _list_tenants(api), api=api
    )


async def _list_tenants(api: client.ApiClient, *, patience: float = 120.0) -> list[dict[str, Any]]:
    """Every AgentTenant; retries while the API server is starting (429 "storage is
    (re)initializing" right after the CRD is installed, 5xx), then gives up loudly."""
    objects = client.CustomObjectsApi(api)
    deadline = time.monotonic() + patience
    while True:
        try:
            listed: dict[str, Any] = await objects.list_cluster_custom_object(*TENANT)
            return list(listed.get("items", []))
        except ApiException as err:
            retriable = err.status == 429 or (err.status or 0) >= 500
            if not retriable or time.monotonic() > deadline:
                raise
            log.info("listing AgentTenants: HTTP %s; retrying", err.status)
            await asyncio.sleep(1.0)


@kopf.on.cleanup()
async def stop(memo: OperatorMemo, **_: Any) -> None:
    """Stop consuming, flush status, close connections; bounded, even with NATS gone."""
    if memo.parts is not None:
        await wiring.stop_parts(memo.parts)


def _created(meta: kopf.Meta) -> float:
    text = meta.get("creationTimestamp")
    if isinstance(text, str):
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    return time.time()


def _reject(
    parts: Parts, run: RunKey, message: str, *, generation: int, tenant: str | None = None
) -> None:
    parts.pump.end_unadmitted(
        run, kernel.Phase.INVALID_SPEC, message, tenant=tenant, generation=generation
    )


async def _validate_and_enqueue(
    parts: Parts, key: RunKey, *, spec: kopf.Spec, meta: kopf.Meta, status: kopf.Status
) -> None:
    """Resolve the run's tenant and Agent, reject what can never run, queue the rest."""
    generation = int(meta.get("generation") or 1)
    try:
        policy = await parts.tenants.resolve(key.namespace)
    except NoTenant as err:
        _reject(parts, key, str(err), generation=generation)
        return
    except ApiException as err:
        raise kopf.TemporaryError(f"cannot read namespace {key.namespace!r}: {err.status}") from err
    try:  # before the tenant's policy: it applies to the spec the run executes
        run_spec = await agents.resolve_run(parts.api, key, spec, status)
    except agents.InvalidRef as err:
        _reject(parts, key, str(err), generation=generation, tenant=policy.name)
        return
    except ApiException as err:
        raise kopf.TemporaryError(f"cannot resolve spec.agentRef: HTTP {err.status}") from err
    try:  # reject what can never run now, not after it waited in the queue
        await parts.configs.build_config(key, run_spec, policy, start_time=time.time())
    except ToolServerPending as err:  # applied together with its AgentToolServer: wait for it
        raise kopf.TemporaryError(str(err), delay=2) from err
    except admission.InvalidSpec as err:
        _reject(parts, key, str(err), generation=generation, tenant=policy.name)
        return
    except ApiException as err:
        raise kopf.TemporaryError(
            f"cannot read the AgentModel: HTTP {err.status}", delay=5
        ) from err
    obj = RunObject(
        metadata=ObjectMeta(generation=generation, annotations=dict(meta.annotations)),
        spec=dict(run_spec),
    )
    await parts.pump.enqueue_run(
        key, policy, generation=generation, created=_created(meta), obj=obj
    )


@kopf.on.create(*RUN)
@kopf.on.resume(*RUN)
async def admit_run(  # kopf passes each of these by keyword: its handler signature
    *,
    spec: kopf.Spec,
    meta: kopf.Meta,
    status: kopf.Status,
    namespace: str | None,
    name: str,
    uid: str,
    memo: OperatorMemo,
    **_: Any,
) -> None:
    """Admit a new AgentRun: validate it against its AgentModel and its AgentTenant, queue it
    in the tenant's admission queue (the pump starts it when the tenant has room), or,
    after an operator restart, pick up where the run's events left off."""
    assert namespace is not None  # AgentRun is namespaced
    if status.get("terminalReason"):
        return
    parts = memo.running()
    generation = int(meta.get("generation") or 1)
    if await parts.dispatcher.recover(namespace, name, uid, generation=generation):
        return
    await _validate_and_enqueue(
        parts, RunKey(namespace, name, uid), spec=spec, meta=meta, status=status
    )


@kopf.on.update(*RUN, annotations={CANCEL_ANNOTATION: "true"})
async def cancel_run(
    *,
    status: kopf.Status,
    namespace: str | None,
    name: str,
    uid: str,
    memo: OperatorMemo,
    **_: Any,
) -> None:
    """``agentrun.dev/cancel: "true"``: end the run ``cancelled``; workers drop its turn; a
    queued run leaves its queue."""
    assert namespace is not None  # AgentRun is namespaced
    if status.get("terminalReason"):
        return
    parts = memo.running()
    ended = await parts.dispatcher.end(
        namespace,
        name,
        uid,
        kernel.Phase.CANCELLED,
        f"cancelled by the {CANCEL_ANNOTATION} annotation",
    )
    if not ended:
        await parts.pump.cancel_queued(RunKey(namespace, name, uid), status.get("tenant"))


@kopf.on.update(*RUN, annotations={APPROVE_ANNOTATION: kopf.PRESENT})
@kopf.on.update(*RUN, annotations={DENY_ANNOTATION: kopf.PRESENT})
async def review_run(
    *,
    annotations: kopf.Annotations,
    namespace: str | None,
    name: str,
    uid: str,
    memo: OperatorMemo,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    """``agentrun.dev/approve`` or ``agentrun.dev/deny`` set to the pending call's digest.

    The decision is applied only if the digest is the one waiting (the kernel checks), then the
    annotation is removed so the same digest can be decided again later in the run.
    """
    assert namespace is not None  # AgentRun is namespaced
    parts = memo.running()
    for key, approved in ((APPROVE_ANNOTATION, True), (DENY_ANNOTATION, False)):
        digest = annotations.get(key)
        if not digest:
            continue
        refused = await parts.dispatcher.decide(
            namespace, name, uid, digest=str(digest), approved=approved
        )
        involved = Involved("AgentRun", name, namespace, uid)
        if refused is not None:
            logger.warning("%s=%s not applied: %s", key, digest, refused)
            parts.events.record(
                involved,
                type=EventType.WARNING,
                reason="ApprovalNotApplied",
                message=f"{key}={digest} not applied: {refused}",
                key=(uid, "ApprovalNotApplied", digest),
            )
        else:
            parts.events.record(
                involved,
                type=EventType.NORMAL,
                reason="Approved" if approved else "Denied",
                message=f"held tool call {digest} {'approved' if approved else 'denied'} by {key}",
                key=(uid, "Decided", digest),
            )
        await _remove_annotation(parts.api, namespace, name, key)


async def _remove_annotation(api: client.ApiClient, namespace: str, name: str, key: str) -> None:
    try:
        await client.CustomObjectsApi(api).patch_namespaced_custom_object(
            kube.GROUP,
            kube.VERSION,
            namespace,
            kube.RUNS,
            name,
            {"metadata": {"annotations": {key: None}}},
            **MERGE_PATCH,
        )
    except ApiException as err:
        if err.status != 404:
            raise


def unfinished(status: kopf.Status, **_: Any) -> bool:
    """kopf filter: the run has not ended. Only such runs hold the finalizer: kopf adds it to
    the runs the deletion handler matches and removes it from the others, so a run loses it
    once its terminal status is written (its ledger entry is settled before that), and finished
    runs and their namespaces delete with no operator running."""
    return not status.get("terminalReason")


@kopf.on.delete(*RUN, when=unfinished)
async def delete_run(
    *, namespace: str | None, name: str, uid: str, memo: OperatorMemo, **_: Any
) -> None:
    """Stop the run, settle its ledger entry and purge its events (or take it out of its
    queue); bounded, so the finalizer always goes."""
    assert namespace is not None  # AgentRun is namespaced
    parts = memo.running()
    try:
        async with asyncio.timeout(10):
            await parts.pump.forget_queued(uid)
    except Exception as err:  # NATS down: the pump drops queued runs that no longer exist
        log.warning("could not take %s/%s out of its queue: %r", namespace, name, err)
    await parts.dispatcher.forget(namespace, name, uid)


@kopf.on.event(*RUN)
async def run_seen(
    *,
    type: str | None,
    spec: kopf.Spec,
    status: kopf.Status,
    namespace: str | None,
    name: str,
    uid: str,
    memo: OperatorMemo,
    **_: Any,
) -> None:
    """Every AgentRun as listed at start-up and on each change: schedule a finished run's
    deletion after ``spec.ttlSecondsAfterFinished``; purge the events of a deleted finished
    run (an unfinished one is cleaned up by ``delete_run`` before its finalizer goes)."""
    assert namespace is not None  # AgentRun is namespaced
    parts = memo.running()
    key = RunKey(namespace, name, uid)
    if type == "DELETED":
        parts.reaper.forget(key)
        if status.get("terminalReason"):
            await parts.dispatcher.purge_deleted(namespace, name, uid)
        return
    policy = parts.tenants.policies.get(str(status.get("tenant") or ""))
    default_ttl = policy.ttl_after_finished if policy is not None else None
    parts.reaper.observe(key, spec=spec, status=status, default_ttl=default_ttl)


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
    try:
        await client.CustomObjectsApi(parts.api).patch_namespaced_custom_object_status(
            kube.GROUP,
            kube.VERSION,
            namespace,
            kube.AGENTS,
            name,
            {"metadata": {"uid": body.get("metadata", {}).get("uid")}, "status": new},
            **MERGE_PATCH,
        )
    except ApiException as err:
        if err.status not in (404, 409):  # gone, or replaced by a new object of the name
            raise


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
