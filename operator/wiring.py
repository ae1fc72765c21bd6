"""The operator's one wiring place: which part gets which collaborator, built once at start-up.

Read this module to see how control flows: every collaborator is passed to a constructor here
(no part assigns another's attributes). Order of construction, and what each part is told:

- ``StatusWriter`` patches AgentRun ``.status``; the runs it finds gone are pulled by the
  dispatcher (``Dispatcher.forget_gone_runs``).
- ``QueueBoard`` is the shared view of the admission queues (lengths, why heads wait, kicks).
- ``RunSettlement`` closes an ended run's ledger entry and kicks its tenant's queue; the
  dispatcher calls it for every run end (``RunEndListener``).
- ``EventRecorder`` posts Kubernetes Events (rate-limited); the dispatcher, the pump, the
  sweep and the handlers record into it.
- ``Dispatcher`` consumes run events and publishes turns.
- ``OrphanWatch`` dispatches again the turns of running runs whose TurnRequest was lost; it
  reads the dispatcher's live views and ends runs through it (``LiveRuns``).
- ``QueueStatus`` writes the status of runs that wait in a queue or end unadmitted, counting
  such ends through the dispatcher; the pump and the handlers use it.
- ``QueuePump`` admits queued runs through the dispatcher (``RunStarter``).
- ``LedgerSweep`` repairs ledger entries and writes AgentTenant status.
- ``ToolServerRefresher`` discovers AgentToolServers' tools in the background and writes their
  status; admission (``RunConfigs``) reads that status through a ``ToolServerCache``.
- ``EvalController`` runs AgentEvals: creates their cases' runs, grades the ended ones from
  their status and committed events (``Bus``), writes the table, posts Events.
- ``Reaper`` deletes finished runs after ``spec.ttlSecondsAfterFinished``; at start the
  events of runs deleted while no operator ran are purged (``lifecycle.purge_orphans``).
- ``ScheduleController`` creates the AgentRuns of CronAgentRuns on their schedules.

Everything here runs in the leader only (``main`` starts kopf, whose start-up handler calls
``start_parts``, after taking the leader Lease).

What does not belong here: kopf's configuration and handlers (``handlers``, ``runhandlers``,
``watches``), the process bootstrap (``main``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

from kubernetes_asyncio import client

from agentrun import buckets
from agentrun.bus import Bus, BusSettings
from agentrun.ledger import LedgerStore
from agentrun.settings import OperatorSettings
from agentrun.tools import Catalog, default_catalog

from . import lifecycle, recorder
from .cronstore import KubeCronStore
from .dispatch import Dispatcher
from .evals import EvalController
from .orphans import OrphanWatch
from .pump import PumpDeps, QueuePump
from .queuestatus import QueueStatus
from .recorder import EventRecorder
from .schedules import ScheduleController
from .settlement import QueueBoard, RunSettlement
from .statuswriter import KubeStatusStore, StatusWriter
from .sweep import LedgerSweep, SweepDeps
from .tenants import ModelCache, RunConfigs, Tenants
from .toolrefresh import ToolServerRefresher
from .toolservers import ToolServerCache

log = logging.getLogger(__name__)

SHUTDOWN_STEP_SECONDS = 5.0
"""Longest wait for each shutdown step (flushing status, closing connections)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Parts:
    """The operator's running parts, as wired by ``start_parts``."""

    bus: Bus
    api: client.ApiClient
    writer: StatusWriter
    dispatcher: Dispatcher
    orphans: OrphanWatch
    tenants: Tenants
    configs: RunConfigs
    board: QueueBoard
    pump: QueuePump
    shown: QueueStatus
    sweep: LedgerSweep
    reaper: lifecycle.Reaper
    events: EventRecorder
    toolservers: ToolServerRefresher
    evals: EvalController
    schedules: ScheduleController
    tasks: tuple[asyncio.Task[None], ...] = ()
    """Background loops: event consumer, queue gauges, gone runs, queue pumps, ledger sweep,
    TTL reaper, orphan purge, orphaned turns, Kubernetes Events poster, tool server discovery,
    AgentEval reconciles, CronAgentRun schedules."""


@dataclasses.dataclass
class OperatorMemo:
    """kopf's memo (``kopf.operator(memo=...)``): the settings, read once by the process, and
    the parts, set by the start-up handler before any resource handler runs (kopf gives each
    resource a shallow copy of this object)."""

    settings: OperatorSettings
    parts: Parts | None = None

    def running(self) -> Parts:
        """The parts; raises ``RuntimeError`` before start-up finished."""
        if self.parts is None:
            raise RuntimeError("the operator's start-up handler has not run")
        return self.parts


def tool_catalog() -> tuple[Mapping[str, bool], Catalog]:
    """The worker's built-in tool catalog: (name → pollable, the catalog)."""
    catalog = default_catalog(kube=None)
    return {name: tool.spec.pollable for name, tool in catalog.items()}, catalog


async def start_parts(
    settings: OperatorSettings,
    *,
    tenant_objects: Iterable[Mapping[str, Any]],
    api: client.ApiClient,
) -> Parts:
    """Connect to NATS, build every part with its collaborators, start the background loops.

    ``tenant_objects``: the AgentTenants listed before any run is admitted (no false "no
    tenant"). Raises what ``Bus.connect`` / ``LedgerStore.open`` raise.
    """
    bus = await Bus.connect(
        BusSettings(
            url=settings.nats_url, auth=settings.nats_auth, ack_wait=settings.turn_ack_wait
        ),
        name=f"agentrun-operator-{os.getpid()}",
    )
    # the operator creates the buckets; workers only bind them
    await buckets.open_bucket(bus.js, buckets.effects_config(), create=True)
    parts = _build_parts(settings, bus=bus, store=await LedgerStore.open(bus.js), api=api)
    for obj in tenant_objects:
        parts.tenants.put(obj)
    parts.writer.start()
    return dataclasses.replace(parts, tasks=_start_loops(parts))


def _build_parts(
    settings: OperatorSettings, *, bus: Bus, store: LedgerStore, api: client.ApiClient
) -> Parts:
    """Every part, each given its collaborators; nothing started yet."""
    writer = StatusWriter(KubeStatusStore(api), interval=settings.status_interval)
    tenants = Tenants(api, default=settings.default_tenant)
    configs = _run_configs(api)
    board = QueueBoard()
    settlement = RunSettlement(store, board)
    events = EventRecorder(api, throttle=recorder.standard_throttle())
    dispatcher = Dispatcher(bus, writer, ends=settlement, queues=board, events=events)
    shown = QueueStatus(writer, dispatcher, events, time.time)
    pump = PumpDeps(
        store=store,
        tenants=tenants,
        configs=configs,
        runs=dispatcher,
        shown=shown,
        settlement=settlement,
        board=board,
        api=api,
        events=events,
        max_queued=settings.max_queued_runs,
        position_writes=settings.queue_status_writes,
    )
    sweep = SweepDeps(
        store=store,
        tenants=tenants,
        board=board,
        runs=dispatcher,
        events=bus,
        api=api,
        recorder=events,
    )
    return Parts(
        bus=bus,
        api=api,
        writer=writer,
        dispatcher=dispatcher,
        orphans=OrphanWatch(bus, dispatcher, after=settings.orphan_after),
        tenants=tenants,
        configs=configs,
        board=board,
        pump=QueuePump(pump),
        shown=shown,
        sweep=LedgerSweep(sweep, interval=settings.ledger_sweep),
        reaper=lifecycle.Reaper(lifecycle.KubeRunDeleter(api)),
        events=events,
        toolservers=ToolServerRefresher(api),
        evals=EvalController(api, runs=bus, events=events),
        schedules=ScheduleController(KubeCronStore(api), events=events),
    )


def _run_configs(api: client.ApiClient) -> RunConfigs:
    """Admission's ``RunConfigs``: AgentModels, the built-in tools and AgentToolServers."""
    known_tools, catalog = tool_catalog()
    return RunConfigs(
        ModelCache(api),
        known_tools=known_tools,
        tool_specs=lambda names: catalog.specs(names) if names else [],
        servers=ToolServerCache(api),
    )


async def _purge_orphans(bus: Bus, api: client.ApiClient) -> None:
    try:
        await lifecycle.purge_orphans(bus, list_runs=lambda: lifecycle.list_run_names(api))
    except Exception as err:  # the next leader tries again; nothing depends on it
        log.warning("purging the events of deleted runs failed: %r", err)


def _start_loops(parts: Parts) -> tuple[asyncio.Task[None], ...]:
    """Start every background loop of ``parts`` (the order of ``Parts.tasks``)."""
    return (
        asyncio.create_task(parts.dispatcher.run(), name="event-consumer"),
        asyncio.create_task(parts.dispatcher.watch_queue(), name="queue-gauges"),
        asyncio.create_task(parts.dispatcher.forget_gone_runs(), name="gone-runs"),
        asyncio.create_task(parts.pump.run(), name="queue-pumps"),
        asyncio.create_task(parts.sweep.run(), name="ledger-sweep"),
        asyncio.create_task(parts.reaper.run(), name="ttl-reaper"),
        asyncio.create_task(_purge_orphans(parts.bus, parts.api), name="orphan-purge"),
        asyncio.create_task(parts.orphans.run(), name="orphan-turns"),
        asyncio.create_task(parts.events.run(), name="k8s-events"),
        asyncio.create_task(parts.toolservers.run(), name="tool-servers"),
        asyncio.create_task(parts.evals.run(), name="agent-evals"),
        asyncio.create_task(parts.schedules.run(), name="schedules"),
    )


async def stop_parts(parts: Parts) -> None:
    """Stop consuming, flush status, close connections; bounded, even with NATS gone."""
    parts.dispatcher.stop()
    parts.orphans.stop()
    parts.pump.stop()
    parts.sweep.stop()
    parts.reaper.stop()
    parts.toolservers.stop()
    parts.evals.stop()
    parts.schedules.stop()
    for task in parts.tasks:
        task.cancel()
    await parts.dispatcher.cancel_timers()
    for closing in (parts.writer.flush_and_stop(), parts.bus.close(), parts.api.close()):
        try:
            async with asyncio.timeout(SHUTDOWN_STEP_SECONDS):
                await closing
        except Exception as err:  # shutting down: log and go on
            log.warning("shutdown step failed: %r", err)
