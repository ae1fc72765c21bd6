"""kopf's entry points of an AgentRun's admission: on create and on an operator's resume
(admit a new run, pick up one from its events, or end one whose checkpoint is gone or that was
restored from a backup: ``runs.recovery``), and the ``agentrun.dev/rerun`` annotation that
starts a run again from turn 0.

Handlers stay thin: they resolve what admission needs (the tenant, the Agent a run refers to,
its AgentModel) and hand over to the parts built by ``wiring`` (``RunHandling``). What does not
belong here: the AgentRun's other handlers (cancel, review, deletion, TTL: ``runs``).
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Mapping
from typing import Any

import kopf

from agentrun import kernel, kube

from ..admission.lookup import ToolServerPending
from ..agents.resolve import InvalidRef
from ..agents.store import resolve_run
from ..platform import failures
from ..platform.events import EventRecorder, EventType, Involved
from ..platform.kubeapi import ApiError, KubeApi
from ..platform.spec import ObjectMeta, ReferenceMissing, SpecError
from ..runs import recovery
from ..runs.keys import ADMITTED_UID_ANNOTATION, CANCEL_ANNOTATION, RERUN_ANNOTATION, RunKey
from ..runs.recovery import Admission
from ..runs.spec import RunObject, RunStatusView
from ..tenants.policy import TenantPolicy
from ..tenants.registry import NoTenant
from ..wiring import OperatorMemo, RunHandling
from .retrying import retrying

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
    parts: RunHandling,
    key: RunKey,
    *,
    spec: kopf.Spec,
    meta: kopf.Meta,
    status: Mapping[str, Any],
    removed: tuple[str, ...] = (),
) -> None:
    """Resolve the run's tenant and Agent, reject what can never run, queue the rest (as
    ``meta`` shows it, less the annotations ``removed`` from the object since, in the life
    ``status.reruns`` counts)."""
    generation = int(meta.get("generation") or 1)
    created = _created(meta)
    policy = await _tenant_policy(parts, key, generation=generation, status=status, created=created)
    if policy is None:
        return
    try:  # before the tenant's policy: it applies to the spec the run executes
        run_spec = await resolve_run(parts.api, key, spec, status)
    except InvalidRef as err:
        _reject(parts, key, str(err), generation=generation, tenant=policy.name)
        return
    except ApiError as err:
        if failures.transient(err):
            raise kopf.TemporaryError(f"cannot resolve spec.agentRef: {err}", delay=2) from err
        # the resolution's record is refused as it is (too large, invalid): it never will be
        message = (
            "spec.agentRef: the resolved spec cannot be recorded in status.resolvedSpec: the "
            f"API server refused it ({err}); shorten the Agent's instructions or parameters"
        )
        _reject(parts, key, message, generation=generation, tenant=policy.name)
        return
    if not await _can_run(parts, key, run_spec, policy, generation=generation, status=status):
        return
    obj = _queued_object(meta, run_spec, status, removed=removed)
    queued = recovery.queued_since(created, status)
    await parts.pump.enqueue_run(key, policy, generation=generation, created=queued, obj=obj)


async def _can_run(
    parts: RunHandling,
    key: RunKey,
    run_spec: Mapping[str, Any],
    policy: TenantPolicy,
    *,
    generation: int,
    status: Mapping[str, Any],
) -> bool:
    """Whether run ``key`` may be queued: what can never run is rejected now (``False``),
    not after it waited in the queue. An object it names missing (``ReferenceMissing``)
    rejects a new run; a queued one resumed (its queue holds it: ``status.tenant``'s) waits
    for it there. Raises ``kopf.TemporaryError`` when the AgentModel cannot be read."""
    try:
        await parts.configs.build_config(key, run_spec, policy, start_time=time.time())
    except ReferenceMissing as err:
        if await parts.pump.holds(str(status.get("tenant") or ""), key.uid):
            log.info("queued run %s/%s waits: %s", key.namespace, key.name, err)
            return True
        _reject(parts, key, str(err), generation=generation, tenant=policy.name)
        return False
    except ToolServerPending as err:  # applied together with its AgentToolServer: a normal
        # wait, shown as Queued (ToolServerPending) by the queue, not an error to retry
        log.info("run %s/%s waits for discovery: %s", key.namespace, key.name, err)
    except SpecError as err:
        _reject(parts, key, str(err), generation=generation, tenant=policy.name)
        return False
    except ApiError as err:
        raise kopf.TemporaryError(
            f"cannot read the AgentModel: HTTP {err.status}", delay=5
        ) from err
    return True


def _queued_object(
    meta: kopf.Meta,
    run_spec: Mapping[str, Any],
    status: Mapping[str, Any],
    *,
    removed: tuple[str, ...],
) -> RunObject:
    """The run as the queue pump keeps it: ``meta`` less the annotations ``removed``, the
    spec it executes, and its life (``status.reruns``), which its admission seals."""
    kept = {k: v for k, v in meta.annotations.items() if k not in removed}
    return RunObject(
        metadata=ObjectMeta(generation=int(meta.get("generation") or 1), annotations=kept),
        spec=dict(run_spec),
        status=RunStatusView(reruns=int(status.get("reruns") or 0)),
    )


async def _tenant_policy(
    parts: RunHandling,
    key: RunKey,
    *,
    generation: int,
    status: Mapping[str, Any],
    created: float,
) -> TenantPolicy | None:
    """The policy of the tenant run ``key``'s namespace resolves to, or ``None`` once the run
    was rejected for having none, left waiting in the queue of the deleted or invalid
    AgentTenant its ``status`` names when its namespace binds no tenant or falls to the
    default one (``QueuePump.keeps``: resumed after a restart, it fares as the queue pump's
    passes let it), or handed to another shard: one whose ``status``
    shows it queued in a tenant of this process's (its queue's pump stopped before it handed
    it over, ``QueuePump._hand_over``). Raises ``kopf.TemporaryError`` (retried) when the
    namespace cannot be read, or when that tenant is another shard's (``_check_owned``).
    ``created``: the object's creationTimestamp (epoch seconds)."""
    try:
        policy = await parts.tenants.resolve(key.namespace)
    except NoTenant as err:
        queued_in = str(status.get("tenant") or "")
        if not queued_in or not await parts.pump.keeps(queued_in, key.uid):
            parts.shown.end_unbound(key, str(err), generation=generation)
        return None
    except ApiError as err:
        raise kopf.TemporaryError(
            f"cannot read namespace {key.namespace!r}: {err.status}", delay=2
        ) from err
    queued_in = str(status.get("tenant") or "")
    fell = queued_in not in ("", policy.name) and parts.tenants.falls_back(policy, key.namespace)
    if fell and await parts.pump.keeps(queued_in, key.uid):  # as its old queue's grace says
        return None
    queued = status.get("phase") == kernel.ResourcePhase.QUEUED.value and status.get("tenant")
    if queued and not parts.ownership.owns_tenant(policy.name):
        since = recovery.queued_since(created, status)
        parts.shown.hand_over(key, policy.name, generation=generation, since=since)
        return None
    _check_owned(parts, key, policy.name)
    return policy


def _check_owned(parts: RunHandling, key: RunKey, tenant: str) -> None:
    """Raise ``kopf.TemporaryError`` (retried) if ``tenant`` is another shard's: the run's
    namespace was relabelled since its shard was judged; its owner admits it."""
    if not parts.ownership.owns_tenant(tenant):
        raise kopf.TemporaryError(
            f"namespace {key.namespace!r} now resolves to tenant {tenant!r} of another "
            "operator shard; its owner admits the run",
            delay=5,
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
    retry: int,
    memo: OperatorMemo,
    **_: Any,
) -> None:
    """Admit a new AgentRun: validate it against its AgentModel and its AgentTenant, queue it
    in the tenant's admission queue (the pump starts it when the tenant has room), or,
    after an operator restart, pick up where the run's events left off. A run admitted before
    whose events are gone, or a copy restored from a backup, is not run again unless
    ``agentrun.dev/rerun`` asks (``runs.recovery``: it ends ``checkpoint_failed``).

    A failure that passes (the API server or NATS away) is retried by kopf; one that does not
    (``platform.failures``) is retried once, then ends the run ``checkpoint_failed`` naming
    it, so kopf does not retry it for ever."""
    assert namespace is not None  # AgentRun is namespaced
    if status.get("terminalReason") and not recovery.rerun_asked(meta.get("annotations") or {}):
        return
    parts = memo.running().runs
    key = RunKey(namespace, name, uid)
    try:
        async with parts.gate.turn(namespace):  # fair across namespaces: admission.fairgate
            await _admit(parts, key, spec=spec, meta=meta, status=status)
    except kopf.TemporaryError:
        raise
    except Exception as err:
        if failures.transient(err) or retry + 1 < failures.GIVE_UP_AFTER:
            raise kopf.TemporaryError(f"{type(err).__name__}: {err}", delay=2) from err
        message = f"admission failed twice, not for a passing reason: {type(err).__name__}: {err}"
        log.error("AgentRun %s/%s: %s", namespace, name, message, exc_info=err)
        generation = int(meta.get("generation") or 1)
        parts.shown.end_unadmitted(
            key, kernel.Phase.CHECKPOINT_FAILED, message[:1000], tenant=None, generation=generation
        )


async def _admit(
    parts: RunHandling, key: RunKey, *, spec: kopf.Spec, meta: kopf.Meta, status: kopf.Status
) -> None:
    """Act on ``recovery.decide`` for run ``key`` as kopf shows it on create or resume."""
    annotations = dict(meta.get("annotations") or {})
    generation = int(meta.get("generation") or 1)
    recovered = not status.get("terminalReason") and await parts.runs.recover(
        key.namespace,
        key.name,
        key.uid,
        generation=generation,
        reruns=int(status.get("reruns") or 0),
    )
    action = recovery.decide(
        uid=key.uid, annotations=annotations, status=status, has_events=recovered
    )
    if action is Admission.RECOVER:
        await _recovered(parts, key, annotations)
    elif action is Admission.RERUN:
        await _rerun(parts, key, spec=spec, meta=meta, status=status)
    elif action in (Admission.LOST, Admission.RESTORED):
        await _end_lost(
            parts, key, action, annotations=annotations, status=status, generation=generation
        )
    elif action is Admission.ADMIT:
        await _validate_and_enqueue(parts, key, spec=spec, meta=meta, status=status)


async def _end_lost(
    parts: RunHandling,
    key: RunKey,
    action: Admission,
    *,
    annotations: dict[str, Any],
    status: kopf.Status,
    generation: int,
) -> None:
    """End run ``key`` (``LOST`` or ``RESTORED``) ``checkpoint_failed`` saying why and how to
    rerun it; its end's Warning Event carries the message (``QueueStatus.end_unadmitted``). A
    restored copy whose original's events are still there and ended it shows that end instead
    (``Dispatcher.project_restored``)."""
    original = str(annotations.get(ADMITTED_UID_ANNOTATION) or "")
    if action is Admission.RESTORED and await parts.runs.project_restored(
        key.namespace, key.name, key.uid, original=original, generation=generation
    ):
        log.info(
            "AgentRun %s/%s: restored copy of %s shows its end", key.namespace, key.name, original
        )
        return
    message = recovery.end_message(action, key, annotations=annotations)
    log.warning("AgentRun %s/%s: %s", key.namespace, key.name, message)
    parts.shown.end_unadmitted(
        key,
        kernel.Phase.CHECKPOINT_FAILED,
        message,
        tenant=status.get("tenant") or None,
        generation=generation,
        seq=int(status.get("lastEventSequence") or 0),
    )


async def check_restored(
    parts: RunHandling, key: RunKey, *, meta: kopf.Meta, status: kopf.Status
) -> None:
    """Every AgentRun as watched: a restored copy (``Admission.RESTORED``) kopf did not hand
    to ``admit_run``, because the backup held kopf's own annotations too, ends as
    ``admit_run`` would end it; a run that ended without its uid recorded (ended unadmitted,
    or before the annotation existed) gets it, so a copy restored without its status is
    recognised too. The record is best effort (logged)."""
    annotations = dict(meta.get("annotations") or {})
    if status.get("terminalReason") and not annotations.get(ADMITTED_UID_ANNOTATION):
        await _record_uid(parts.api, key)
        return
    action = recovery.decide(uid=key.uid, annotations=annotations, status=status, has_events=False)
    if action is Admission.RESTORED and not parts.runs.is_tracked(key.uid):
        generation = int(meta.get("generation") or 1)
        await _end_lost(
            parts, key, action, annotations=annotations, status=status, generation=generation
        )


async def _record_uid(api: KubeApi, key: RunKey) -> None:
    """Record run ``key``'s uid in ``agentrun.dev/admitted-uid`` (``recovery.admitted_patch``);
    best effort: a failure is logged (the API server away, or the object replaced: 422)."""
    try:
        await api.patch(key.ref, recovery.admitted_patch(key.uid))
    except Exception as err:
        log.warning("could not record the uid of %s/%s: %r", key.namespace, key.name, err)


async def _recovered(parts: RunHandling, key: RunKey, annotations: dict[str, Any]) -> None:
    """Run ``key`` was picked up from its events: its admission is recorded (best effort) if
    the object does not show it (admitted before the annotation existed, or its patch was
    lost); a rerun asked of it is ignored (it is still going) and removed, with a Warning
    Event."""
    if annotations.get(ADMITTED_UID_ANNOTATION) != key.uid:
        await _record_uid(parts.api, key)
    if recovery.rerun_asked(annotations):
        _rerun_ignored(parts.events, key)
        await remove_annotations(parts.api, key, (RERUN_ANNOTATION,))


async def _rerun(
    parts: RunHandling, key: RunKey, *, spec: kopf.Spec, meta: kopf.Meta, status: kopf.Status
) -> None:
    """Start run ``key`` again from turn 0 as a new run (``agentrun.dev/rerun``): clear its
    status and count the new life in ``status.reruns`` (``recovery.rerun_status``, at the
    object's resourceVersion), purge its subject, free its ledger slot, remove the
    recorded admission (after the pump's record of the earlier life, if one is still being
    written, lands; before the pump can record the new one) and the
    ``agentrun.dev/cancel`` that ended it, if one did (else the new run would be cancelled as
    it is queued: "cancel it first" is how a run still going is rerun), validate and queue it
    (its budget is charged again; its admission seals the new life), and only then remove
    ``agentrun.dev/rerun``: until then a failure raises, and kopf's retry or the next resume
    starts over (each step may be repeated; a life counted twice is still a later one). The
    count is written before the purge, so that an admission of the earlier life appended to
    the emptied subject meets an object that shows a later one (``Dispatcher.recover``,
    ``on_event``). An object gone or replaced meanwhile is left alone."""
    reset = await _count_life(parts.api, key, generation=int(meta.get("generation") or 1))
    if reset is None:
        return
    reruns = int(reset["reruns"])
    await parts.runs.prepare_rerun(key.namespace, key.name, key.uid)
    if status.get("tenant"):
        await parts.pump.release_slot(str(status["tenant"]), key.uid, life=reruns - 1)
    spent = (ADMITTED_UID_ANNOTATION, CANCEL_ANNOTATION)
    await parts.pump.recorded(key.uid)  # the earlier life's record lands before its removal
    await remove_annotations(parts.api, key, spent)
    parts.events.record(
        Involved("AgentRun", key.name, key.namespace, key.uid),
        type=EventType.NORMAL,
        reason="Rerun",
        message=f"{RERUN_ANNOTATION}: running again from turn 0 as a new run",
    )
    now = {**status, "reruns": reruns, "conditions": reset["conditions"]}  # queued from now
    await _validate_and_enqueue(parts, key, spec=spec, meta=meta, status=now, removed=spent)
    await remove_annotations(parts.api, key, (RERUN_ANNOTATION,))


async def _count_life(api: KubeApi, key: RunKey, *, generation: int) -> dict[str, Any] | None:
    """Clear run ``key``'s status for a rerun, counting the life it starts in
    ``status.reruns`` (``recovery.rerun_status``), at the object's resourceVersion: the status
    patch written (its ``reruns`` the new count), or ``None`` when the object is gone or
    replaced. Raises ``ApiError`` (409: it changed meanwhile; kopf's retry reads it again)."""
    obj = await api.get(key.ref)
    meta = (obj or {}).get("metadata") or {}
    if obj is None or meta.get("uid") != key.uid:
        return None
    reruns = int((obj.get("status") or {}).get("reruns") or 0) + 1
    reset = recovery.rerun_status(at=time.time(), generation=generation, reruns=reruns)
    version = str(meta.get("resourceVersion") or "")
    await api.patch_status(key.ref, reset, uid=key.uid, version=version)
    return reset


def _rerun_ignored(events: EventRecorder, key: RunKey) -> None:
    """The Warning Event of a rerun asked of a run that is still going."""
    events.record(
        Involved("AgentRun", key.name, key.namespace, key.uid),
        type=EventType.WARNING,
        reason="RerunIgnored",
        message=(
            f"{RERUN_ANNOTATION} ignored: the run is still going; cancel it "
            f"({CANCEL_ANNOTATION}) and set {RERUN_ANNOTATION} again once it ended"
        ),
        key=(key.uid, "RerunIgnored"),
    )


@kopf.on.update(*RUN, annotations={RERUN_ANNOTATION: "true"})
@retrying
async def rerun_run(
    *,
    spec: kopf.Spec,
    meta: kopf.Meta,
    namespace: str | None,
    name: str,
    uid: str,
    memo: OperatorMemo,
    **_: Any,
) -> None:
    """``agentrun.dev/rerun: "true"`` set on a run, as the object is now (kopf's copy may be
    older: ``admit_run`` may have acted on it already): one that ended (for any reason) runs
    again from turn 0 as a new run (as does one whose rerun began and failed: kopf retries
    it); one still going (or queued) has it ignored and removed, with a Warning Event; one the
    operator will not resume (its checkpoint lost, or restored from a backup, not yet ended)
    is left to ``admit_run``, which decides it on create or resume."""
    assert namespace is not None  # AgentRun is namespaced
    parts = memo.running().runs
    key = RunKey(namespace, name, uid)
    obj = await parts.api.get(key.ref)
    meta_now = (obj or {}).get("metadata") or {}
    if meta_now.get("uid") != uid or not recovery.rerun_asked(meta_now.get("annotations") or {}):
        return  # gone, replaced, or already read
    now: dict[str, Any] = (obj or {}).get("status") or {}
    if now.get("terminalReason") or recovery.rerun_started(now):  # or kopf's retry of one
        await _rerun(parts, key, spec=spec, meta=meta, status=now)  # type: ignore[arg-type]
        return
    if parts.runs.is_tracked(uid) or not recovery.not_resumed(meta_now["annotations"], now):
        _rerun_ignored(parts.events, key)
        await remove_annotations(parts.api, key, (RERUN_ANNOTATION,))


async def remove_annotations(api: KubeApi, run: RunKey, keys: tuple[str, ...]) -> None:
    """Remove the annotations ``keys`` from the run in one patch (gone already: nothing to
    remove)."""
    await api.patch(run.ref, {"metadata": {"annotations": dict.fromkeys(keys)}})
