"""kopf entry points: start-up wiring, admission on create/resume, cancellation, deletion.

Handlers stay thin: they fetch what admission needs and hand over to ``dispatch``. kopf keeps its
own bookkeeping in annotations (prefix ``kopf.agentrun.dev``), never in ``.status``, which is
ours alone (a projection of the run's events).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import os
import time
from typing import Any, cast

import kopf
import nats.errors
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from agentrun import kernel, kube, protocol, telemetry
from agentrun.bus import Bus, BusSettings
from agentrun.tools import default_catalog

from . import admission, status
from .dispatch import Dispatcher
from .statuswriter import MERGE_PATCH, RunKey, StatusWriter, kube_patcher

log = logging.getLogger(__name__)

KUBECTL_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
CANCEL_ANNOTATION = "agentrun.dev/cancel"
APPROVE_ANNOTATION = "agentrun.dev/approve"
"""Set to the digest in ``.status.pendingApproval`` to approve that held call."""
DENY_ANNOTATION = "agentrun.dev/deny"
"""Set to the digest in ``.status.pendingApproval`` to deny that held call."""
FINALIZER = "agentrun.dev/finalizer"
RUN = (kube.GROUP, kube.VERSION, kube.RUNS)


class MetadataDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's last-handled-configuration without ``spec``.

    An AgentRun's spec is immutable (CEL ``self == oldSelf``), so the only changes the handlers
    react to are annotations (cancel, approve, deny). Leaving the spec out keeps the annotation
    small — kopf would otherwise copy the whole spec into an annotation, which the API server
    refuses past 256 KiB (a long non-ASCII goal, a large output schema), leaving the object
    undeletable — and saves a deep copy of the spec on every watch event.
    """

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        """The essence kopf compares: labels and annotations only."""
        essence: dict[str, Any] = dict(super().build(body=body, extra_fields=extra_fields))
        essence.pop("spec", None)
        annotations: dict[str, Any] = essence.get("metadata", {}).get("annotations", {})
        annotations.pop(KUBECTL_LAST_APPLIED, None)  # a copy of the whole object
        return cast(kopf.BodyEssence, essence)


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Configure kopf, connect to NATS and the API server, start the event consumer."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix="kopf.agentrun.dev"
    )
    settings.persistence.diffbase_storage = MetadataDiffBaseStorage(
        prefix="kopf.agentrun.dev", key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    url = os.environ.get("AGENTRUN_NATS_URL", "nats://127.0.0.1:4222")
    ack_wait = float(os.environ.get("AGENTRUN_TURN_ACK_WAIT", "30") or 30)
    memo.bus = await Bus.connect(
        BusSettings(url=url, ack_wait=ack_wait), name=f"agentrun-operator-{os.getpid()}"
    )
    memo.api = await kube.api_client()
    memo.writer = StatusWriter(
        kube_patcher(memo.api), interval=float(os.environ.get("AGENTRUN_STATUS_INTERVAL", "5") or 5)
    )
    memo.writer.start()
    memo.dispatcher = Dispatcher(memo.bus, memo.writer)
    memo.writer.on_gone = memo.dispatcher.on_gone
    memo.consumer = asyncio.create_task(memo.dispatcher.run(), name="event-consumer")
    memo.gauges = asyncio.create_task(memo.dispatcher.watch_queue(), name="queue-gauges")
    memo.known_tools = {
        name: tool.spec.pollable for name, tool in default_catalog(kube=None).items()
    }


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    """Stop consuming, flush status, close connections; bounded, even with NATS gone."""
    memo.dispatcher.stop()
    memo.consumer.cancel()
    memo.gauges.cancel()
    await memo.dispatcher.close()
    for closing in (memo.writer.close(), memo.bus.close(), memo.api.close()):
        try:
            async with asyncio.timeout(5):
                await closing
        except Exception as err:  # shutting down: log and go on
            log.warning("shutdown step failed: %r", err)


async def _get_model(api: client.ApiClient, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = await client.CustomObjectsApi(api).get_cluster_custom_object(
            kube.GROUP, kube.VERSION, kube.MODELS, name
        )
    except ApiException as err:
        if err.status == 404:
            return None
        raise kopf.TemporaryError(
            f"cannot read AgentModel {name!r}: HTTP {err.status}", delay=5
        ) from err
    return found


def _start_time(status_: kopf.Status) -> float:
    text = status_.get("startTime")
    if isinstance(text, str):
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    return time.time()


def _reject(memo: kopf.Memo, run: RunKey, message: str, *, generation: int) -> None:
    log.info("rejecting %s/%s: %s", run.namespace, run.name, message)
    body = status.rejected(message, at=time.time(), generation=generation)
    memo.writer.submit(run, body, seq=0, terminal=True)
    rejected = kernel.stop(kernel.initial_state(goal=""), kernel.Phase.INVALID_SPEC, message)
    memo.dispatcher.count_end(run.uid, rejected, tenant=protocol.DEFAULT_TENANT)


async def _admit(
    *,
    spec: kopf.Spec,
    meta: kopf.Meta,
    status_: kopf.Status,
    namespace: str | None,
    name: str,
    uid: str,
    memo: kopf.Memo,
) -> None:
    assert namespace is not None  # AgentRun is namespaced
    if status_.get("terminalReason"):
        return
    dispatcher: Dispatcher = memo.dispatcher
    generation = int(meta.get("generation") or 1)
    if await dispatcher.recover(namespace, name, uid, generation=generation):
        return
    model = await _get_model(memo.api, str(spec.get("model", "")))
    start_time = _start_time(status_)
    try:
        config = admission.admit(
            admission.RunRef(namespace, name, uid),
            spec,
            model=model,
            known_tools=memo.known_tools,
            start_time=start_time,
        )
    except admission.InvalidSpec as err:
        _reject(memo, RunKey(namespace, name, uid), str(err), generation=generation)
        return
    config = dataclasses.replace(config, traceparent=telemetry.mint_traceparent())
    try:
        await dispatcher.admit(config, start_time=start_time, generation=generation)
    except nats.errors.MaxPayloadError:
        size = len(config.as_dict().__repr__())
        _reject(
            memo,
            RunKey(namespace, name, uid),
            f"spec: about {size} bytes, more than the event stream's message limit allows to "
            "checkpoint; shorten spec.goal, spec.instructions or spec.output.schema",
            generation=generation,
        )
        return
    if meta.get("annotations", {}).get(CANCEL_ANNOTATION) == "true":
        await dispatcher.end(
            namespace,
            name,
            uid,
            kernel.Phase.CANCELLED,
            f"cancelled by the {CANCEL_ANNOTATION} annotation",
        )


@kopf.on.create(*RUN)
@kopf.on.resume(*RUN)
async def admit_run(
    *,
    spec: kopf.Spec,
    meta: kopf.Meta,
    status: kopf.Status,
    namespace: str | None,
    name: str,
    uid: str,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """Admit a new AgentRun (validate it against its AgentModel, queue its first turn), or,
    after an operator restart, pick up where the run's events left off."""
    await _admit(
        spec=spec, meta=meta, status_=status, namespace=namespace, name=name, uid=uid, memo=memo
    )


@kopf.on.update(*RUN, annotations={CANCEL_ANNOTATION: "true"})
async def cancel_run(
    *, status: kopf.Status, namespace: str | None, name: str, uid: str, memo: kopf.Memo, **_: Any
) -> None:
    """``agentrun.dev/cancel: "true"``: end the run ``cancelled``; workers drop its turn."""
    assert namespace is not None  # AgentRun is namespaced
    if status.get("terminalReason"):
        return
    await memo.dispatcher.end(
        namespace,
        name,
        uid,
        kernel.Phase.CANCELLED,
        f"cancelled by the {CANCEL_ANNOTATION} annotation",
    )


@kopf.on.update(*RUN, annotations={APPROVE_ANNOTATION: kopf.PRESENT})
@kopf.on.update(*RUN, annotations={DENY_ANNOTATION: kopf.PRESENT})
async def review_run(
    *,
    annotations: kopf.Annotations,
    namespace: str | None,
    name: str,
    uid: str,
    memo: kopf.Memo,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    """``agentrun.dev/approve`` or ``agentrun.dev/deny`` set to the pending call's digest.

    The decision is applied only if the digest is the one waiting (the kernel checks), then the
    annotation is removed so the same digest can be decided again later in the run.
    """
    assert namespace is not None  # AgentRun is namespaced
    for key, approved in ((APPROVE_ANNOTATION, True), (DENY_ANNOTATION, False)):
        digest = annotations.get(key)
        if not digest:
            continue
        refused = await memo.dispatcher.decide(
            namespace, name, uid, digest=str(digest), approved=approved
        )
        if refused is not None:
            logger.warning("%s=%s not applied: %s", key, digest, refused)
        await _remove_annotation(memo.api, namespace, name, key)


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


@kopf.on.delete(*RUN)
async def delete_run(
    *, namespace: str | None, name: str, uid: str, memo: kopf.Memo, **_: Any
) -> None:
    """Stop the run and purge its events; bounded, so the finalizer always goes."""
    assert namespace is not None  # AgentRun is namespaced
    await memo.dispatcher.forget(namespace, name, uid)
