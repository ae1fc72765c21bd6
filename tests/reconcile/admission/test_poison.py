"""A poison queue head stops only itself: a run whose admission cannot succeed ends typed (its
ledger slot and hold released), the runs behind it are admitted, and its failure is logged
once; a failure that passes (the API server or NATS away) makes the queue wait instead.
Against the real nats-server's ledger."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from kube_support import FakeKube
from nats.aio.client import Client as NATS

from agentrun import kernel
from agentrun.bus import EventTooLarge
from agentrun.ledger import LedgerStore
from agentrun.operator.admission.pump import PumpDeps, QueuePump
from agentrun.operator.admission.queue import QueueBoard
from agentrun.operator.admission.queuestatus import QueueStatus
from agentrun.operator.admission.settlement import RunSettlement
from agentrun.operator.admission.storage import EventStorage
from agentrun.operator.platform.events import EventRecorder, Throttle
from agentrun.operator.platform.kubeapi import ApiError
from agentrun.operator.platform.spec import ObjectMeta
from agentrun.operator.runs import RunKey, RunObject
from agentrun.operator.tenants import TenantPolicy, Tenants
from agentrun.protocol import ModelConfig, RunConfig


class Runs:
    """The live runs (``LiveRuns``) and the status writer, recording what they are told."""

    def __init__(self, refuse: Callable[[RunConfig], Exception | None]) -> None:
        self.refuse = refuse
        self.started: list[str] = []
        self.bodies: dict[str, dict[str, Any]] = {}
        self.counted: list[kernel.Phase] = []

    async def start_run(self, config: RunConfig, *, start_time: float, generation: int) -> None:
        refused = self.refuse(config)
        if refused is not None:
            raise refused
        self.started.append(config.name)

    def count_end(self, uid: str, state: kernel.RunState, *, tenant: str) -> bool:
        self.counted.append(state.phase)
        return True

    def is_tracked(self, uid: str) -> bool:
        return False

    async def end(
        self, namespace: str, name: str, uid: str, phase: kernel.Phase, message: str
    ) -> bool:
        return False  # never started: no events to end

    def submit(self, key: RunKey, body: dict[str, Any], **kwargs: Any) -> None:
        self.bodies[key.name] = body
        on_end = kwargs.get("on_end")
        if on_end is not None:
            on_end()


class Configs:
    """Admission's ``RunConfigs``: a config per run, or what ``fail`` raises for it."""

    def __init__(self, fail: Callable[[str], Exception | None]) -> None:
        self.fail = fail

    def forget(self, uid: str) -> None:
        """Nothing is kept between builds here."""

    async def build_config(
        self,
        key: RunKey,
        spec: Any,
        policy: TenantPolicy,
        *,
        start_time: float,
        queued: bool = False,
    ) -> RunConfig:
        failure = self.fail(key.name)
        if failure is not None:
            raise failure
        return RunConfig(
            uid=key.uid,
            namespace=key.namespace,
            name=key.name,
            goal="g",
            instructions="",
            tools=(),
            limits=kernel.Limits(),
            model=ModelConfig("mock", "http://x", "scripted", kernel.Pricing(), 32000, 100),
            deadline=start_time + 600,
            tenant=policy.name,
            output_schema={"type": "object", "description": "x" * 5000},
        )

    def first_call_need(self, config: RunConfig) -> tuple[int, Decimal]:
        return 200, Decimal("0.001")


def tenant_object(name: str, **spec: Any) -> dict[str, Any]:
    """An AgentTenant ``name`` binding namespace ``ns`` (unless ``spec`` says otherwise), one
    run at a time, 10,000 tokens a window."""
    base = {"namespaces": ["ns"], "maxConcurrentRuns": 1, "budget": {"tokens": 10_000}}
    return {"metadata": {"name": name, "generation": 1}, "spec": {**base, **spec}}


def policy(name: str) -> TenantPolicy:
    return TenantPolicy.of(tenant_object(name))


def registry(api: FakeKube, *objects: dict[str, Any]) -> Tenants:
    """The operator's tenant registry, reading namespace labels from ``api``, knowing
    ``objects`` (AgentTenants)."""
    known = Tenants(api)  # type: ignore[arg-type]
    for obj in objects:
        known.put(obj)
    return known


async def make_pump(
    client: NATS,
    *,
    fail: Callable[[str], Exception | None] = lambda name: None,
    refuse: Callable[[RunConfig], Exception | None] = lambda config: None,
    api: FakeKube | None = None,
) -> tuple[QueuePump, Runs, LedgerStore, TenantPolicy]:
    store = await LedgerStore.open(client.jetstream())
    tenant = policy(f"t-{uuid.uuid4().hex[:8]}")
    runs, board, api = Runs(refuse), QueueBoard(), api or FakeKube()
    events = EventRecorder(api, throttle=Throttle(repeat_after=0, rate=1000, burst=1000))
    pump = QueuePump(
        PumpDeps(
            store=store,
            tenants=registry(api, tenant_object(tenant.name)),
            configs=Configs(fail),  # type: ignore[arg-type]
            runs=runs,
            shown=QueueStatus(runs, runs, events, time.time),
            settlement=RunSettlement(store, board),
            board=board,
            api=api,
            events=events,
            storage=EventStorage(limit=256 * 1024 * 1024),
        )
    )
    return pump, runs, store, tenant


async def enqueue(pump: QueuePump, tenant: TenantPolicy, *names: str) -> None:
    for index, name in enumerate(names):
        obj = RunObject(metadata=ObjectMeta(generation=1), spec={"model": "mock", "goal": "g"})
        key = RunKey("ns", name, f"{name}-{uuid.uuid4().hex[:6]}")
        await pump.enqueue_run(key, tenant, generation=1, created=1e9 + index, obj=obj)


async def test_a_head_that_fails_for_good_ends_checkpoint_failed_and_the_next_run_is_admitted(
    client: NATS, caplog: pytest.LogCaptureFixture
) -> None:
    pump, runs, store, tenant = await make_pump(
        client, fail=lambda name: ValueError("no config for you") if name == "poison" else None
    )
    await enqueue(pump, tenant, "poison", "next")
    with caplog.at_level(logging.DEBUG, logger="agentrun.operator.admission.pump"):
        await pump.pump_queue(tenant.name)  # first failure: it waits, the queue shows why
        assert runs.started == [] and runs.bodies["next"]["phase"] == "Queued"
        assert "AdmissionRetrying" in str(runs.bodies["poison"])
        await pump.pump_queue(tenant.name)  # second: it ends, and the run behind it goes
    assert runs.started == ["next"] and runs.counted == [kernel.Phase.CHECKPOINT_FAILED]
    ended = runs.bodies["poison"]
    assert ended["terminalReason"] == "checkpoint_failed"
    assert (
        "failed twice" in ended["message"] and "ValueError: no config for you" in ended["message"]
    )
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1 and "no config for you" in errors[0].getMessage()
    assert [q.name for q in await store.queue(tenant.name)] == []


async def test_a_transient_failure_makes_the_queue_wait_however_long_and_is_logged_once(
    client: NATS, caplog: pytest.LogCaptureFixture
) -> None:
    down = {"api": True}
    pump, runs, store, tenant = await make_pump(
        client, fail=lambda name: ApiError(503, "unavailable") if down["api"] else None
    )
    await enqueue(pump, tenant, "first", "second")
    with caplog.at_level(logging.DEBUG, logger="agentrun.operator.admission.pump"):
        for _ in range(5):
            await pump.pump_queue(tenant.name)
        assert runs.started == [] and runs.counted == []
        assert [q.name for q in await store.queue(tenant.name)] == ["first", "second"]
        down["api"] = False
        await pump.pump_queue(tenant.name)
    assert runs.started == ["first"]  # maxConcurrentRuns 1: the second waits for a slot
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert sum("HTTP 503" in m for m in logged) == 1, logged
    assert sum("recovered after 5 failed attempt(s)" in m for m in logged) == 1, logged


async def test_a_run_too_large_to_checkpoint_ends_invalid_spec_with_its_slot_and_hold_freed(
    client: NATS,
) -> None:
    pump, runs, store, tenant = await make_pump(
        client,
        refuse=lambda config: EventTooLarge(1_300_000, 1_044_480) if config.name == "big" else None,
    )
    await enqueue(pump, tenant, "big", "small")
    await pump.pump_queue(tenant.name)  # no retry: the same config would not fit again
    assert runs.started == ["small"] and runs.counted == [kernel.Phase.INVALID_SPEC]
    message = runs.bodies["big"]["message"]
    assert message.startswith("spec.output.schema: 5"), message
    assert "over the 1044480 bytes one event on the bus may hold" in message
    book = await store.read(tenant.name)
    assert book is not None and [a.name for a in book.active.values()] == ["small"]
    assert all(not key.startswith("big") for key in book.holds), book.holds
