"""kopf's configuration, start-up and clean-up.

kopf keeps its own bookkeeping in annotations (prefix ``kopf.agentrun.dev``), never in
``.status``, which is ours alone (a projection of the run's events). The start-up handler
builds every part (``wiring``) and keeps them in kopf's memo (an ``OperatorMemo``). What does
not belong here: any handler of a resource (one module per kind, beside this one).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, cast

import kopf

from agentrun import kube, process

from .. import wiring
from ..platform.kubeapi import LIST_PAGE, ApiError, Kube, KubeApi
from ..runs.keys import ADMITTED_UID_ANNOTATION
from ..wiring import OperatorMemo
from . import sharding
from .retrying import retrying

log = logging.getLogger(__name__)

KUBECTL_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
LEGACY_FINALIZER = "agentrun.dev/finalizer"
"""The finalizer operators before this one put on AgentRuns that had not ended. No handler needs
a finalizer now (a deletion is handled from the run's ``DELETED`` watch event:
``handlers.runs.run_seen``); a run that still holds this one has it taken off by ``run_seen``
when it ends or is deleted, as those operators did. kopf is not given the name: it would take
it off every run that holds it at once, and during a rolling upgrade with several shards an
older operator would add it again, each patch answering the other."""


WORKER_IDLE = 0.5
"""Seconds kopf keeps an object's worker after the last event it handled (kopf's default: 5).
An idle worker holds that event — the whole object, decoded — so at start-up, when every
AgentRun is listed and handled once, kopf's default kept the last 5 s of them alive at once,
and the allocator kept the arenas they had taken: with 10,000 finished runs present the
operator settled at 252 MiB RSS in 16.5 s, with 0.5 s at 161–163 MiB in 11–11.5 s (pymalloc
held 163 arenas of 1 MiB, 66 MiB of them in use; then 84). A later event of the object starts a new
worker (a task and a queue); kopf still waits for its own patches to come back
(``settings.persistence.consistency_timeout``) however short this is."""


class MetadataDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's last-handled-configuration without ``spec``.

    An AgentRun's spec is immutable (CEL ``self == oldSelf``), so the only changes the handlers
    react to are annotations (cancel, approve, deny). Leaving the spec out keeps the annotation
    small — kopf would otherwise copy the whole spec into an annotation, which the API server
    refuses past 256 KiB (a long non-ASCII goal, a large output schema), leaving the object
    undeletable — and saves a deep copy of the spec on every watch event. The operator's own
    record ``agentrun.dev/admitted-uid`` is left out too: no handler reacts to it, and as part
    of the essence its write at admission read to kopf as a change, which kopf answered with
    one more write of this annotation to every run (a PATCH and a watch event per run).
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
        metadata: dict[str, Any] = essence.get("metadata", {})
        annotations: dict[str, Any] = metadata.get("annotations", {})
        annotations.pop(KUBECTL_LAST_APPLIED, None)  # a copy of the whole object
        annotations.pop(ADMITTED_UID_ANNOTATION, None)  # the operator's, not a person's
        if not annotations:  # as kopf leaves an essence: no empty sections
            metadata.pop("annotations", None)
        if not metadata:
            essence.pop("metadata", None)
        return cast(kopf.BodyEssence, essence)


@kopf.on.startup()
@retrying
async def start(settings: kopf.OperatorSettings, memo: OperatorMemo, **_: Any) -> None:
    """Configure kopf, connect to the API server, list AgentTenants, start the parts of the
    shards this process owns (``memo.ownership``; with several shards, kopf's storages leave
    the other shards' runs alone: ``sharding``), then hand the stop signals over
    (`hand_over_signals`). Stopped part-way (kopf stopping before its start-up finished runs
    no clean-up handler), it closes the API client it opened; ``start_parts`` closes its
    own. A failed start (e.g. ``nats.errors.TimeoutError`` while the streams are provisioned)
    is tried again by kopf after ``retrying.retry_delay`` seconds (3, 6, 12, … up to 60)."""
    progress: kopf.ProgressStorage = kopf.AnnotationsProgressStorage(prefix="kopf.agentrun.dev")
    diffbase: kopf.DiffBaseStorage = MetadataDiffBaseStorage(
        prefix="kopf.agentrun.dev", key="last-handled-configuration"
    )
    if memo.ownership.shards > 1:  # other processes own some runs: hands off theirs
        progress = sharding.ShardProgressStorage(progress, memo.run_shards)
        diffbase = sharding.ShardDiffBaseStorage(diffbase, memo.run_shards)
    settings.persistence.progress_storage = progress
    settings.persistence.diffbase_storage = diffbase
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.watching.chunk_size = LIST_PAGE  # kopf's default: every object in one response
    settings.queueing.idle_timeout = WORKER_IDLE
    api = await Kube.connect()
    try:
        memo.parts = await wiring.start_parts(
            memo.settings,
            tenant_objects=await _list_tenants(api),
            api=api,
            ownership=memo.ownership,
        )
    except BaseException:
        await api.close()
        raise
    hand_over_signals(memo)


def hand_over_signals(memo: OperatorMemo) -> None:
    """Give SIGTERM and SIGINT to ``memo.on_stop_signal`` if set, then set
    ``memo.signals_handed_over``. kopf installs its own handlers as it starts, after the first
    step of the start-up handler: called at the end of that handler (which has waited on the
    API server and NATS), this replaces them. kopf's handler ignores a signal that comes
    while kopf is stopping, for example for a new share."""
    if memo.on_stop_signal is not None:
        process.stop_on_signals(memo.on_stop_signal)
    if memo.signals_handed_over is not None:
        memo.signals_handed_over.set()


async def _list_tenants(api: KubeApi, *, patience: float = 120.0) -> list[dict[str, Any]]:
    """Every AgentTenant; retries while the API server is starting (429 "storage is
    (re)initializing" right after the CRD is installed, 5xx), then gives up loudly."""
    deadline = time.monotonic() + patience
    while True:
        try:
            return await api.list_objects(kube.TENANTS)
        except ApiError as err:
            retriable = err.status == 429 or err.status >= 500
            if not retriable or time.monotonic() > deadline:
                raise
            log.info("listing AgentTenants: HTTP %s; retrying", err.status)
            await asyncio.sleep(1.0)


@kopf.on.cleanup()
async def stop(memo: OperatorMemo, **_: Any) -> None:
    """Stop consuming, flush status, close connections; bounded, even with NATS gone."""
    if memo.parts is not None:
        await wiring.stop_parts(memo.parts)
