"""kopf handlers of AgentRuns: admission on create/resume, cancellation, review, deletion, TTL,
and the end of a run a CronAgentRun or an AgentEval created (told to that controller).

Handlers stay thin: they resolve what admission needs (the tenant, the Agent a run refers to,
its AgentModel) and hand over to the parts built by ``wiring`` (carried in kopf's memo:
``RunHandling``). What does not belong here: kopf's configuration and start-up (``startup``),
the handlers of the objects a run refers to (their kinds' modules beside this one).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from typing import Any

import kopf

from agentrun import kernel, kube

from ..admission.lookup import ToolServerPending
from ..agents.resolve import InvalidRef
from ..agents.store import resolve_run
from ..evals.status import EVAL_LABEL
from ..platform.events import EventType, Involved
from ..platform.kubeapi import ApiError, KubeApi
from ..platform.spec import ObjectMeta, SpecError
from ..runs.keys import APPROVE_ANNOTATION, CANCEL_ANNOTATION, DENY_ANNOTATION, RunKey
from ..runs.spec import RunObject
from ..schedules.spec import CRON_LABEL
from ..tenants.registry import NoTenant
from ..wiring import OperatorMemo, RunHandling

log = logging.getLogger(__name__)

RUN = (kube.GROUP, kube.VERSION, kube.RUNS)


def _created(meta: kopf.Meta) -> float:
    text = meta.get("creationTimestamp")
    if isinstance(text, str):
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    return time.time()


def _reject(
    parts: RunHandling, run: RunKey, message: str, *, generation: int, tenant: str | None = None
) -> None:
    parts.shown.end_unadmitted(
        run, kernel.Phase.INVALID_SPEC, message, tenant=tenant, generation=generation
    )


async def _validate_and_enqueue(
    parts: RunHandling, key: RunKey, *, spec: kopf.Spec, meta: kopf.Meta, status: kopf.Status
) -> None:
    """Resolve the run's tenant and Agent, reject what can never run, queue the rest."""
    generation = int(meta.get("generation") or 1)
    try:
        policy = await parts.tenants.resolve(key.namespace)
    except NoTenant as err:
        _reject(parts, key, str(err), generation=generation)
        return
    except ApiError as err:
        raise kopf.TemporaryError(f"cannot read namespace {key.namespace!r}: {err.status}") from err
    try:  # before the tenant's policy: it applies to the spec the run executes
        run_spec = await resolve_run(parts.api, key, spec, status)
    except InvalidRef as err:
        _reject(parts, key, str(err), generation=generation, tenant=policy.name)
        return
    except ApiError as err:
        raise kopf.TemporaryError(f"cannot resolve spec.agentRef: HTTP {err.status}") from err
    try:  # reject what can never run now, not after it waited in the queue
        await parts.configs.build_config(key, run_spec, policy, start_time=time.time())
    except ToolServerPending as err:  # applied together with its AgentToolServer: a normal
        # wait, shown as Queued (ToolServerPending) by the queue, not an error to retry
        log.info("run %s/%s waits for discovery: %s", key.namespace, key.name, err)
    except SpecError as err:
        _reject(parts, key, str(err), generation=generation, tenant=policy.name)
        return
    except ApiError as err:
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
    parts = memo.running().runs
    generation = int(meta.get("generation") or 1)
    if await parts.runs.recover(namespace, name, uid, generation=generation):
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
    parts = memo.running().runs
    ended = await parts.runs.end(
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
    parts = memo.running().runs
    for key, approved in ((APPROVE_ANNOTATION, True), (DENY_ANNOTATION, False)):
        digest = annotations.get(key)
        if not digest:
            continue
        refused = await parts.runs.decide(
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
        await _remove_annotation(parts.api, RunKey(namespace, name, uid), key)


async def _remove_annotation(api: KubeApi, run: RunKey, key: str) -> None:
    """Remove annotation ``key`` from the run (gone already: nothing to remove)."""
    await api.patch(run.ref, {"metadata": {"annotations": {key: None}}})


def created_by_a_controller(labels: kopf.Labels, **_: Any) -> bool:
    """kopf filter: a run a CronAgentRun or an AgentEval created (it carries their label)."""
    return CRON_LABEL in labels or EVAL_LABEL in labels


@kopf.on.event(*RUN, when=created_by_a_controller)
async def owned_run_changed(
    *,
    type: str | None,
    labels: kopf.Labels,
    status: kopf.Status,
    namespace: str | None,
    memo: OperatorMemo,
    **_: Any,
) -> None:
    """A run a controller created ended or was deleted: its CronAgentRun looks again at its
    schedule; its AgentEval reconciles the suite (grades it, starts the next waiting case)."""
    assert namespace is not None  # AgentRun is namespaced
    if type != "DELETED" and not status.get("terminalReason"):
        return
    parts = memo.running().runs
    if CRON_LABEL in labels:
        parts.schedules.run_changed(namespace, str(labels[CRON_LABEL]))
    if EVAL_LABEL in labels:
        parts.evals.kick(namespace, str(labels[EVAL_LABEL]))


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
    parts = memo.running().runs
    try:
        async with asyncio.timeout(10):
            await parts.pump.forget_queued(uid)
    except Exception as err:  # NATS down: the pump drops queued runs that no longer exist
        log.warning("could not take %s/%s out of its queue: %r", namespace, name, err)
    await parts.runs.forget(namespace, name, uid)


@kopf.on.event(*RUN)
async def run_seen(
    *,
    type: str | None,
    body: kopf.Body,
    spec: kopf.Spec,
    status: kopf.Status,
    namespace: str | None,
    name: str,
    uid: str,
    memo: OperatorMemo,
    **_: Any,
) -> None:
    """Every AgentRun as listed at start-up and on each change: tell the status writer the
    object's version (its next patch then needs no read); schedule a finished run's deletion
    after ``spec.ttlSecondsAfterFinished``; purge the events of a deleted finished run (an
    unfinished one is cleaned up by ``delete_run`` before its finalizer goes)."""
    assert namespace is not None  # AgentRun is namespaced
    parts = memo.running().runs
    key = RunKey(namespace, name, uid)
    if type == "DELETED":
        parts.reaper.forget(key)
        if status.get("terminalReason"):
            await parts.runs.purge_deleted(namespace, name, uid)
        return
    parts.writer.observe(key, body)
    policy = parts.tenants.policies.get(str(status.get("tenant") or ""))
    default_ttl = policy.ttl_after_finished if policy is not None else None
    parts.reaper.observe(key, spec=spec, status=status, default_ttl=default_ttl)
