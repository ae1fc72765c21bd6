"""Tenant admission: FIFO queues per tenant, ledger slots, and the periodic ledger sweep.

A new AgentRun is validated against its AgentModel and its tenant's policy, then appended to
its tenant's queue (``queue.<tenant>`` in the ledger bucket). A pump per tenant admits from the
head while the tenant has a free ``maxConcurrentRuns`` slot and budget left (``Book.admit``, one
compare-and-set), appending the run's ``admitted`` event; it stops at the first run that does
not fit, so admission is FIFO. Runs left waiting show ``Queued`` with the reason and their
position. Every step is idempotent (the ledger slot by run uid, the admitted event by
compare-and-set on an empty subject, the queue by uid), so an operator that dies mid-admission
neither admits a run twice nor forgets one: the queue and the ledger are in JetStream.

The sweep (every few seconds) starts new windows, releases holds whose worker died (charging
what the run's events show it committed), frees slots of runs that ended while no operator
watched, ends the runs of a tenant whose wall-clock budget ran out, pumps every queue, and
writes each AgentTenant's ``.status`` and the tenant budget metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

import nats.errors
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from agentrun import kernel, kube, metrics, telemetry
from agentrun.ledger import Book, BudgetRefusal, LedgerStore, QueuedRun, worst_case
from agentrun.ledger.book import BUDGET_EXHAUSTED
from agentrun.protocol import DEFAULT_TENANT, RunConfig, RunEvent

from . import admission, status, tenancy
from .dispatch import Dispatcher
from .statuswriter import MERGE_PATCH, RunKey, StatusWriter
from .tenancy import TenantPolicy

log = logging.getLogger(__name__)

CANCEL_ANNOTATION = "agentrun.dev/cancel"
MODEL_CACHE_SECONDS = 5.0
STALE_GRACE = 30.0
"""Seconds an active ledger entry without a live run view is left alone before the sweep
checks the run's events (admission in progress, an operator just restarted)."""


class NoTenant(Exception):
    """The run's namespace is bound to no AgentTenant (and no default tenant applies)."""


async def get_model(api: client.ApiClient, name: str) -> dict[str, Any] | None:
    """The cluster-scoped AgentModel ``name`` or ``None``; raises ``ApiException`` otherwise."""
    try:
        found: dict[str, Any] = await client.CustomObjectsApi(api).get_cluster_custom_object(
            kube.GROUP, kube.VERSION, kube.MODELS, name
        )
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    return found


class Tenants:
    """The AgentTenants the operator knows (kept current by a kopf watch) and the binding of
    namespaces to them."""

    def __init__(self, api: client.ApiClient | None, *, default: str | None = None) -> None:
        self.api = api
        self.default = default or None
        self.policies: dict[str, TenantPolicy] = {}
        self.invalid: dict[str, tuple[int, str]] = {}
        """AgentTenants that cannot be enforced: (generation, why), shown in their status."""
        self._invalid_namespaces: dict[str, frozenset[str]] = {}

    def put(self, obj: Mapping[str, Any]) -> TenantPolicy | None:
        """Add or replace an AgentTenant; an invalid one binds nothing (its runs are rejected
        with the reason rather than run unbudgeted)."""
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        try:
            policy = TenantPolicy.of(obj)
        except (tenancy.InvalidTenant, ValueError, TypeError) as err:
            self.policies.pop(name, None)
            self.invalid[name] = (int(meta.get("generation") or 1), str(err))
            self._invalid_namespaces[name] = frozenset(
                (obj.get("spec") or {}).get("namespaces") or ()
            )
            return None
        self.invalid.pop(name, None)
        self._invalid_namespaces.pop(name, None)
        self.policies[name] = policy
        return policy

    def remove(self, name: str) -> None:
        """Forget a deleted AgentTenant (its ledger entry stays until its runs end)."""
        self.policies.pop(name, None)
        self.invalid.pop(name, None)
        self._invalid_namespaces.pop(name, None)

    async def _labels(self, namespace: str) -> Mapping[str, str]:
        if self.api is None or not any(p.selector is not None for p in self.policies.values()):
            return {}
        ns = await client.CoreV1Api(self.api).read_namespace(namespace)
        return dict(ns.metadata.labels or {})

    async def resolve(self, namespace: str) -> TenantPolicy:
        """The tenant of runs in ``namespace``; raises ``NoTenant`` with a message for the run's
        status when none (or several) applies."""
        for name, namespaces in self._invalid_namespaces.items():
            if namespace in namespaces:  # never fall through to another tenant's budget
                raise NoTenant(
                    f"AgentTenant {name!r} binds namespace {namespace!r} but is invalid: "
                    f"{self.invalid[name][1]}"
                )
        try:
            found = tenancy.resolve(
                self.policies.values(),
                namespace,
                await self._labels(namespace),
                default=self.default,
            )
        except tenancy.Ambiguous as err:
            raise NoTenant(str(err)) from err
        if found is not None:
            return found
        if self.default and self.default in self.invalid:
            raise NoTenant(
                f"default AgentTenant {self.default!r} is invalid: {self.invalid[self.default][1]}"
            )
        if self.default:
            raise NoTenant(
                f"namespace {namespace!r} is bound to no AgentTenant and the default tenant "
                f"{self.default!r} does not exist"
            )
        raise NoTenant(
            f"namespace {namespace!r} is bound to no AgentTenant; a platform admin must list it "
            "in an AgentTenant's spec.namespaces or match it with spec.namespaceSelector"
        )


@dataclasses.dataclass(slots=True)
class _Waiting:
    generation: int = 1
    shown: tuple[int, str] | None = None
    """(position, reason) last written to the run's status."""


class Admitter:
    """Owns the tenant queues, the pumps and the sweep. One per operator process."""

    def __init__(
        self,
        store: LedgerStore,
        dispatcher: Dispatcher,
        writer: StatusWriter,
        tenants: Tenants,
        *,
        api: client.ApiClient | None,
        known_tools: Mapping[str, bool],
        tool_specs: Callable[[tuple[str, ...]], Sequence[Any]] = lambda names: (),
        clock: Callable[[], float] = time.time,
        sweep_interval: float = 2.0,
    ) -> None:
        """``tool_specs(names)``: the OpenAI ``tools`` list a worker sends for those tools (they
        count in a call's prompt estimate)."""
        self.store = store
        self.dispatcher = dispatcher
        self.writer = writer
        self.tenants = tenants
        self.api = api
        self.known_tools = known_tools
        self.tool_specs = tool_specs
        self.clock = clock
        self.sweep_interval = sweep_interval
        self.waiting: dict[str, _Waiting] = {}
        """Runs this operator has seen queued (uid → what their status shows)."""
        self.queued: dict[str, int] = {}
        """Queue length per tenant, as of the last pump."""
        self.blocked: dict[str, BudgetRefusal | None] = {}
        """Why the head of each tenant's queue waits, as of the last pump."""
        self._locks: dict[str, asyncio.Lock] = {}
        self._kicks: dict[str, asyncio.Event] = {}
        self._pumps: dict[str, asyncio.Task[None]] = {}
        self._admitting: set[str] = set()
        self._objects: dict[str, Mapping[str, Any]] = {}
        self._models: dict[str, tuple[float, dict[str, Any] | None]] = {}
        self._status: dict[str, dict[str, Any]] = {}
        self._transitions: dict[tuple[str, str], tuple[str, float]] = {}
        self._stopping = asyncio.Event()
        dispatcher.on_end = self.close
        dispatcher.queued_counts = self.queued

    # --- admission --------------------------------------------------------------------------------

    async def prepare(
        self,
        run: RunKey,
        spec: Mapping[str, Any],
        policy: TenantPolicy,
        *,
        start_time: float,
    ) -> RunConfig:
        """The run's ``RunConfig`` under its tenant's policy; raises ``InvalidSpec``."""
        applied = policy.apply(spec)
        model = await self._model(str(spec.get("model", "")))
        return admission.admit(
            admission.RunRef(run.namespace, run.name, run.uid),
            applied,
            model=model,
            known_tools=self.known_tools,
            start_time=start_time,
            tenant=policy.name,
        )

    async def _model(self, name: str) -> dict[str, Any] | None:
        """The AgentModel, cached for ``MODEL_CACHE_SECONDS`` (a burst of admissions reads it
        once; an edited price applies to runs admitted a few seconds later)."""
        if self.api is None:
            return None
        cached = self._models.get(name)
        now = time.monotonic()
        if cached is not None and cached[0] > now:
            return cached[1]
        model = await get_model(self.api, name)
        self._models[name] = (now + MODEL_CACHE_SECONDS, model)
        return model

    async def submit(
        self,
        run: RunKey,
        policy: TenantPolicy,
        *,
        generation: int,
        created: float,
        obj: Mapping[str, Any] | None = None,
    ) -> None:
        """Queue a validated run in its tenant's queue by creation time (idempotent), pump.

        ``created`` is the AgentRun's creationTimestamp (epoch seconds); ``obj`` the object
        as the handler saw it (spec and metadata), so the pump need not read it again (its
        spec is immutable; a cancel or delete reaches the queue through their handlers).
        """
        if obj is not None:
            self._objects[run.uid] = obj
        self.waiting.setdefault(run.uid, _Waiting(generation))
        await self.store.enqueue(policy.name, QueuedRun(run.uid, run.namespace, run.name, created))
        self.kick(policy.name)

    def kick(self, tenant: str) -> None:
        """Ask the tenant's pump to run (coalesced)."""
        event = self._kicks.setdefault(tenant, asyncio.Event())
        event.set()
        task = self._pumps.get(tenant)
        if task is None or task.done():
            self._pumps[tenant] = asyncio.create_task(
                self._pump_loop(tenant), name=f"pump-{tenant}"
            )

    async def _pump_loop(self, tenant: str) -> None:
        event = self._kicks[tenant]
        while not self._stopping.is_set():
            await event.wait()
            event.clear()
            try:
                await self.pump(tenant)
            except Exception:
                log.exception(
                    "admission pump of tenant %s failed; retrying at the next sweep", tenant
                )

    async def pump(self, tenant: str) -> None:
        """Admit from the head of the tenant's queue while runs fit; show the rest as Queued."""
        lock = self._locks.setdefault(tenant, asyncio.Lock())
        async with lock:
            policy = self.tenants.policies.get(tenant)
            queue = await self.store.queue(tenant)
            refusal: BudgetRefusal | None = None
            index = 0
            while index < len(queue):
                run = queue[index]
                if policy is None:
                    invalid = self.tenants.invalid.get(tenant)
                    refusal = (
                        BudgetRefusal(
                            "TenantInvalid",
                            None,
                            f"AgentTenant {tenant!r} is invalid: {invalid[1]}",
                        )
                        if invalid is not None
                        else BudgetRefusal(
                            "TenantMissing", None, f"AgentTenant {tenant!r} not found"
                        )
                    )
                    break
                outcome = await self._admit_head(policy, run)
                if isinstance(outcome, BudgetRefusal):
                    refusal = outcome
                    break
                index += 1
            waiting = queue[index:]
            self.queued[tenant] = len(waiting)
            self.blocked[tenant] = refusal
            if refusal is not None:
                self._show_queued(tenant, waiting, refusal)

    async def _admit_head(self, policy: TenantPolicy, queued: QueuedRun) -> BudgetRefusal | None:
        """Admit ``queued`` or say why it waits; a run that cannot run at all leaves the queue."""
        key = RunKey(queued.namespace, queued.name, queued.uid)
        obj = self._objects.get(key.uid) or await self._get_run(key)
        if obj is None:  # deleted, or a new object of that name: nothing to admit
            await self._leave(policy.name, key, admitted=False)
            return None
        generation = int((obj.get("metadata") or {}).get("generation") or 1)
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        if annotations.get(CANCEL_ANNOTATION) == "true":
            self.end_unadmitted(
                key,
                kernel.Phase.CANCELLED,
                f"cancelled by the {CANCEL_ANNOTATION} annotation",
                tenant=policy.name,
                generation=generation,
            )
            await self._leave(policy.name, key, admitted=False)
            return None
        now = self.clock()
        try:
            config = await self.prepare(key, obj.get("spec") or {}, policy, start_time=now)
        except admission.InvalidSpec as err:  # e.g. its AgentModel was deleted while it waited
            self.end_unadmitted(
                key, kernel.Phase.INVALID_SPEC, str(err), tenant=policy.name, generation=generation
            )
            await self._leave(policy.name, key, admitted=False)
            return None
        need = first_call_need(config, self.tool_specs(config.tools))
        never = _never_fits(policy, need)
        if never is not None:  # waiting would block everyone behind it for ever
            self.end_unadmitted(
                key,
                kernel.Phase.TENANT_BUDGET_EXHAUSTED,
                never,
                tenant=policy.name,
                generation=generation,
            )
            await self._leave(policy.name, key, admitted=False)
            return None
        refusal = await self.store.change(
            policy.name, lambda book: _admit(book, policy, queued, now, need), limits=policy.limits
        )
        if refusal is not None:
            if refusal.reason == BUDGET_EXHAUSTED and (
                policy.when_exhausted is tenancy.WhenExhausted.FAIL
            ):
                self.end_unadmitted(
                    key,
                    kernel.Phase.TENANT_BUDGET_EXHAUSTED,
                    f"AgentTenant {policy.name!r} has too little budget left for this run's "
                    f"first model call ({refusal.message}); its spec.whenExhausted is Fail",
                    tenant=policy.name,
                    generation=generation,
                )
                await self._leave(policy.name, key, admitted=False)
                return None
            return refusal
        self._admitting.add(key.uid)
        try:
            await self._start(policy, key, config, generation=generation, now=now)
        finally:
            self._admitting.discard(key.uid)
        return None

    async def _start(
        self,
        policy: TenantPolicy,
        key: RunKey,
        config: RunConfig,
        *,
        generation: int,
        now: float,
    ) -> None:
        config = dataclasses.replace(config, traceparent=telemetry.mint_traceparent())
        try:
            await self.dispatcher.admit(config, start_time=now, generation=generation)
        except nats.errors.MaxPayloadError:
            self.end_unadmitted(
                key,
                kernel.Phase.INVALID_SPEC,
                f"spec: about {len(repr(config.as_dict()))} bytes, more than the event stream's "
                "message limit allows to checkpoint; shorten spec.goal, spec.instructions or "
                "spec.output.schema",
                tenant=policy.name,
                generation=generation,
            )
            await self._leave(policy.name, key, admitted=True)
            return
        self.waiting.pop(key.uid, None)
        self._objects.pop(key.uid, None)
        await self.store.dequeue(policy.name, key.uid)

    async def _leave(self, tenant: str, key: RunKey, *, admitted: bool) -> None:
        """Take a run that will not run out of the queue (and its slot, if it got one)."""
        if admitted:
            now = self.clock()
            await self.store.change(
                tenant,
                lambda book: book.close(
                    key.uid, turn=-1, tokens=0, cost_usd=Decimal(0), end=now, now=now
                ),
            )
        self.waiting.pop(key.uid, None)
        self._objects.pop(key.uid, None)
        await self.store.dequeue(tenant, key.uid)

    def end_unadmitted(
        self,
        key: RunKey,
        phase: kernel.Phase,
        message: str,
        *,
        tenant: str | None,
        generation: int,
    ) -> None:
        """End a run that was never admitted (rejected spec, no tenant, no budget with
        ``whenExhausted: Fail``, cancelled while queued): write its terminal status, count it."""
        log.info("%s/%s ends unadmitted (%s): %s", key.namespace, key.name, phase.value, message)
        body = status.rejected(
            message, at=self.clock(), generation=generation, phase=phase, tenant=tenant
        )
        self.writer.submit(key, body, seq=0, terminal=True)
        state = kernel.stop(kernel.initial_state(goal=""), phase, message)
        self.dispatcher.count_end(key.uid, state, tenant=tenant or DEFAULT_TENANT)

    def _show_queued(self, tenant: str, waiting: list[QueuedRun], refusal: BudgetRefusal) -> None:
        now = self.clock()
        for position, run in enumerate(waiting, start=1):
            seen = self.waiting.setdefault(run.uid, _Waiting())
            reason = refusal.reason
            shown = (position, reason)
            if seen.shown == shown:
                continue
            seen.shown = shown
            why = (
                refusal.message
                if position == 1
                else f"behind {position - 1} run(s); the first waits because {refusal.message}"
            )
            body = status.queued(
                tenant=tenant,
                reason=reason,
                message=f"queued in AgentTenant {tenant!r} at position {position}: {why}",
                position=position,
                at=now,
                generation=seen.generation,
            )
            self.writer.submit(
                RunKey(run.namespace, run.name, run.uid), body, seq=0, terminal=False
            )

    async def _get_run(self, key: RunKey) -> dict[str, Any] | None:
        if self.api is None:
            return {"metadata": {"uid": key.uid}, "spec": {}}
        try:
            obj: dict[str, Any] = await client.CustomObjectsApi(
                self.api
            ).get_namespaced_custom_object(
                kube.GROUP, kube.VERSION, key.namespace, kube.RUNS, key.name
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        meta = obj.get("metadata") or {}
        if meta.get("uid") != key.uid or (obj.get("status") or {}).get("terminalReason"):
            return None
        return obj

    async def cancel_queued(self, key: RunKey, tenant: str | None = None) -> bool:
        """End a run that is still queued ``cancelled``; False if it is not queued."""
        for name in [tenant] if tenant else await self._tenants_with_queues():
            if await self.store.dequeue(name, key.uid):
                self._objects.pop(key.uid, None)
                seen = self.waiting.pop(key.uid, None)
                self.end_unadmitted(
                    key,
                    kernel.Phase.CANCELLED,
                    f"cancelled by the {CANCEL_ANNOTATION} annotation while queued",
                    tenant=name,
                    generation=seen.generation if seen else 1,
                )
                self.kick(name)
                return True
        return False

    async def forget_queued(self, uid: str) -> None:
        """A deleted run leaves whatever queue holds it."""
        self.waiting.pop(uid, None)
        self._objects.pop(uid, None)
        for name in await self._tenants_with_queues():
            if await self.store.dequeue(name, uid):
                self.kick(name)
                return

    async def _tenants_with_queues(self) -> list[str]:
        names = set(self.tenants.policies) | set(self.queued)
        return sorted(names)

    # --- ends -------------------------------------------------------------------------------------

    async def close(self, tenant: str, uid: str, event: RunEvent) -> None:
        """A run ended (its terminal event, or its last event when deleted): settle its final
        usage, charge its wall-clock time, free its slot, pump its tenant's queue."""
        totals = committed_totals(event)
        now = self.clock()
        end = event.time or now
        await self.store.change(tenant, lambda book: book.close(uid, **totals, end=end, now=now))
        self.kick(tenant)

    # --- the sweep --------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop the sweep and the pumps."""
        self._stopping.set()
        for task in self._pumps.values():
            task.cancel()

    async def run(self) -> None:
        """Sweep every ``sweep_interval`` seconds until stopped."""
        while not self._stopping.is_set():
            try:
                await self.sweep()
            except Exception:
                log.exception("ledger sweep failed; next one in %ss", self.sweep_interval)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.sweep_interval):
                    await self._stopping.wait()

    async def sweep(self) -> None:
        """One pass over every tenant (see the module docstring)."""
        for name, (generation, why) in list(self.tenants.invalid.items()):
            await self._patch_tenant_status(
                name,
                {
                    "observedGeneration": generation,
                    "conditions": [
                        self._condition(
                            name, "Accepted", False, "InvalidSpec", why, self.clock(), generation
                        )
                    ],
                },
            )
        names = set(self.tenants.policies) | set(await self.store.tenants())
        for tenant in sorted(names):
            try:
                await self._sweep_tenant(tenant)
            except Exception:
                log.exception("sweep of tenant %s failed", tenant)

    async def _sweep_tenant(self, tenant: str) -> None:
        policy = self.tenants.policies.get(tenant)
        book = await self.store.read(tenant)
        now = self.clock()
        if book is None and policy is None:
            return
        if book is not None:
            repairs = await self._repairs(book, now)
            if (
                repairs
                or (policy is not None and policy.limits != book.limits)
                or (book.window + book.limits.window_seconds <= now)
            ):
                await self.store.change(
                    tenant,
                    lambda b: _repair(b, policy, repairs, now),
                    limits=policy.limits if policy else None,
                )
                book = await self.store.read(tenant)
                assert book is not None
            if (
                book.limits.wall_seconds is not None
                and book.active
                and (book.wall_used(now) >= book.limits.wall_seconds)
            ):
                await self._end_all(book, now)
        if policy is not None:
            self.kick(tenant)
            await self._write_tenant_status(policy, book, now)

    async def _repairs(self, book: Book, now: float) -> list[tuple[str, str, RunEvent | None]]:
        """What the sweep must fix, read from the runs' events before the compare-and-set:
        (hold key or ``""``, run uid, the run's last event or ``None``)."""
        found: list[tuple[str, str, RunEvent | None]] = []
        for key, hold in book.expired(now):
            if not hold.name:  # its run is no longer active: nothing of it left to charge
                found.append((key, hold.run_uid, None))
                continue
            last = await self.dispatcher.bus.last_event(hold.namespace, hold.name)
            found.append(
                (key, hold.run_uid, last if last and last.run_uid == hold.run_uid else None)
            )
        for uid, run in book.active.items():
            if uid in self.dispatcher.views or uid in self._admitting:
                continue
            if now - run.since < STALE_GRACE:
                continue
            last = await self.dispatcher.bus.last_event(run.namespace, run.name)
            if last is None or last.run_uid != uid:
                found.append(("", uid, None))
            elif last.phase.is_terminal:
                found.append(("", uid, last))
            elif await self._get_run(RunKey(run.namespace, run.name, uid)) is None:
                # its object was removed while no operator watched (e.g. a finalizer forced
                # off): end it, or its slot and budget would stay taken forever
                with contextlib.suppress(Exception):
                    await self.dispatcher.end(
                        run.namespace, run.name, uid, kernel.Phase.CANCELLED, "the AgentRun is gone"
                    )
        return found

    async def _end_all(self, book: Book, now: float) -> None:
        message = (
            f"AgentTenant {book.tenant!r} used its wall-clock budget of "
            f"{book.limits.wall_seconds:.0f}s for this window"
        )
        for uid, run in list(book.active.items()):
            with contextlib.suppress(Exception):
                await self.dispatcher.end(
                    run.namespace, run.name, uid, kernel.Phase.TENANT_BUDGET_EXHAUSTED, message
                )

    # --- AgentTenant status and metrics -----------------------------------------------------------

    async def _write_tenant_status(
        self, policy: TenantPolicy, book: Book | None, now: float
    ) -> None:
        if book is None:
            book = Book.new(policy.name, policy.limits, now=now)
        body = self._tenant_status(policy, book, now)
        metrics.record_tenant_budget(policy.name, book, now=now)
        await self._patch_tenant_status(policy.name, body)

    async def _patch_tenant_status(self, name: str, body: dict[str, Any]) -> None:
        """Merge-patch an AgentTenant's status unless it is what we wrote last."""
        if self._status.get(name) == body or self.api is None:
            return
        try:
            await client.CustomObjectsApi(self.api).patch_cluster_custom_object_status(
                kube.GROUP, kube.VERSION, kube.TENANTS, name, {"status": body}, **MERGE_PATCH
            )
        except ApiException as err:
            if err.status != 404:
                log.warning("status of AgentTenant %s: HTTP %s", name, err.status)
            return
        self._status[name] = body

    def _tenant_status(self, policy: TenantPolicy, book: Book, now: float) -> dict[str, Any]:
        exhausted = book.exhausted(now)
        blocked = self.blocked.get(policy.name)
        if exhausted is None and blocked is not None and blocked.reason == BUDGET_EXHAUSTED:
            exhausted = blocked  # something is left, but not enough for the next run's call
        if exhausted is None:
            state, reason, message = False, "WithinBudget", "budget left in this window"
        else:
            assert exhausted.resource is not None
            state = True
            reason = f"{exhausted.resource[0].upper()}{exhausted.resource[1:]}Exhausted"
            message = exhausted.message
        return {
            "observedGeneration": policy.generation,
            "windowStart": status.rfc3339(book.window),
            "resetTime": status.rfc3339(book.reset_time),
            "activeRuns": len(book.active),
            "queuedRuns": self.queued.get(policy.name, 0),
            "budget": budget_status(book, now),
            "conditions": [
                self._condition(
                    policy.name, "Accepted", True, "Valid", "enforced", now, policy.generation
                ),
                self._condition(
                    policy.name, "BudgetExhausted", state, reason, message, now, policy.generation
                ),
            ],
        }

    def _condition(
        self,
        tenant: str,
        type_: str,
        state: bool,
        reason: str,
        message: str,
        now: float,
        generation: int,
    ) -> dict[str, Any]:
        key = (tenant, type_)
        value = "True" if state else "False"
        previous = self._transitions.get(key)
        since = previous[1] if previous is not None and previous[0] == value else now
        self._transitions[key] = (value, since)
        return status.condition(
            type_, status=state, reason=reason, message=message, at=since, generation=generation
        )


def budget_status(book: Book, now: float) -> dict[str, Any]:
    """``AgentTenant.status.budget``: used / reserved / limit / remaining per resource."""
    limits = book.limits
    tokens: dict[str, Any] = {
        "used": book.used_tokens,
        "reserved": book.reserved_tokens,
        "abandoned": book.abandoned_tokens,
    }
    if limits.tokens is not None:
        tokens["limit"] = limits.tokens
        tokens["remaining"] = max(0, limits.tokens - book.used_tokens - book.reserved_tokens)
    cost: dict[str, Any] = {
        "used": format(book.used_cost, "f"),
        "reserved": format(book.reserved_cost, "f"),
        "abandoned": format(book.abandoned_cost, "f"),
    }
    if limits.cost_usd is not None:
        cost["limit"] = format(limits.cost_usd, "f")
        left = limits.cost_usd - book.used_cost - book.reserved_cost
        cost["remaining"] = format(max(Decimal(0), left), "f")
    wall_used = book.wall_used(now)
    wall: dict[str, Any] = {"used": round(wall_used, 1), "reserved": 0}
    if limits.wall_seconds is not None:
        wall["limit"] = limits.wall_seconds
        wall["remaining"] = round(max(0.0, limits.wall_seconds - wall_used), 1)
    return {"tokens": tokens, "costUSD": cost, "wallClockSeconds": wall}


def committed_totals(event: RunEvent) -> dict[str, Any]:
    """What a run's event says it committed, as ``Book.settle``/``close`` take it: the last
    committed turn and the run's cumulative tokens and cost through it."""
    state = event.state()
    return {
        "turn": state.turn - 1,
        "tokens": state.usage.total_tokens,
        "cost_usd": state.usage.cost_usd,
    }


def _admit(
    book: Book, policy: TenantPolicy, run: QueuedRun, now: float, need: tuple[int, Decimal]
) -> BudgetRefusal | None:
    if book.limits != policy.limits:
        book.set_limits(policy.limits, now=now)
    return book.admit(
        run.uid, run.namespace, run.name, now=now, need_tokens=need[0], need_cost=need[1]
    )


def _never_fits(policy: TenantPolicy, need: tuple[int, Decimal]) -> str | None:
    """Why a run's first call exceeds the tenant's whole budget per window, if it does."""
    tokens, cost = need
    limits = policy.limits
    hint = (
        "; give the run a lower spec.budget.maxTokens or maxCostUSD (or the tenant a "
        "runBudget.default), which bounds each call's output allowance"
    )
    if limits.tokens is not None and tokens > limits.tokens:
        return (
            f"its first model call may use up to {tokens} tokens, more than AgentTenant "
            f"{policy.name!r} allows per window ({limits.tokens}){hint}"
        )
    if limits.cost_usd is not None and cost > limits.cost_usd:
        return (
            f"its first model call may cost up to {cost} USD, more than AgentTenant "
            f"{policy.name!r} allows per window ({limits.cost_usd}){hint}"
        )
    return None


def first_call_need(config: RunConfig, tools: Sequence[Any]) -> tuple[int, Decimal]:
    """The worst case of the run's first model call, as its worker will reserve it (the same
    prompt estimate and output allowance); (0, 0) if its own limits stop it before any call.

    Admission asks the tenant's budget for this much, so a run that waits ``Queued`` for
    budget is admitted only once its first call can actually be made.
    """
    state = kernel.initial_state(goal=config.goal, instructions=config.instructions)
    prompt = kernel.fit_context(state.messages, limits=config.limits, tools=tools)
    gate = kernel.admit_model_call(
        state,
        config.limits,
        pricing=config.model.pricing,
        prompt_estimate=prompt.tokens,
        now=0.0,
        deadline=math.inf,
    )
    if gate.phase is not None:
        return 0, Decimal(0)
    return worst_case(
        prompt_tokens=prompt.tokens,
        output_tokens=gate.max_output_tokens,
        pricing=config.model.pricing,
    )


def _repair(
    book: Book,
    policy: TenantPolicy | None,
    repairs: list[tuple[str, str, RunEvent | None]],
    now: float,
) -> None:
    """Apply the sweep's findings to the entry (deterministic given it)."""
    if policy is not None and book.limits != policy.limits:
        book.set_limits(policy.limits, now=now)
    book.roll(now)
    for key, uid, last in repairs:
        if key:  # an expired hold: charge what its run committed, then drop it
            if last is not None:
                book.settle(uid, **committed_totals(last), now=now)
            hold = book.holds.get(key)
            if hold is not None and hold.expires <= now:
                del book.holds[key]
        if last is not None and last.phase.is_terminal:
            book.close(uid, **committed_totals(last), end=last.time or now, now=now)
        elif not key and last is None:  # the run is gone and left no events
            book.close(uid, turn=-1, tokens=0, cost_usd=Decimal(0), end=now, now=now)
