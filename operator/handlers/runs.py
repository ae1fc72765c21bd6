"""kopf handlers of AgentRuns: cancellation, review, deletion, TTL, and the end of a run a
CronAgentRun or an AgentEval created (told to that controller).

Handlers stay thin: they hand over to the parts built by ``wiring`` (carried in kopf's memo:
``RunHandling``). What does not belong here: admission on create/resume and reruns
(``admission``), kopf's configuration and start-up (``startup``), the handlers of the objects
a run refers to (their kinds' modules beside this one).
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from agentrun import kernel, kube

from ..evals.status import EVAL_LABEL
from ..platform.events import EventRecorder, EventType, Involved
from ..platform.kubeapi import ApiError
from ..runs import lifecycle
from ..runs.dispatch import shown_digest
from ..runs.keys import (
    APPROVE_ANNOTATION,
    CANCEL_ANNOTATION,
    DENY_ANNOTATION,
    REVIEWER_ANNOTATION,
    RunKey,
)
from ..schedules.spec import CRON_LABEL
from ..tenants.registry import NoTenant
from ..wiring import OperatorMemo, RunHandling, stop_deleted
from .admission import check_restored, remove_annotations
from .retrying import retrying
from .startup import LEGACY_FINALIZER

log = logging.getLogger(__name__)

RUN = (kube.GROUP, kube.VERSION, kube.RUNS)


@kopf.on.update(*RUN, annotations={CANCEL_ANNOTATION: "true"})
@retrying
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
    queued run leaves its queue. One admitted while its cancel waited for its queue's pump
    pass (``QueuePump.cancel_queued``) is ended through its events after all."""
    assert namespace is not None  # AgentRun is namespaced
    if status.get("terminalReason"):
        return
    parts = memo.running().runs
    message = f"cancelled by the {CANCEL_ANNOTATION} annotation"
    if await parts.runs.end(namespace, name, uid, kernel.Phase.CANCELLED, message):
        return
    if not await parts.pump.cancel_queued(RunKey(namespace, name, uid), status.get("tenant")):
        await parts.runs.end(namespace, name, uid, kernel.Phase.CANCELLED, message)


@kopf.on.update(*RUN, annotations={APPROVE_ANNOTATION: kopf.PRESENT})
@kopf.on.update(*RUN, annotations={DENY_ANNOTATION: kopf.PRESENT})
@retrying
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
    """``agentrun.dev/approve|deny`` set to the pending call's digest with
    ``agentrun.dev/reviewer`` (checked by the chart's admission policy): applied only if the
    digest is the one waiting (the kernel checks), the reviewer recorded in the approval event,
    the held call's status and the Event; then the annotations are removed together, so the
    same digest can be decided again later in the run."""
    assert namespace is not None  # AgentRun is namespaced
    parts = memo.running().runs
    reviewer = str(annotations.get(REVIEWER_ANNOTATION) or "")
    for key, approved in ((APPROVE_ANNOTATION, True), (DENY_ANNOTATION, False)):
        digest = annotations.get(key)
        if not digest:
            continue
        refused = await parts.runs.decide(
            namespace, name, uid, digest=str(digest), approved=approved, reviewer=reviewer
        )
        if refused is not None:
            logger.warning("%s=%s not applied: %s", key, shown_digest(str(digest)), refused)
        _record_decision(
            parts.events,
            Involved("AgentRun", name, namespace, uid),
            key=key,
            digest=str(digest),
            reviewer=reviewer,
            refused=refused,
        )
    await remove_annotations(
        parts.api,
        RunKey(namespace, name, uid),
        (APPROVE_ANNOTATION, DENY_ANNOTATION, REVIEWER_ANNOTATION),
    )


def _record_decision(
    events: EventRecorder,
    involved: Involved,
    *,
    key: str,
    digest: str,
    reviewer: str,
    refused: str | None,
) -> None:
    """The Event of one ``key`` (``agentrun.dev/approve`` or ``/deny``) on the held call
    `digest`: Warning ``ApprovalNotApplied`` naming why it was `refused`, else Normal
    ``Approved``/``Denied`` naming the reviewer (one Event per run, outcome and digest). The
    digest is quoted, and told apart, by its first ``DIGEST_SHOWN`` characters: the throttle
    remembers 10,000 keys, which a reviewer's annotations of 256 KiB would make 2.5 GiB."""
    uid, shown = involved.uid, shown_digest(digest)
    if refused is not None:
        events.record(
            involved,
            type=EventType.WARNING,
            reason="ApprovalNotApplied",
            message=f"{key}={shown} not applied: {refused}",
            key=(uid, "ApprovalNotApplied", shown),
        )
        return
    approved = key == APPROVE_ANNOTATION
    events.record(
        involved,
        type=EventType.NORMAL,
        reason="Approved" if approved else "Denied",
        message=(
            f"held tool call {shown} {'approved' if approved else 'denied'} by "
            f"{reviewer or 'an unnamed reviewer'} ({key})"
        ),
        key=(uid, "Decided", shown),
    )


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
    if not memo.ownership.cluster_work:
        return  # schedules and evaluations are shard 0's work
    parts = memo.running().runs
    if CRON_LABEL in labels:
        parts.schedules.run_changed(namespace, str(labels[CRON_LABEL]))
    if EVAL_LABEL in labels:
        parts.evals.kick(namespace, str(labels[EVAL_LABEL]))


@kopf.on.event(*RUN)
async def run_seen(
    *,
    type: str | None,
    body: kopf.Body,
    spec: kopf.Spec,
    meta: kopf.Meta,
    status: kopf.Status,
    namespace: str | None,
    name: str,
    uid: str,
    memo: OperatorMemo,
    **_: Any,
) -> None:
    """Every AgentRun as listed at start-up and on each change: end a copy restored from a
    backup that kopf does not take for new (its own annotations came with it), record the uid
    of a run that ended (``admission.check_restored``); tell the status writer the
    object's version (its next patch then needs no read) and the storage count the bytes its
    events take (``status.usage.eventBytes``, per tenant); schedule a finished run's deletion
    after ``spec.ttlSecondsAfterFinished``. A deleted run (``DELETED``: runs hold no
    finalizer, the object is gone already) is cleaned up: a finished one's events purged, an
    unfinished one stopped (``wiring.stop_deleted``), and kopf's memory of it dropped
    (``runs.handled``); a run an earlier version gave its
    finalizer is released once it ends or is deleted (``_release_legacy``). With several
    shards, first learn the tenant of a run not admitted yet (``_owned``), and act only on the
    runs of this process's shards."""
    assert namespace is not None  # AgentRun is namespaced
    parts = memo.running().runs
    if type == "DELETED":
        memo.handled.forget(uid)  # what kopf last handled of it (any shard's)
    if not await _owned(memo, parts, body, type=type, namespace=namespace, uid=uid):
        return  # another shard's run: its owner follows it
    key = RunKey(namespace, name, uid)
    if type == "DELETED":
        parts.reaper.forget(key)
        parts.storage.forget(uid)
        if status.get("terminalReason"):
            await parts.runs.purge_deleted(namespace, name, uid)
        else:
            await stop_deleted(parts, key)
        return
    if LEGACY_FINALIZER in (meta.get("finalizers") or []):
        await _release_legacy(parts, key, meta=meta, status=status)
    parts.writer.observe(key, body)
    parts.storage.observe(uid, status)
    await check_restored(parts, key, meta=meta, status=status)
    policy = parts.tenants.policies.get(str(status.get("tenant") or ""))
    default_ttl = policy.ttl_after_finished if policy is not None else None
    held = lifecycle.held(meta)  # only by the AgentEval or CronAgentRun that controls it
    parts.reaper.observe(key, spec=spec, status=status, default_ttl=default_ttl, held=held)


async def _release_legacy(
    parts: RunHandling, key: RunKey, *, meta: kopf.Meta, status: kopf.Status
) -> None:
    """Run ``key`` holds ``agentrun.dev/finalizer``, which operators before this one added to
    runs that had not ended (and took off at their end, after a deletion's clean-up). Do what
    they did at the same moments, so such a run ends or deletes as it would have: once it has
    ended, or once its deletion started (first stopped as a deleted run: ``stop_deleted``), the
    finalizer is taken off in one patch carrying the object's uid and ``resourceVersion``
    (a conflict means a newer event of it is on its way, which comes here again). A run still
    going keeps it: during a rolling upgrade with several shards, an older operator that owns
    some runs adds it to those, and taking it off there would only make it add it again."""
    if not status.get("terminalReason"):
        if not meta.get("deletionTimestamp"):
            return  # still going: kept
        await stop_deleted(parts, key)
    kept = [f for f in meta.get("finalizers") or [] if f != LEGACY_FINALIZER]
    body = {"uid": key.uid, "resourceVersion": meta.get("resourceVersion"), "finalizers": kept}
    try:
        await parts.api.patch(key.ref, {"metadata": body})
    except ApiError as err:  # 409: changed meanwhile, its next event comes here again
        log.info("finalizer of %s/%s not removed yet: %s", key.namespace, key.name, err)


async def _owned(
    memo: OperatorMemo,
    parts: RunHandling,
    body: kopf.Body,
    *,
    type: str | None,
    namespace: str,
    uid: str,
) -> bool:
    """Whether AgentRun ``body`` is this process's. A run not admitted yet (no
    ``status.tenant``) is first resolved to its namespace's tenant and recorded in
    ``memo.run_shards``, which kopf's storages read next for the same event (``sharding``): no
    tenant means shard 0; an unreadable namespace leaves it unknown (shard 0's, whose
    admission retries)."""
    if memo.ownership.everything:
        return True
    shards = memo.run_shards
    if type != "DELETED" and not (body.get("status") or {}).get("tenant"):
        try:
            shards.learn(uid, (await parts.tenants.resolve(namespace)).name)
        except NoTenant:
            shards.learn(uid, None)
        except ApiError as err:
            log.warning("cannot resolve the tenant of namespace %s: %r", namespace, err)
    return shards.owns(body)
