"""kopf entry points: start-up wiring, admission on create/resume, cancellation, deletion.

Handlers stay thin: they fetch what admission needs and hand over to ``dispatch``. kopf keeps its
own bookkeeping in annotations (prefix ``kopf.agentrun.dev``), never in ``.status``, which is
ours alone (a projection of the run's events).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import time
from typing import Any, cast

import kopf
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from agentrun import kernel, kube
from agentrun.bus import Bus, BusSettings
from agentrun.ledger import LedgerStore
from agentrun.settings import OperatorSettings
from agentrun.tools import default_catalog

from . import admission
from .admitter import CANCEL_ANNOTATION, Admitter, NoTenant, Tenants
from .dispatch import Dispatcher
from .statuswriter import MERGE_PATCH, RunKey, StatusWriter, kube_patcher

log = logging.getLogger(__name__)

KUBECTL_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
APPROVE_ANNOTATION = "agentrun.dev/approve"
"""Set to the digest in ``.status.pendingApproval`` to approve that held call."""
DENY_ANNOTATION = "agentrun.dev/deny"
"""Set to the digest in ``.status.pendingApproval`` to deny that held call."""
FINALIZER = "agentrun.dev/finalizer"
RUN = (kube.GROUP, kube.VERSION, kube.RUNS)
TENANT = (kube.GROUP, kube.VERSION, kube.TENANTS)


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
    config = OperatorSettings()
    memo.bus = await Bus.connect(
        BusSettings(url=config.nats_url, ack_wait=config.turn_ack_wait),
        name=f"agentrun-operator-{os.getpid()}",
    )
    memo.api = await kube.api_client()
    memo.writer = StatusWriter(kube_patcher(memo.api), interval=config.status_interval)
    memo.writer.start()
    memo.dispatcher = Dispatcher(memo.bus, memo.writer)
    memo.writer.on_gone = memo.dispatcher.on_gone
    catalog = default_catalog(kube=None)
    memo.known_tools = {name: tool.spec.pollable for name, tool in catalog.items()}
    memo.tenants = Tenants(memo.api, default=config.default_tenant)
    for obj in await _list_tenants(memo.api):  # before any run is admitted: no false "no tenant"
        memo.tenants.put(obj)
    memo.admitter = Admitter(
        await LedgerStore.open(memo.bus.js),
        memo.dispatcher,
        memo.writer,
        memo.tenants,
        api=memo.api,
        known_tools=memo.known_tools,
        tool_specs=lambda names: catalog.specs(names) if names else [],
        sweep_interval=config.ledger_sweep,
    )
    memo.consumer = asyncio.create_task(memo.dispatcher.run(), name="event-consumer")
    memo.gauges = asyncio.create_task(memo.dispatcher.watch_queue(), name="queue-gauges")
    memo.sweeper = asyncio.create_task(memo.admitter.run(), name="ledger-sweep")


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
async def stop(memo: kopf.Memo, **_: Any) -> None:
    """Stop consuming, flush status, close connections; bounded, even with NATS gone."""
    memo.dispatcher.stop()
    memo.admitter.stop()
    memo.consumer.cancel()
    memo.gauges.cancel()
    memo.sweeper.cancel()
    await memo.dispatcher.close()
    for closing in (memo.writer.close(), memo.bus.close(), memo.api.close()):
        try:
            async with asyncio.timeout(5):
                await closing
        except Exception as err:  # shutting down: log and go on
            log.warning("shutdown step failed: %r", err)


def _created(meta: kopf.Meta) -> float:
    text = meta.get("creationTimestamp")
    if isinstance(text, str):
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    return time.time()


def _reject(
    memo: kopf.Memo, run: RunKey, message: str, *, generation: int, tenant: str | None = None
) -> None:
    memo.admitter.end_unadmitted(
        run, kernel.Phase.INVALID_SPEC, message, tenant=tenant, generation=generation
    )


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
    admitter: Admitter = memo.admitter
    generation = int(meta.get("generation") or 1)
    if await dispatcher.recover(namespace, name, uid, generation=generation):
        return
    key = RunKey(namespace, name, uid)
    try:
        policy = await memo.tenants.resolve(namespace)
    except NoTenant as err:
        _reject(memo, key, str(err), generation=generation)
        return
    except ApiException as err:
        raise kopf.TemporaryError(f"cannot read namespace {namespace!r}: {err.status}") from err
    try:  # reject what can never run now, not after it waited in the queue
        await admitter.prepare(key, spec, policy, start_time=time.time())
    except admission.InvalidSpec as err:
        _reject(memo, key, str(err), generation=generation, tenant=policy.name)
        return
    except ApiException as err:
        raise kopf.TemporaryError(
            f"cannot read the AgentModel: HTTP {err.status}", delay=5
        ) from err
    obj = {"metadata": {"generation": generation, "annotations": dict(meta.annotations)}}
    await admitter.submit(
        key, policy, generation=generation, created=_created(meta), obj={**obj, "spec": dict(spec)}
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
    """Admit a new AgentRun: validate it against its AgentModel and its AgentTenant, queue it
    in the tenant's admission queue (the admitter starts it when the tenant has room), or,
    after an operator restart, pick up where the run's events left off."""
    await _admit(
        spec=spec, meta=meta, status_=status, namespace=namespace, name=name, uid=uid, memo=memo
    )


@kopf.on.update(*RUN, annotations={CANCEL_ANNOTATION: "true"})
async def cancel_run(
    *, status: kopf.Status, namespace: str | None, name: str, uid: str, memo: kopf.Memo, **_: Any
) -> None:
    """``agentrun.dev/cancel: "true"``: end the run ``cancelled``; workers drop its turn; a
    queued run leaves its queue."""
    assert namespace is not None  # AgentRun is namespaced
    if status.get("terminalReason"):
        return
    ended = await memo.dispatcher.end(
        namespace,
        name,
        uid,
        kernel.Phase.CANCELLED,
        f"cancelled by the {CANCEL_ANNOTATION} annotation",
    )
    if not ended:
        await memo.admitter.cancel_queued(RunKey(namespace, name, uid), status.get("tenant"))


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
    """Stop the run, settle its ledger entry and purge its events (or take it out of its
    queue); bounded, so the finalizer always goes."""
    assert namespace is not None  # AgentRun is namespaced
    try:
        async with asyncio.timeout(10):
            await memo.admitter.forget_queued(uid)
    except Exception as err:  # NATS down: the pump drops queued runs that no longer exist
        log.warning("could not take %s/%s out of its queue: %r", namespace, name, err)
    await memo.dispatcher.forget(namespace, name, uid)


@kopf.on.event(*TENANT)
async def tenant_changed(
    *, type: str | None, body: kopf.Body, name: str, memo: kopf.Memo, **_: Any
) -> None:
    """Keep the tenant registry current; a changed tenant (more budget, more slots) is pumped."""
    if type == "DELETED":
        memo.tenants.remove(name)
        return
    if memo.tenants.put(body) is not None:
        memo.admitter.kick(name)
