"""The admission queue pump: per-tenant FIFO queues of validated runs, admitted from the head.

A new AgentRun, validated against its AgentModel and its tenant's policy, joins its tenant's
queue (one value per run, ``queue.<tenant>.<uid>`` in the ledger bucket, ordered in this
process's memory: ``ledger.TenantQueue``), unless the queue holds ``AGENTRUN_MAX_QUEUED_RUNS``
runs already (then it ends ``tenant_budget_exhausted``, saying so). A pump per tenant admits
from the head while the tenant has a free ``maxConcurrentRuns`` slot and budget left for the
run's first model call (``Book.admit``: up to ``ADMIT_BATCH`` heads in one ledger write, the
longest prefix that fits), appending each admitted run's ``admitted`` event; it stops at the
first run that does not fit, so admission is FIFO (a run waiting for its
AgentToolServer's discovery is passed over). Runs left waiting show ``Queued`` with the reason
and their position (``queuestatus``: at once for a run just queued, later refreshes within a
rate). A run that cannot be admitted at all never holds up the runs behind it: one whose config
is over the event stream's message cap ends ``invalid_spec`` naming its largest field at once;
one whose admission fails otherwise than transiently (``platform.failures``) ends
``checkpoint_failed`` on its second failure, its slot and hold released, logged once. A
transient failure (NATS, the API server) is retried at the next pass, the queue shown
``Queued`` (``AdmissionRetrying``) meanwhile. Every step is idempotent (the ledger slot by run
uid, the admitted event by compare-and-set on an empty subject, the queue by uid), so an
operator that dies mid-admission neither admits a run twice nor forgets one: the queue and the
ledger are in JetStream.

What does not belong here: the periodic ledger repairs and AgentTenant status (``sweep``),
settling a run that ended (``settlement``), the status and Events of runs that wait or end
unadmitted (``queuestatus``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
import typing
from collections.abc import Callable, Iterator
from decimal import Decimal

import nats.errors

from agentrun import kernel, loops, metrics, telemetry
from agentrun.bus import EventTooLarge
from agentrun.kernel import schemas
from agentrun.ledger import LedgerStore, QueuedRun, QueueFull, TenantQueue
from agentrun.protocol import RunConfig

from .. import runs
from ..platform.events import EventRecorder, EventType
from ..platform.failures import Failures
from ..platform.kubeapi import KubeApi
from ..platform.shards import ALL_OF_ONE, Ownership
from ..platform.spec import ReferenceMissing, SpecError
from ..platform.weighed import WeighedCache
from ..runs import CANCEL_ANNOTATION, LiveRuns, RunKey, RunObject, admitted_patch, involved
from ..tenants import NoTenant, QueueWait, TenantPolicy, Tenants, WaitReason, WhenExhausted
from . import rebinding
from .config import never_fits, too_large_to_checkpoint
from .lookup import RunConfigs, ToolServerPending
from .queue import QueueBoard
from .queuestatus import QueueStatus, Waiting
from .settlement import RunSettlement
from .storage import EventStorage

log = logging.getLogger(__name__)

GIVE_UP_MESSAGE = "twice, not for a passing reason"
"""How a run's end says its admission failed permanently (``platform.failures``)."""


def _not_in(queue: TenantQueue, passed: set[str]) -> Iterator[QueuedRun]:
    """The queue's runs, head first, but those in ``passed``."""
    return (run for run in queue if run.uid not in passed)


async def fetch_pending_run(api: KubeApi, key: RunKey) -> RunObject | None:
    """The AgentRun object ``key`` if it still exists with that uid and has not ended, else
    ``None``; raises ``ApiError`` on other API errors, ``SpecError`` on an object that is not
    an AgentRun."""
    obj = await api.get(key.ref)
    if obj is None:
        return None
    run = RunObject.of(obj)
    if run.metadata.uid != key.uid or run.status.terminal_reason:
        return None
    return run


@dataclasses.dataclass(frozen=True, slots=True)
class PumpDeps:
    """The pump's collaborators."""

    store: LedgerStore
    tenants: Tenants
    configs: RunConfigs
    runs: LiveRuns
    """Starts admitted runs (``start_run``)."""
    shown: QueueStatus
    """Writes the status of the runs that wait or end unadmitted."""
    settlement: RunSettlement
    board: QueueBoard
    api: KubeApi
    """Reads queued AgentRuns the handler did not hand over (after a restart)."""
    events: EventRecorder
    """Records admissions, queue waits and unadmitted ends as Kubernetes Events."""
    storage: EventStorage
    """The event-stream bytes each tenant's runs take, checked before a run is admitted."""
    clock: Callable[[], float] = time.time
    """Epoch seconds."""


ADMIT_BATCH = 32
"""Queue heads a pump pass prepares at once: the ledger admits the longest prefix of them that
fits in one write (``LedgerStore.admit_runs``), and those start together."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Head:
    """The run at the head of a queue, with what its object says."""

    key: RunKey
    obj: RunObject
    created: float
    """When the run joined the queue (epoch seconds): the AgentRun's creation, or its rerun's
    start in a later life (``recovery.queued_since``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Ready:
    """A queue head ready to be admitted: its frozen config and its first call's worst case."""

    queued: QueuedRun
    head: _Head
    config: RunConfig
    """Its deadline counted from ``built_at``; moved to its admission's time at its start."""
    need: tuple[int, Decimal]
    built_at: float
    """The clock (epoch seconds) its config was built at."""


RECORDS_AT_ONCE = 8
"""Admission records (``agentrun.dev/admitted-uid``, one PATCH of the object each) written at
once. They are written beside the pump's passes, not in them: a pass that waited for its
batch's records spent most of its time in those round trips while the API server was busy with
the burst that queued them (0.2–0.8 s a batch of 32, against 0.05 s for the rest of it), and
admitted nothing meanwhile. A few at a time leave the client's connections to the status
writes and the handlers."""
RECORDS_PENDING = 1024
"""Admission records waiting to be written (``record_later``) at most before a pass admits
more: with the API server slow or away, admissions would otherwise go on while their records
pile up, a task each; past it the pass waits for one to be written (or given up after the
client's timeout). Admitting a batch may take it past by up to ``ADMIT_BATCH`` - 1."""


OBJECTS_MEMORY = 64 * 2**20
"""Bytes of queued runs' objects the pump keeps, about (each weighed by ``schemas.footprint``
of its spec and recorded resolved spec; the least recently used forgotten first): whatever the
specs, queued runs cost the operator bounded memory; one forgotten is read from the API server
when its queue reaches it."""


def _weight(obj: RunObject) -> int:
    return schemas.footprint(obj.spec) + schemas.footprint(obj.status.resolved_spec)


class QueuePump:
    """Owns the tenant queues and a pump task per tenant. One per operator process."""

    def __init__(
        self, deps: PumpDeps, *, max_queued: int = 0, ownership: Ownership = ALL_OF_ONE
    ) -> None:
        """Wired once at start-up (see ``wiring``); ``max_queued``: runs one tenant's queue may
        hold (``AGENTRUN_MAX_QUEUED_RUNS``; 0: no limit); ``ownership``: only the queues of
        the tenants of its shards are pumped."""
        self.deps = deps
        self.ownership = ownership
        self.max_queued = max_queued
        self.store = deps.store
        self.board = deps.board
        self.clock = deps.clock
        self.shown = deps.shown
        self._waiting: dict[str, Waiting] = {}
        """Runs this operator has seen queued (uid → what their status shows)."""
        self._fresh: dict[str, dict[str, QueuedRun]] = {}
        """Per tenant, the runs queued since its last pump (their first status is due)."""
        self._checked: dict[str, rebinding.Checked] = {}
        """Per tenant, when its queued runs' namespaces were last looked at (``_rebind``)."""
        self._gone: dict[str, float] = {}
        """Deleted tenants with queued runs: when a look at their queue first found them gone
        (``_gone_since``)."""
        self._objects: WeighedCache[str, RunObject] = WeighedCache(OBJECTS_MEMORY, _weight)
        """Queued runs' objects as their handler saw them, ``OBJECTS_MEMORY`` at most (one
        forgotten is read again when its queue reaches it)."""
        self._locks: dict[str, asyncio.Lock] = {}
        self._wakes: dict[str, asyncio.Event] = {}
        self._pumps: dict[str, asyncio.Task[None]] = {}
        self._records: dict[str, asyncio.Task[None]] = {}
        """Admission records being written, by run uid (``record_later``)."""
        self._record_slots = asyncio.Semaphore(RECORDS_AT_ONCE)
        self._stopping = asyncio.Event()
        self.failures = Failures(log, what="admission")
        """Failed admissions of queue heads by uid (each logged once)."""

    # --- queueing -------------------------------------------------------------------------------

    async def enqueue_run(
        self,
        run: RunKey,
        policy: TenantPolicy,
        *,
        generation: int,
        created: float,
        obj: RunObject | None = None,
    ) -> None:
        """Queue a validated run in its tenant's queue by when it joined (idempotent), pump.

        ``created`` is when it joined the queue (epoch seconds): the AgentRun's
        creationTimestamp, or its rerun's start (``recovery.queued_since``); ``obj`` the object
        as the handler saw it (spec and metadata), so the pump need not read it again (its
        spec is immutable; a cancel or delete reaches the queue through their handlers).
        """
        if obj is not None:
            self._objects[run.uid] = obj
        self._waiting.setdefault(run.uid, Waiting(generation))
        queued = QueuedRun(run.uid, run.namespace, run.name, created)
        try:
            await self.store.enqueue(policy.name, queued, limit=self.max_queued or None)
        except QueueFull as err:  # a limit: this run only, with what it says
            self._waiting.pop(run.uid, None)
            self._objects.pop(run.uid, None)
            self.deps.configs.forget(run.uid)
            phase, message = _queue_full(err)
            self.shown.end_unadmitted(
                run,
                phase,
                message,
                tenant=policy.name,
                generation=generation,
            )
            return
        self._fresh.setdefault(policy.name, {})[run.uid] = queued
        if policy.name not in self.deps.tenants.policies:  # gone since its run was resolved
            self._checked.pop(policy.name, None)  # its next pass moves the run (``_rebind``)
        self.board.kick(policy.name)

    async def cancel_queued(self, key: RunKey, tenant: str | None = None) -> bool:
        """End a run that is still queued ``cancelled``; False if it is not queued.

        A pass of the tenant's pump admits the heads it prepared (their objects read before
        this cancel, maybe) without reading the queue again, so this waits for a pass under way
        (the tenant's pump lock): a run that pass admitted is not queued any more (False), and
        the caller ends it through its events; taken out of the queue meanwhile, it would run
        behind a status saying it was cancelled. ``tenant`` (the run's ``status.tenant``) is
        looked in first, then every other queue: a run moved to another tenant's queue since
        (``_rebind``) may show the old one still."""
        for name in dict.fromkeys([*([tenant] if tenant else []), *self._tenants_with_queues()]):
            if not await self._take_out(name, key.uid):
                continue
            self._objects.pop(key.uid, None)
            self.deps.configs.forget(key.uid)
            seen = self._waiting.pop(key.uid, None)
            self.shown.end_unadmitted(
                key,
                kernel.Phase.CANCELLED,
                f"cancelled by the {CANCEL_ANNOTATION} annotation while queued",
                tenant=name,
                generation=seen.generation if seen else 1,
            )
            self.board.kick(name)
            return True
        return False

    async def forget_queued(self, uid: str) -> None:
        """A deleted run leaves whatever queue holds it.

        As a cancel does (``cancel_queued``), this waits for a pass of the run's tenant's pump
        under way, which may be admitting it (its object read before the deletion): a run
        that pass admitted is not queued any more, and has its ``admitted`` event when this
        returns, so the caller's stop of the deleted run (``LiveRuns.forget``: ended through
        its events, its ledger slot and hold freed, its events purged) finds it. Taken out of
        the queue meanwhile, it was admitted after that stop found nothing to end, and ran
        with no object. Raises what the ledger store raises."""
        self._objects.pop(uid, None)  # a pass yet to reach it reads its object: gone
        try:
            for name in self._tenants_with_queues():
                if await self._take_out(name, uid):
                    self.board.kick(name)
                    return
        finally:
            self._waiting.pop(uid, None)
            self.deps.configs.forget(uid)

    async def _take_out(self, tenant: str, uid: str) -> bool:
        """Take run ``uid`` out of ``tenant``'s queue (a cancel, a deletion), once no pass
        over that queue is under way (``_pass_lock``): a pass admits the heads it prepared
        without reading the queue again. False if the run is not in that queue, or the pass
        it waited for admitted or dropped it. Raises what the ledger store raises."""
        if uid not in await self.store.queued(tenant):
            return False  # no pass is admitting it: a pass admits only runs still queued
        async with self._pass_lock(tenant):
            return await self.store.dequeue(tenant, uid)

    def _pass_lock(self, tenant: str) -> asyncio.Lock:
        """Held by each pass over ``tenant``'s queue, and by a cancel or a deletion taking a
        run out of it (``_take_out``)."""
        return self._locks.setdefault(tenant, asyncio.Lock())

    def _tenants_with_queues(self) -> list[str]:
        return sorted(set(self.deps.tenants.policies) | self.board.tenants())

    # --- the pump tasks -------------------------------------------------------------------------

    async def run(self) -> None:
        """Start (or wake) a tenant's pump for every kick, until stopped."""
        while not self._stopping.is_set():
            for tenant in await self.board.take_kicks():
                self._wake_pump(tenant)

    def stop(self) -> None:
        """Stop the pumps (cancelled; ``running`` lists them for the caller to wait on)."""
        self._stopping.set()
        for task in self._pumps.values():
            task.cancel()

    def running(self) -> list[asyncio.Task[None]]:
        """The per-tenant pump tasks and the admission records not ended yet."""
        return [t for t in [*self._pumps.values(), *self._records.values()] if not t.done()]

    def _wake_pump(self, tenant: str) -> None:
        if not self.ownership.owns_tenant(tenant):
            return  # another shard's tenant: its owner pumps its queue
        wake = self._wakes.setdefault(tenant, asyncio.Event())
        wake.set()
        task = self._pumps.get(tenant)
        if task is None or task.done():
            self._pumps[tenant] = asyncio.create_task(
                self._pump_loop(tenant, wake), name=f"pump-{tenant}"
            )

    async def _pump_loop(self, tenant: str, wake: asyncio.Event) -> None:
        await loops.every(
            None,
            lambda: self.pump_queue(tenant),
            what=f"admission pump of tenant {tenant}",
            stopping=self._stopping,
            wake=wake,
            wait_first=True,
        )

    async def pump_queue(self, tenant: str) -> None:
        """Admit from the head of the tenant's queue while runs fit; show the rest as Queued.
        Costs O(runs admitted) plus O(log n) per newly queued run, whatever the queue's
        length n (and one look over it a second, within the status-write rate)."""
        async with self._pass_lock(tenant):
            queue = await self.store.queued(tenant)
            await self._rebind(tenant, queue)
            policy = self.deps.tenants.policies.get(tenant)
            wait: QueueWait | None = None
            passed: set[str] = set()
            """Runs waiting for their AgentToolServer's discovery: the runs behind them go on."""
            while heads := list(itertools.islice(_not_in(queue, passed), ADMIT_BATCH)):
                if policy is None:
                    wait = self.deps.tenants.why_missing(tenant)
                    break
                ready, wait = await self._prepare(policy, heads, queue, passed=passed)
                wait = (await self._admit(policy, ready) if ready else None) or wait
                if wait is not None:
                    break
                if heads[0].uid in queue and heads[0].uid not in passed:  # never spin on it
                    raise RuntimeError(f"run {heads[0].uid} was neither admitted nor dequeued")
                self.board.record_progress(tenant, waiting=len(queue))
            fresh = self._fresh.pop(tenant, {})
            self.board.record_pass(tenant, waiting=len(queue), blocked=wait)
            if wait is not None:
                self.shown.show_queued(
                    tenant,
                    queue,
                    wait,
                    seen=self._waiting,
                    fresh=list(fresh.values()),
                    apart=passed,
                )

    # --- following the namespaces' binding -----------------------------------------------------

    async def _rebind(self, tenant: str, queue: TenantQueue) -> None:
        """Move the runs of ``tenant``'s ``queue`` whose namespace binds another tenant now to
        that tenant's queue, and end those whose namespace binds none as a new run there ends
        (``rebinding``), when due: after an AgentTenant's binding changed
        (``Tenants.bindings``), else ``rebinding.RECHECK_EVERY`` seconds after the last look
        (a relabelled namespace). Runs bound to no tenant (or falling to the default one)
        wait while ``tenant`` is invalid or was deleted lately (``rebinding.deleted_lately``:
        it may be applied again). Called under the queue's pass lock: no run leaves it for
        another queue while it is being admitted. Raises what the ledger store raises (the
        next pass looks again: the look is recorded only once it is done)."""
        registry, now = self.deps.tenants, self.clock()
        bindings = registry.bindings
        if not queue:
            self._gone.pop(tenant, None)
            return
        gone = self._gone_since(tenant, now)
        ends = None if gone is None else gone + rebinding.DELETED_GRACE
        if not rebinding.due(
            self._checked.get(tenant), bindings=bindings, now=now, grace_ends=ends
        ):
            return
        found = {ns: await self._binding(ns) for ns in rebinding.namespaces(queue)}
        waits = tenant in registry.invalid or rebinding.deleted_lately(gone, now=now)
        for queued, fate in rebinding.fates(tenant, queue, found, waits=waits):
            await self._move(tenant, queued, fate)
        self._checked[tenant] = rebinding.Checked(bindings, now)  # a change meanwhile: again

    def _gone_since(self, tenant: str, now: float) -> float | None:
        """When a look at ``tenant``'s queue first found it deleted (epoch seconds), ``now``
        if this is that look; ``None`` while it exists (valid or invalid). The first such
        look has the queue pumped again once ``rebinding.DELETED_GRACE`` has passed, when
        its runs bound to no tenant end if it was not applied again."""
        registry = self.deps.tenants
        if tenant in registry.policies or tenant in registry.invalid:
            self._gone.pop(tenant, None)
            return None
        since = self._gone.get(tenant)
        if since is None:
            since = self._gone[tenant] = now
            wake = rebinding.DELETED_GRACE + 1.0  # a look is due then (``rebinding.due``)
            asyncio.get_running_loop().call_later(wake, self.board.kick, tenant)
        return since

    async def keeps(self, tenant: str, uid: str) -> bool:
        """Whether run ``uid``, its namespace bound to no tenant now, stays in ``tenant``'s
        queue for the queue's passes to decide (``_rebind``: it waits while ``tenant`` is
        invalid, or for ``rebinding.DELETED_GRACE`` once it is found deleted): ``tenant`` is
        deleted or invalid and its queue holds the run. Asked on kopf's resume after a restart,
        which would otherwise end it at once as a new run there ends. Raises what the ledger
        store raises."""
        registry = self.deps.tenants
        if tenant in registry.policies and tenant not in registry.invalid:
            return False
        return await self.holds(tenant, uid)

    async def holds(self, tenant: str, uid: str) -> bool:
        """Whether ``tenant``'s admission queue holds run ``uid`` (``""``: no tenant's does).
        Raises what the ledger store raises."""
        return bool(tenant) and uid in await self.store.queued(tenant)

    async def _binding(self, namespace: str) -> rebinding.Binding:
        """What ``namespace`` binds now (``Tenants.resolve``, its labels read when a tenant
        selects by label); ``Unknown`` when it cannot be read (logged at debug level, looked
        at again later); ``Bound.fallback`` when it falls to the default tenant, which neither
        lists nor selects it; ``Bound.here`` false when the tenant is another shard's."""
        try:
            policy = await self.deps.tenants.resolve(namespace)
        except NoTenant as err:
            return rebinding.Unbound(str(err))
        except Exception as err:  # the API server away: the runs stay where they are
            log.debug("the tenant of namespace %s is not known now: %r", namespace, err)
            return rebinding.Unknown()
        fallback = self.deps.tenants.falls_back(policy, namespace)
        here = self.ownership.owns_tenant(policy.name)
        return rebinding.Bound(policy.name, fallback=fallback, here=here)

    async def _move(self, tenant: str, queued: QueuedRun, fate: rebinding.Fate) -> None:
        """Take ``queued`` out of ``tenant``'s queue, then queue it in the tenant its namespace
        binds now as a new run is queued (``enqueue_run``: at its creation time's place, its
        ``Queued`` status there written at that queue's pass, or ended if that queue is full)
        or end it unadmitted as a new run there ends (``QueueStatus.end_unbound``). Out of the
        old queue first: an operator stopped in between leaves it in none, and kopf's resume
        of the run queues it again; in two, it could be admitted in both (one admitted from
        its new queue already, queued there by such a resume, only leaves the old). A tenant
        gone since it was resolved leaves the run where it is (the next pass looks again)."""
        key = RunKey(queued.namespace, queued.name, queued.uid)
        match fate:
            case rebinding.Unbound(message):
                generation = await self._unqueue(tenant, key)
                if generation is not None:
                    self._objects.pop(key.uid, None)
                    self.deps.configs.forget(key.uid)
                    self.shown.end_unbound(key, message, generation=generation)
            case rebinding.Bound(tenant=to, here=False):
                await self._hand_over(tenant, key, to)
            case rebinding.Bound(tenant=to):
                policy = self.deps.tenants.policies.get(to)
                if policy is None:
                    return
                generation = await self._unqueue(tenant, key)
                if generation is None or self.deps.runs.is_tracked(key.uid):
                    return  # admitted from its new queue already (queued there by a resume)
                self._changed(key, tenant, to, "'s")
                await self.enqueue_run(key, policy, generation=generation, created=queued.at)
            case _:
                typing.assert_never(fate)

    async def _hand_over(self, tenant: str, key: RunKey, to: str) -> None:
        """Take ``key`` out of ``tenant``'s queue and hand it to the owner of ``to``'s shard,
        another process (``QueueStatus.hand_over``: its status names ``to`` with no phase, so
        that process's kopf admits it as a new run). An operator stopped in between leaves its
        status naming ``tenant``: kopf's resume of it here hands it over then
        (``handlers.admission``)."""
        queued = (await self.store.queued(tenant)).get(key.uid)
        generation = await self._unqueue(tenant, key)
        if generation is None or queued is None:
            return
        self._objects.pop(key.uid, None)
        self.deps.configs.forget(key.uid)
        self._changed(key, tenant, to, " (another operator shard's)")
        self.shown.hand_over(key, to, generation=generation, since=queued.at)

    def _changed(self, key: RunKey, tenant: str, to: str, whose: str) -> None:
        """The ``TenantChanged`` Event of run ``key`` moved from ``tenant``'s queue to
        ``to``'s (``whose``: how the message names that queue after ``to``)."""
        self.deps.events.record(
            involved(key),
            type=EventType.NORMAL,
            reason="TenantChanged",
            message=(
                f"moved from AgentTenant {tenant!r}'s admission queue to {to!r}{whose}: its "
                "namespace binds that tenant now"
            ),
        )

    async def _unqueue(self, tenant: str, key: RunKey) -> int | None:
        """Take run ``key`` out of ``tenant``'s queue and forget its status there (it is shown
        again where it goes): its object's generation as last seen (1 when not seen), or
        ``None`` when it was not in that queue. Raises what the ledger store raises."""
        if not await self.store.dequeue(tenant, key.uid):
            return None
        self._fresh.get(tenant, {}).pop(key.uid, None)
        seen = self._waiting.pop(key.uid, None)
        return 1 if seen is None else seen.generation

    # --- admitting one run ----------------------------------------------------------------------

    async def _prepare(
        self,
        policy: TenantPolicy,
        heads: list[QueuedRun],
        queue: TenantQueue,
        *,
        passed: set[str],
    ) -> tuple[list[_Ready], QueueWait | None]:
        """The first runs of the queue made ready for admission, in order, and why the queue
        waits before the others if it does: the tenant's event storage is full, or a head's
        preparation failed for a passing reason (``AdmissionRetrying``). A run that cannot run
        at all leaves the queue (one that failed twice otherwise than transiently too), one
        waiting for its AgentToolServer's discovery (not for the tenant) is shown Queued and
        passed over (``passed``): the runs behind it go on."""
        full = self.deps.storage.wait(policy.name)
        if full is not None:
            return [], full
        ready: list[_Ready] = []
        for queued in heads:
            try:
                prepared = await self._prepare_one(policy, queued, queue, passed=passed)
            except Exception as err:
                wait = await self._failed(policy, queued, err)
                if wait is not None:
                    return ready, wait
                continue
            if prepared is not None:
                ready.append(prepared)
        return ready, None

    async def _prepare_one(
        self, policy: TenantPolicy, queued: QueuedRun, queue: TenantQueue, *, passed: set[str]
    ) -> _Ready | None:
        """One queue head made ready (its frozen config and first call's worst case), or
        ``None`` if it left the queue or waits for its AgentToolServer's discovery or for an
        object it names that was deleted while it waited (added to ``passed``)."""
        head = await self._read_head(policy, queued)
        if head is None:
            return None
        built_at = self.clock()
        try:
            config = await self.deps.configs.build_config(
                head.key, head.obj.run_spec(), policy, start_time=built_at, queued=True
            )
        except (ToolServerPending, ReferenceMissing) as err:
            pending = isinstance(err, ToolServerPending)
            why = WaitReason.TOOL_SERVER_PENDING if pending else WaitReason.REFERENCE_MISSING
            position = queue.position(queued.uid) or 1
            self.shown.show_run(
                policy.name, queued, position, QueueWait(why, str(err)), seen=self._waiting
            )
            passed.add(queued.uid)
            return None
        except SpecError as err:  # e.g. its AgentModel edited to no prices under a cost cap
            await self._drop(head, policy, kernel.Phase.INVALID_SPEC, str(err))
            return None
        need = self.deps.configs.first_call_need(config)
        never = never_fits(need, tenant=policy.name, limits=policy.limits)
        if never is not None:  # waiting would block everyone behind it for ever
            await self._drop(head, policy, kernel.Phase.TENANT_BUDGET_EXHAUSTED, never)
            return None
        return _Ready(queued, head, config, need, built_at)

    async def _failed(
        self, policy: TenantPolicy, queued: QueuedRun, err: Exception
    ) -> QueueWait | None:
        """``queued``'s admission failed with ``err``: a passing failure makes the queue wait
        for the next pass (``AdmissionRetrying``, returned); a permanent one that repeated ends
        the run (``_give_up``), so the runs behind it go on (``None``)."""
        subject = f"AgentRun {queued.namespace}/{queued.name}"
        failure = self.failures.failed(queued.uid, err, subject=subject)
        if not failure.final:
            why = f"admitting it failed ({type(err).__name__}); retrying: {err}"[:500]
            return QueueWait(WaitReason.ADMISSION_RETRYING, why)
        self.failures.forget(queued.uid)
        await self._give_up(policy, queued, err)
        return None

    async def _admit(self, policy: TenantPolicy, ready: list[_Ready]) -> QueueWait | None:
        """Admit the longest prefix of ``ready`` that fits (one ledger write) and start those
        runs together; say why the first of the others waits (``None`` if none does, or it
        left the queue: ``whenExhausted: Fail``, a permanent failure), or that a failure is
        retried at the next pass."""
        await self._records_room()
        now = self.clock()
        try:
            answers = await self.store.admit_runs(
                policy.name,
                [(r.queued, r.need) for r in ready],
                limits=policy.limits,
                now=now,
                lives={r.queued.uid: r.head.obj.status.reruns for r in ready},
            )
        except Exception as err:  # the ledger's write: the first of them is retried or ended
            return await self._failed(policy, ready[0].queued, err)
        admitted = [r for r, answer in zip(ready, answers, strict=False) if answer is None]
        started = await asyncio.gather(*(self._start(r, policy, now=now) for r in admitted))
        retry = next((wait for ok, wait in started if wait is not None), None)
        refusal = answers[-1]
        if refusal is None or not all(ok for ok, _ in started):
            return retry  # a run that did not start freed its slot: the rest are tried again
        wait = QueueWait.of(refusal)
        if wait.reason is WaitReason.BUDGET_EXHAUSTED and (
            policy.when_exhausted is WhenExhausted.FAIL
        ):
            message = (
                f"AgentTenant {policy.name!r} has too little budget left for this run's "
                f"first model call ({wait.message}); its spec.whenExhausted is Fail"
            )
            refused = ready[len(admitted)].head
            await self._drop(refused, policy, kernel.Phase.TENANT_BUDGET_EXHAUSTED, message)
            return retry
        return wait

    async def _start(
        self, ready: _Ready, policy: TenantPolicy, *, now: float
    ) -> tuple[bool, QueueWait | None]:
        """``_start_admitted``, its failure handled as ``_failed`` does (the run keeps its
        place and its slot for the next pass, or ends): whether it started, and why the queue
        waits if it does."""
        queued = ready.queued
        try:
            config = dataclasses.replace(  # its timeout counts from its admission, ``now``
                ready.config, deadline=now + (ready.config.deadline - ready.built_at)
            )
            started = await self._start_admitted(ready.head, policy, config, now=now)
        except Exception as err:
            return False, await self._failed(policy, queued, err)
        self.failures.succeeded(queued.uid, subject=f"AgentRun {queued.namespace}/{queued.name}")
        return started, None

    async def _give_up(self, policy: TenantPolicy, queued: QueuedRun, err: Exception) -> None:
        """End a queued run whose admission failed permanently, ``checkpoint_failed`` naming
        the error: through its event stream if it was started (a ``stop`` event), else
        unadmitted with its ledger slot and hold released; then out of the queue. Raises what
        NATS raises (the next pass tries again)."""
        key = RunKey(queued.namespace, queued.name, queued.uid)
        message = f"admission failed {GIVE_UP_MESSAGE}: {type(err).__name__}: {err}"[:1000]
        if not await self.deps.runs.end(
            key.namespace, key.name, key.uid, kernel.Phase.CHECKPOINT_FAILED, message
        ):
            obj = self._objects.get(key.uid)
            life = obj.status.reruns if obj is not None else None
            await self.deps.settlement.release_unstarted(policy.name, uid=key.uid, life=life)
            seen = self._waiting.get(key.uid)
            self.shown.end_unadmitted(
                key,
                kernel.Phase.CHECKPOINT_FAILED,
                message,
                tenant=policy.name,
                generation=seen.generation if seen else 1,
            )
        await self._leave(policy.name, key)

    async def _read_head(self, policy: TenantPolicy, queued: QueuedRun) -> _Head | None:
        """The queue head's object, or ``None`` once it left the queue (deleted, cancelled)."""
        key = RunKey(queued.namespace, queued.name, queued.uid)
        obj = self._objects.get(key.uid) or await fetch_pending_run(self.deps.api, key)
        if obj is None:  # deleted, or a new object of that name: nothing to admit
            await self._leave(policy.name, key)
            return None
        head = _Head(key, obj, queued.at)
        if obj.metadata.annotations.get(CANCEL_ANNOTATION) == "true":
            message = f"cancelled by the {CANCEL_ANNOTATION} annotation"
            await self._drop(head, policy, kernel.Phase.CANCELLED, message)
            return None
        return head

    async def _drop(
        self, head: _Head, policy: TenantPolicy, phase: kernel.Phase, message: str
    ) -> None:
        """End a queued run that will not run, and take it out of the queue."""
        self.shown.end_unadmitted(
            head.key, phase, message, tenant=policy.name, generation=head.obj.metadata.generation
        )
        await self._leave(policy.name, head.key)

    async def _start_admitted(
        self, head: _Head, policy: TenantPolicy, config: RunConfig, *, now: float
    ) -> bool:
        """Start a run that got its ledger slot: its ``admitted`` event, then out of the queue.
        False if it could not be (too large to checkpoint: it ends, its slot freed)."""
        config = dataclasses.replace(  # its admission seals the life the object is in
            config, traceparent=telemetry.mint_traceparent(), reruns=head.obj.status.reruns
        )
        with self.board.admitting(head.key.uid):
            try:
                await self.deps.runs.start_run(
                    config, start_time=now, generation=head.obj.metadata.generation
                )
            except (EventTooLarge, nats.errors.MaxPayloadError) as err:
                cap = err.cap if isinstance(err, EventTooLarge) else None
                message = too_large_to_checkpoint(config, cap=cap)
                life = head.obj.status.reruns
                await self.deps.settlement.release_unstarted(
                    policy.name, uid=head.key.uid, life=life
                )
                await self._drop(head, policy, kernel.Phase.INVALID_SPEC, message)
                return False
        self.record_later(head.key)
        self._waiting.pop(head.key.uid, None)
        self._objects.pop(head.key.uid, None)
        self.deps.configs.forget(head.key.uid)
        await self.store.dequeue(policy.name, head.key.uid)
        metrics.ADMISSION_WAIT.labels(tenant=policy.name).observe(max(0.0, now - head.created))
        self._tell_admitted(head, policy, config, now=now)
        return True

    def _tell_admitted(
        self, head: _Head, policy: TenantPolicy, config: RunConfig, *, now: float
    ) -> None:
        """The ``Admitted`` Event of a run started at ``now``: its tenant, model and wait, and
        the caps its tenant's ``spec.runBudget.max`` lowered (``TenantPolicy.capped``; its
        ``status.budget`` shows every cap it got)."""
        message = (
            f"admitted in AgentTenant {policy.name!r} (model {config.model.name!r}); "
            f"waited {max(0.0, now - head.created):.1f}s since "
            f"{'its rerun' if head.obj.status.reruns else 'creation'}"
        )
        try:  # parsed already by its config's build: a failure here is not the run's
            capped = policy.capped(runs.AgentRunSpec.of(head.obj.run_spec()).budget)
        except SpecError:
            capped = ()
        if capped:
            lowered = ", ".join(over.text() for over in capped)
            message += f"; its spec.runBudget.max capped {lowered}"
        self.deps.events.record(
            involved(head.key), type=EventType.NORMAL, reason="Admitted", message=message
        )

    def record_later(self, key: RunKey) -> None:
        """Record run ``key``'s admission on its object (``_record_admitted``) beside the
        pass, ``RECORDS_AT_ONCE`` records at a time; ``recorded`` waits for it. Only after
        its ``admitted`` event is appended: an object naming its uid with no events on its
        subject reads as a lost checkpoint (``runs.recovery``). One lost to a stop is written
        again when the run is picked up from its events (``handlers.admission``)."""
        task = asyncio.create_task(self._record_in_turn(key), name=f"admitted-{key.uid}")
        self._records[key.uid] = task
        task.add_done_callback(lambda done: self._records_done(key.uid, done))

    def _records_done(self, uid: str, task: asyncio.Task[None]) -> None:
        if self._records.get(uid) is task:
            del self._records[uid]

    async def _records_room(self) -> None:
        """Wait until fewer than ``RECORDS_PENDING`` admission records wait to be written."""
        while len(self._records) >= RECORDS_PENDING:
            pending = list(self._records.values())
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)

    async def _record_in_turn(self, key: RunKey) -> None:
        async with self._record_slots:
            await self._record_admitted(key)

    async def recorded(self, uid: str) -> None:
        """Wait until the admission record of run ``uid`` being written, if one is, is
        written or given up (logged): a rerun removes the record, and an earlier life's
        landing after that would read as a lost checkpoint at the next start. Cancelling the
        caller does not cancel the record."""
        task = self._records.get(uid)
        if task is not None:
            await asyncio.wait({task})

    async def _record_admitted(self, key: RunKey) -> None:
        """Record on the object that run ``key`` was admitted (``agentrun.dev/admitted-uid``:
        its uid, which a restored copy does not have; ``runs.recovery``). Best effort: the
        run's status shows its admission too, and recovery records it again
        (``handlers.admission``)."""
        try:
            await self.deps.api.patch(key.ref, admitted_patch(key.uid))
        except Exception as err:  # the API server away, or the object replaced (422)
            log.warning("could not record the admission of %s/%s: %r", key.namespace, key.name, err)

    async def release_slot(self, tenant: str, uid: str, *, life: int) -> None:
        """Free the ledger slot of run ``uid`` in ``tenant`` (what it was charged stays
        charged), before it runs again from turn 0 as its life ``life`` + 1; nothing when it
        holds none, or a slot of a later life than ``life`` (``LedgerStore.free_run``).
        Raises what the ledger store raises."""
        await self.deps.settlement.release_unstarted(tenant, uid=uid, life=life)

    async def _leave(self, tenant: str, key: RunKey) -> None:
        """Take a run that will not run out of the queue."""
        self._waiting.pop(key.uid, None)
        self._objects.pop(key.uid, None)
        self.deps.configs.forget(key.uid)
        await self.store.dequeue(tenant, key.uid)


def _queue_full(err: QueueFull) -> tuple[kernel.Phase, str]:
    """How a run its tenant's full queue refused ends: ``tenant_budget_exhausted`` (the
    platform's ``AGENTRUN_MAX_QUEUED_RUNS``)."""
    message = f"{err}; the run was not queued: create it again once the queue is shorter"
    return kernel.Phase.TENANT_BUDGET_EXHAUSTED, message
