"""kopf's configuration, start-up and clean-up.

kopf keeps a handler's progress in annotations (prefix ``kopf.agentrun.dev``) while it is
retried, never in ``.status``, which is ours alone (a projection of the run's events), and an
AgentRun's last handled essence in memory (``RunDiffBaseStorage``): a run kopf handles without
a retry is never written by kopf. The start-up handler
builds every part (``wiring``) and keeps them in kopf's memo (an ``OperatorMemo``). What does
not belong here: any handler of a resource (one module per kind, beside this one).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any, cast

import kopf

from agentrun import kube, process

from .. import wiring
from ..platform.kubeapi import LIST_PAGE, ApiError, Kube, KubeApi
from ..runs.handled import HandledActions, actions_of
from ..wiring import OperatorMemo
from . import sharding
from .retrying import retrying

log = logging.getLogger(__name__)

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


class RunDiffBaseStorage(kopf.DiffBaseStorage):
    """kopf's last-handled essence of an AgentRun, kept in this process's memory
    (``runs.handled.HandledActions``, whose rules say what is inferred for a run this process
    did not handle) instead of kopf's annotation on the object: one PATCH (one watch event
    more, and kopf's wait for it to come back) fewer per run admitted, and one per control
    annotation handled. The essence is the run's control annotations
    (``runs.handled.ACTIONS``): the only changes its changing handlers react to. Objects an
    earlier operator gave ``kopf.agentrun.dev/last-handled-configuration`` keep it, unread."""

    def __init__(self, handled: HandledActions) -> None:
        """``handled``: this process's memory of what it handled."""
        super().__init__()
        self.handled = handled

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        """The essence kopf compares: the run's control annotations. Raises ``ValueError`` if a
        handler asks kopf for ``extra_fields`` (a ``field=`` filter), which this essence would
        silently leave out."""
        if extra_fields:
            raise ValueError(f"AgentRun handlers compare control annotations only: {extra_fields}")
        return _essence(actions_of(body.get("metadata", {}).get("annotations") or {}))

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        """The last-handled essence of ``body`` (``HandledActions.last``)."""
        meta = body.get("metadata", {})
        last = self.handled.last(
            str(meta.get("uid") or ""),
            status=body.get("status") or {},
            annotations=meta.get("annotations") or {},
        )
        return None if last is None else _essence(last)

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        """Remember ``essence`` as handled for ``body``; nothing is written to ``patch``."""
        annotations = essence.get("metadata", {}).get("annotations") or {}
        self.handled.handled(
            str(body.get("metadata", {}).get("uid") or ""),
            status=body.get("status") or {},
            actions={str(k): str(v) for k, v in annotations.items()},
        )


def _essence(actions: Mapping[str, str]) -> kopf.BodyEssence:
    """The essence of a run carrying ``actions``, shaped as kopf's (no empty sections)."""
    essence: dict[str, Any] = {"metadata": {"annotations": dict(actions)}} if actions else {}
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
    memo.handled = HandledActions()  # what an earlier start handled may have changed since
    diffbase: kopf.DiffBaseStorage = RunDiffBaseStorage(memo.handled)
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
