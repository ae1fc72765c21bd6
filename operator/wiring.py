"""The operator's one wiring place: which part gets which collaborator, built once at start-up.

Read this module to see how control flows: every collaborator is passed to a constructor here
(no part assigns another's attributes), and each handler module is handed only the parts it
uses (``Handling``). Order of construction, and what each part is told:

- ``Kube`` (``platform.kubeapi``) is the one way to the API server; every part that reads or
  writes an object is given it.
- ``StatusWriter`` patches AgentRun ``.status``; the runs it finds gone are stopped as deleted
  runs are (``stop_deleted``: out of their queue, ended, settled, purged), and those whose
  status it cannot write for its size are ended by the dispatcher
  (``Dispatcher.end_refused_runs``).
- ``QueueBoard`` is the admission queues as the pump last saw them (lengths, why heads wait)
  and the kicks that ask for a pump; only the pump writes it.
- ``RunSettlement`` closes an ended run's ledger entry and kicks its tenant's queue; the
  dispatcher calls it for every run end (``RunEndListener``).
- ``EventRecorder`` posts Kubernetes Events (rate-limited); the dispatcher, the pump, the
  sweep, the controllers and the handlers record into it.
- ``RunSeals`` seals what the operator admits and approves (the run-signing key of
  ``AGENTRUN_RUN_SIGNING_FILE``) and judges what it reads (the trusted keys of
  ``AGENTRUN_RUN_TRUST_FILE``); the dispatcher is given it.
- ``Dispatcher`` consumes run events and publishes turns (through its ``TurnGate``: fair
  across tenants, each within its AgentTenant's ``maxConcurrentTurns``, read from
  ``Tenants``); it alone holds the live runs' views. Admission reaches it through
  ``runs.LiveRuns``.
- ``OrphanWatch`` dispatches again the turns of running runs whose TurnRequest was lost, from
  the dispatcher's snapshots (``pending_turns``), through the dispatcher.
- ``WaitingCheck`` reads the objects of runs waiting long for a person (``waiting_runs``):
  one whose deletion went unseen is found gone by the status writer and stopped as deleted.
- ``QueueStatus`` writes the status of runs that wait in a queue or end unadmitted, counting
  such ends through the dispatcher; the pump and the handlers use it.
- ``QueuePump`` admits queued runs through the dispatcher.
- ``LedgerSweep`` repairs ledger entries and has ``TenantStatusWriter`` write AgentTenant
  status.
- ``ToolServerRefresher`` discovers AgentToolServers' tools in the background and writes their
  status; admission (``RunConfigs``) reads that status through a ``ToolServerCache``.
- ``EvalController`` runs AgentEvals: creates their cases' runs, grades the ended ones from
  their status and committed events (``Bus``), writes the table, posts Events; one suite of
  each tenant at a time (the party of its ``FairWork``: ``Tenants.party``).
- ``Reaper`` deletes finished runs after ``spec.ttlSecondsAfterFinished``; at start the
  events and effect records of runs deleted while no operator ran are purged
  (``lifecycle.purge_orphans``).
- ``ScheduleController`` creates the AgentRuns of CronAgentRuns on their schedules, the
  schedules due reconciled in turn per tenant (``Tenants.party``).
- ``AdmissionGate`` lets a few admissions of each namespace run at once, so one namespace's
  creation burst does not delay another's admission.
- ``FairWork`` runs the checks of tenants' schemas (admission's, the Agents', the AgentEvals',
  the discovered tools') on threads of its own, in turn per tenant (``Tenants.party``).

Everything here runs in the leader only (``main`` starts kopf, whose start-up handler calls
``start_parts``, after taking the leader Lease).

What does not belong here: kopf's configuration and handlers (``handlers``), the process
bootstrap (``main``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from agentrun import buckets, metrics
from agentrun.bus import Bus, BusSettings
from agentrun.ledger import LedgerStore
from agentrun.protocol import RunEvent
from agentrun.settings import OperatorSettings
from agentrun.tools import Catalog, default_catalog
from agentrun.trust import Signer, Verifier, signing_file, trust_file

from .admission.fairgate import AdmissionGate
from .admission.lookup import RunConfigs
from .admission.pump import PumpDeps, QueuePump
from .admission.queue import QueueBoard
from .admission.queuestatus import QueueStatus
from .admission.settlement import RunSettlement
from .admission.storage import EventStorage
from .admission.sweep import LedgerSweep, SweepDeps
from .agents.models import ModelCache
from .evals.controller import EvalController
from .platform import events as recorder
from .platform.events import EventRecorder
from .platform.failures import Failures
from .platform.fairwork import FairWork
from .platform.kubeapi import KubeApi
from .platform.loops import Supervision, cancel_and_wait
from .platform.shards import ALL_OF_ONE, Ownership, RunShards
from .platform.storewatch import STORE, StoreWatch, exit_store_lost
from .runs import lifecycle
from .runs.dispatch import DispatchDeps, Dispatcher
from .runs.handled import HandledActions
from .runs.keys import RunKey
from .runs.orphans import OrphanWatch
from .runs.seals import RunSeals
from .runs.waiting import WaitingCheck
from .runs.writer import StatusWriter
from .schedules.controller import ScheduleController
from .schedules.store import KubeCronStore
from .tenants.rebuild import RebuiltUsage
from .tenants.registry import Tenants
from .tenants.writer import TenantStatusWriter
from .toolservers.refresher import DiscoverySlots, ToolServerRefresher
from .toolservers.store import ToolServerCache

log = logging.getLogger(__name__)

handlers_agents_logger = "agentrun.operator.handlers.agents"
"""Where the Agent handlers' failures are logged (the handlers' own logger)."""

SHUTDOWN_STEP_SECONDS = 5.0
"""Longest wait for each shutdown step (flushing status, closing connections)."""


@dataclasses.dataclass(frozen=True, slots=True)
class RunHandling:
    """What the AgentRun handlers (``handlers.runs``, ``handlers.admission``) use."""

    runs: Dispatcher
    """Recovers, ends, decides and forgets live runs."""
    pump: QueuePump
    """Queues a validated run; takes a cancelled or deleted one out of its queue."""
    shown: QueueStatus
    """Ends a run that can never be admitted."""
    tenants: Tenants
    """The run's tenant (and its default TTL for finished runs)."""
    configs: RunConfigs
    """Validates a run against its AgentModel, tools and tenant before it is queued."""
    api: KubeApi
    """Resolves ``spec.agentRef``; removes a decided review annotation."""
    events: EventRecorder
    writer: StatusWriter
    """Told each AgentRun's version as watched."""
    storage: EventStorage
    """Told each AgentRun's status as watched (the bytes its events take), and its deletion."""
    reaper: lifecycle.Reaper
    schedules: ScheduleController
    """Told when a run a CronAgentRun created ends or goes."""
    evals: EvalController
    """Told when a run an AgentEval created ends or goes."""
    gate: AdmissionGate
    """Bounds the admissions of one namespace worked on at once (fair across namespaces)."""
    ownership: Ownership = ALL_OF_ONE
    """The shards whose tenants this process admits runs of."""


@dataclasses.dataclass(frozen=True, slots=True)
class TenantHandling:
    """What the AgentTenant handler (``handlers.tenants``) uses."""

    tenants: Tenants
    board: QueueBoard
    """A changed tenant's queue is pumped."""


@dataclasses.dataclass(frozen=True, slots=True)
class AgentHandling:
    """What the Agent handlers (``handlers.agents``) use."""

    models: ModelCache
    known_tools: Mapping[str, bool]
    """The worker's built-in tools (name → pollable)."""
    api: KubeApi
    """Writes the Agent's ``Ready`` condition."""
    events: EventRecorder
    evals: EvalController
    """Told when an Agent changes (its suites start a new round)."""
    failures: Failures
    """Agents and AgentModels whose status write failed (each logged once)."""
    checks: FairWork
    """The threads an Agent's output schema is checked on."""


@dataclasses.dataclass(frozen=True, slots=True)
class Handling:
    """kopf's handler modules' share of the parts, one field per module."""

    runs: RunHandling
    tenants: TenantHandling
    agents: AgentHandling
    toolservers: ToolServerRefresher
    evals: EvalController
    schedules: ScheduleController


@dataclasses.dataclass(frozen=True, slots=True)
class Parts:
    """The operator's running parts, as wired by ``start_parts`` (for starting and stopping
    them; the handlers get ``handling``)."""

    bus: Bus
    api: KubeApi
    writer: StatusWriter
    tenants: Tenants
    configs: RunConfigs
    board: QueueBoard
    dispatcher: Dispatcher
    orphans: OrphanWatch
    waiting: WaitingCheck
    shown: QueueStatus
    pump: QueuePump
    sweep: LedgerSweep
    reaper: lifecycle.Reaper
    events: EventRecorder
    toolservers: ToolServerRefresher
    evals: EvalController
    schedules: ScheduleController
    gate: AdmissionGate
    checks: FairWork
    """The threads tenants' schemas are checked on, fair across tenants."""
    handling: Handling | None = None
    """Each handler module's share (``handling_of``), set before any handler runs."""
    watch: StoreWatch | None = None
    """Exits the process once the NATS store it started on is lost (``platform.storewatch``)."""
    supervision: Supervision = dataclasses.field(default_factory=Supervision)
    """Ends the process when a background loop (or the status writer) ends by an error."""
    tasks: tuple[asyncio.Task[None], ...] = ()
    """Background loops: with shard 0 (always with one shard), orphan purge, tool server
    discovery, AgentEval reconciles and CronAgentRun schedules; then the event consumers, turn
    gate, queue gauges, gone runs, refused runs, queue pumps, ledger sweep, TTL reaper,
    orphaned turns, waiting runs' objects, Kubernetes Events poster and store watch."""


@dataclasses.dataclass
class OperatorMemo:
    """kopf's memo (``kopf.operator(memo=...)``): the settings, read once by the process, and
    the parts, set by the start-up handler before any resource handler runs (kopf gives each
    resource a shallow copy of this object)."""

    settings: OperatorSettings
    parts: Parts | None = None
    ownership: Ownership = ALL_OF_ONE
    """The shards this process owns while these parts run (``platform.shards``)."""
    run_shards: RunShards = dataclasses.field(default_factory=lambda: RunShards(ALL_OF_ONE))
    """Which AgentRuns are this process's (kopf's storages and the run handlers ask)."""
    handled: HandledActions = dataclasses.field(default_factory=HandledActions)
    """The control annotations kopf last handled of each AgentRun (its diff base, in memory:
    ``handlers.startup.RunDiffBaseStorage``); a fresh one each start-up."""
    on_stop_signal: Callable[[], None] | None = None
    """What SIGTERM and SIGINT do once the start-up handler finished, instead of kopf's own
    stop, which a sharded process cannot tell from a stop for a new share, and which kopf
    drops once it is stopping (``main``). ``None``: kopf's own."""
    signals_handed_over: asyncio.Event | None = None
    """Set by the start-up handler once the signals go to ``on_stop_signal``: a sharded
    process changes its share only after that (``main``)."""

    def __post_init__(self) -> None:
        if self.run_shards.ownership != self.ownership:
            self.run_shards = RunShards(self.ownership)

    def running(self) -> Handling:
        """The handlers' parts; raises ``RuntimeError`` before start-up finished."""
        if self.parts is None or self.parts.handling is None:
            raise RuntimeError("the operator's start-up handler has not run")
        return self.parts.handling


def tool_catalog() -> tuple[Mapping[str, bool], Catalog]:
    """The worker's built-in tool catalog: (name → pollable, the catalog)."""
    catalog = default_catalog(kube=None)
    return {name: tool.spec.pollable for name, tool in catalog.items()}, catalog


async def start_parts(
    settings: OperatorSettings,
    *,
    tenant_objects: Iterable[Mapping[str, Any]],
    api: KubeApi,
    ownership: Ownership = ALL_OF_ONE,
) -> Parts:
    """Connect to NATS, build every part with its collaborators, start the background loops.

    ``tenant_objects``: the AgentTenants listed before any run is admitted (no false "no
    tenant"); ``ownership``: the shards whose tenants and runs the parts serve (the
    cluster-scoped loops run only with shard 0). Raises what ``Bus.connect`` /
    ``LedgerStore.open`` raise (the NATS connection closed again when the latter fails or is
    cancelled).
    """
    bus = await Bus.connect(
        BusSettings(
            url=settings.nats_url,
            auth=settings.nats_auth,
            ack_wait=settings.turn_ack_wait,
            events_max_bytes=settings.event_stream_max_bytes,
            replicas=settings.nats_replicas,
        ),
        name=f"agentrun-operator-{os.getpid()}",
    )
    try:  # the operator creates the buckets; workers only bind them
        replicas = settings.nats_replicas
        await buckets.open_bucket(bus.js, buckets.effects_config(replicas=replicas), create=True)
        store = await LedgerStore.open(bus.js, replicas=replicas, layout=settings.ledger_layout)
        parts = _make_parts(settings, bus=bus, store=store, api=api, ownership=ownership)
    except BaseException:  # failed, or stopped part-way: no connection left behind
        await bus.close()
        raise
    for obj in tenant_objects:
        parts.tenants.put(obj)
    watch = StoreWatch(lambda: bus.streams_created(STORE), STORE, on_lost=exit_store_lost)
    parts = dataclasses.replace(parts, handling=handling_of(parts), watch=watch)
    return dataclasses.replace(parts, tasks=_start_loops(parts, cluster=ownership.cluster_work))


def _events(
    settings: OperatorSettings, *, api: KubeApi, share_of: Callable[[str], str]
) -> EventRecorder:
    """The Event recorder: a namespace's Events take its tenant's share (``share_of``) of the
    standard throttle; an AgentTenant's Events go to the operator's own namespace
    (``AGENTRUN_LEASE_NAMESPACE``: they carry one tenant's use and limits)."""
    return EventRecorder(
        api,
        throttle=recorder.standard_throttle(),
        share_of=share_of,
        private_namespace=settings.lease_namespace,
    )


def _seals(
    settings: OperatorSettings, *, bus: Bus, api: KubeApi, events: EventRecorder
) -> RunSeals:
    """The operator's seals: its run-signing keys (``AGENTRUN_RUN_SIGNING_FILE``) and the keys
    it trusts (``AGENTRUN_RUN_TRUST_FILE``). Raises ``ValueError`` when either is unset,
    ``OSError`` and ``trust.KeyFileError`` when either cannot be read."""
    return RunSeals(
        Signer(signing_file(settings.signing_path())),
        Verifier(trust_file(settings.trust_path())),
        streams=bus,
        api=api,
        events=events,
    )


def _make_parts(
    settings: OperatorSettings, *, bus: Bus, store: LedgerStore, api: KubeApi, ownership: Ownership
) -> Parts:
    """Every part, each given its collaborators; nothing started yet."""
    tenants = _tenants(settings, api)
    writer = StatusWriter(api, interval=settings.status_interval, party=tenants.party)
    store.rebuild = RebuiltUsage(api, tenants)  # a book made anew: its window's use rebuilt
    configs = _run_configs(api, checks := FairWork(party=tenants.party))
    board = QueueBoard()
    settlement = RunSettlement(store, board)
    events = _events(settings, api=api, share_of=tenants.party)
    seals = _seals(settings, bus=bus, api=api, events=events)
    fair = DispatchDeps(settlement, board, events, seals, tenants, settings.turn_backlog, ownership)
    dispatcher = Dispatcher(bus, writer, fair)
    shown = QueueStatus.of(writer, dispatcher, events, rate=settings.queue_status_writes)
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
        storage=EventStorage(limit=settings.tenant_event_max_bytes),
    )
    tenant_status = TenantStatusWriter(api, events=events)
    sweep = SweepDeps(store, tenants, board, dispatcher, bus, api, tenant_status)
    return Parts(
        bus=bus,
        api=api,
        writer=writer,
        tenants=tenants,
        configs=configs,
        board=board,
        dispatcher=dispatcher,
        orphans=OrphanWatch(bus, dispatcher, after=settings.orphan_after),
        waiting=WaitingCheck(dispatcher, writer),
        shown=shown,
        pump=QueuePump(pump, max_queued=settings.max_queued_runs, ownership=ownership),
        sweep=LedgerSweep(sweep, interval=settings.ledger_sweep, ownership=ownership),
        reaper=lifecycle.Reaper(api),
        events=events,
        toolservers=_tool_servers(settings, api, tenants, checks),
        evals=EvalController(api, runs=bus, events=events, checks=checks),
        schedules=ScheduleController(KubeCronStore(api), events=events, share_of=tenants.party),
        gate=AdmissionGate(settings.admission_per_namespace),
        checks=checks,
    )


def _tenants(settings: OperatorSettings, api: KubeApi) -> Tenants:
    """The AgentTenants' registry, with the platform's defaults."""
    return Tenants(
        api,
        default=settings.default_tenant,
        default_turns=settings.default_max_concurrent_turns,
    )


def _tool_servers(
    settings: OperatorSettings, api: KubeApi, tenants: Tenants, checks: FairWork
) -> ToolServerRefresher:
    """Discovery of the AgentToolServers' tools, within each tenant's allowed URLs, each
    tenant's servers within its share of the discovery slots."""
    return ToolServerRefresher(
        api,
        reach=tenants.tool_server_rules,
        slots=DiscoverySlots.standard(),
        max_timeout=settings.tool_discovery_timeout_max,
        checks=checks,
    )


def handling_of(parts: Parts) -> Handling:
    """Each handler module's share of ``parts``."""
    return Handling(
        runs=RunHandling(
            runs=parts.dispatcher,
            pump=parts.pump,
            shown=parts.shown,
            tenants=parts.tenants,
            configs=parts.configs,
            api=parts.api,
            events=parts.events,
            writer=parts.writer,
            storage=parts.pump.deps.storage,
            reaper=parts.reaper,
            schedules=parts.schedules,
            evals=parts.evals,
            gate=parts.gate,
            ownership=parts.dispatcher.ownership,
        ),
        tenants=TenantHandling(tenants=parts.tenants, board=parts.board),
        agents=AgentHandling(
            models=parts.configs.models,
            known_tools=parts.configs.known_tools,
            api=parts.api,
            events=parts.events,
            evals=parts.evals,
            failures=Failures(logging.getLogger(handlers_agents_logger), what="status write"),
            checks=parts.checks,
        ),
        toolservers=parts.toolservers,
        evals=parts.evals,
        schedules=parts.schedules,
    )


def _run_configs(api: KubeApi, checks: FairWork) -> RunConfigs:
    """Admission's ``RunConfigs``: AgentModels, the built-in tools and AgentToolServers; its
    output schemas checked on ``checks``."""
    known_tools, catalog = tool_catalog()
    return RunConfigs(
        ModelCache(api),
        known_tools=known_tools,
        tool_specs=lambda names: catalog.specs(names) if names else [],
        servers=ToolServerCache(api),
        checks=checks,
    )


async def stop_deleted(parts: RunHandling, key: RunKey) -> None:
    """AgentRun ``key`` was deleted before it ended (its object is gone): take it out of its
    queue, or stop it (its end ``cancelled`` recorded in its events, counted and told), settle
    its ledger entry (hold and slot freed) and purge its events (``Dispatcher.forget``). Each
    step is bounded and best effort: what a dead NATS leaves behind is found later — a queued
    run that no longer exists is dropped by the pump, an active ledger entry with no object by
    the ledger sweep, a subject with no object by the next leader's purge."""
    try:
        async with asyncio.timeout(10):
            await parts.pump.forget_queued(key.uid)
    except Exception as err:  # NATS down: the pump drops queued runs that no longer exist
        log.warning("could not take %s/%s out of its queue: %r", key.namespace, key.name, err)
    await parts.runs.forget(key.namespace, key.name, key.uid)


async def _stop_gone_runs(parts: RunHandling) -> None:
    """Forever: stop each run whose object the status writer found gone (its deletion's watch
    event missed, or a write of a queued run's position after it), as a deleted run is."""
    while True:
        run = await parts.writer.next_gone()
        try:
            await stop_deleted(parts, run)
        except Exception:  # one failed clean-up must not stop the next ones
            log.exception("could not stop gone run %s/%s", run.namespace, run.name)


async def _purge_orphans(bus: Bus, api: KubeApi, seals: RunSeals) -> None:
    def sealed(event: RunEvent, key: RunKey) -> bool:
        return seals.fault(event, key=key) is None

    try:
        await lifecycle.purge_orphans(
            bus, list_runs=lambda: lifecycle.list_run_names(api), sealed=sealed
        )
    except Exception as err:  # the next leader tries again; nothing depends on it
        log.warning("purging the events of deleted runs failed: %r", err)


def _start_loops(parts: Parts, *, cluster: bool = True) -> tuple[asyncio.Task[None], ...]:
    """Start the status writer and every background loop of ``parts`` (the order of
    ``Parts.tasks``; the cluster-scoped ones, orphan purge, tool server discovery, AgentEvals
    and schedules, only if ``cluster``: this process holds shard 0), each watched by
    ``parts.supervision``; returns the loops (not the writer, which ``stop_parts`` flushes
    after stopping them)."""
    assert parts.watch is not None and parts.handling is not None
    parts.supervision.watch(parts.writer.start())
    return parts.supervision.watch(
        *(_start_cluster_loops(parts) if cluster else ()),
        asyncio.create_task(parts.dispatcher.run(), name="event-consumer"),
        asyncio.create_task(parts.dispatcher.gate.run(), name="turn-gate"),
        asyncio.create_task(parts.dispatcher.watch_queue(), name="queue-gauges"),
        asyncio.create_task(_stop_gone_runs(parts.handling.runs), name="gone-runs"),
        asyncio.create_task(parts.dispatcher.end_refused_runs(), name="refused-runs"),
        asyncio.create_task(parts.pump.run(), name="queue-pumps"),
        asyncio.create_task(parts.sweep.run(), name="ledger-sweep"),
        asyncio.create_task(parts.reaper.run(), name="ttl-reaper"),
        asyncio.create_task(parts.orphans.run(), name="orphan-turns"),
        asyncio.create_task(parts.waiting.run(), name="waiting-runs"),
        asyncio.create_task(parts.events.run(), name="k8s-events"),
        asyncio.create_task(parts.watch.run(), name="store-watch"),
    )


def _start_cluster_loops(parts: Parts) -> tuple[asyncio.Task[None], ...]:
    """The loops of cluster-scoped and cross-tenant work (shard 0's holder runs them)."""
    return (
        asyncio.create_task(
            _purge_orphans(parts.bus, parts.api, parts.dispatcher.seals), name="orphan-purge"
        ),
        asyncio.create_task(parts.toolservers.run(), name="tool-servers"),
        asyncio.create_task(parts.evals.run(), name="agent-evals"),
        asyncio.create_task(parts.schedules.run(), name="schedules"),
    )


async def stop_parts(parts: Parts) -> None:
    """Stop consuming, flush status, close connections; bounded, even with NATS gone."""
    parts.supervision.stop()
    parts.dispatcher.stop()
    parts.orphans.stop()
    parts.waiting.stop()
    parts.pump.stop()
    parts.sweep.stop()
    parts.reaper.stop()
    parts.toolservers.stop()
    parts.evals.stop()
    parts.schedules.stop()
    if parts.watch is not None:
        parts.watch.stop()
    await cancel_and_wait([*parts.tasks, *parts.pump.running()], timeout=SHUTDOWN_STEP_SECONDS)
    await parts.dispatcher.cancel_timers()
    parts.checks.close()
    metrics.forget_tenant_budgets()  # the next parts (other shards, perhaps) set their own
    for closing in (parts.writer.flush_and_stop(), parts.bus.close(), parts.api.close()):
        try:
            async with asyncio.timeout(SHUTDOWN_STEP_SECONDS):
                await closing
        except Exception as err:  # shutting down: log and go on
            log.warning("shutdown step failed: %r", err)
