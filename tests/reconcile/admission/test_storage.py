"""The per-tenant event storage bound: the bytes the events of a tenant's runs take, learned
from the runs' statuses (``status.usage.eventBytes``) as the AgentRun watch reports them, are
checked at admission. A tenant at its bound admits nothing (its queue head waits ``Queued``,
reason ``EventStorageFull``, naming the setting) until runs are deleted; then its next run is
admitted. The pump runs against the real ledger store on a real nats-server."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from kube_support import FakeKube
from nats.aio.client import Client as NATS

from agentrun import kernel
from agentrun.ledger import LedgerStore
from agentrun.operator.admission.pump import PumpDeps, QueuePump
from agentrun.operator.admission.queue import QueueBoard
from agentrun.operator.admission.queuestatus import QueueStatus
from agentrun.operator.admission.storage import EventStorage
from agentrun.operator.platform import events as recorder
from agentrun.operator.platform.events import EventRecorder
from agentrun.operator.runs import RunKey
from agentrun.operator.runs.spec import RunObject
from agentrun.operator.tenants import TenantPolicy, WaitReason
from agentrun.protocol import ModelConfig, RunConfig

from .test_poison import registry

TENANT = "storage"
LIMIT = 4096


def test_a_tenants_bytes_are_the_sum_of_its_runs_statuses_until_each_is_deleted() -> None:
    storage = EventStorage(limit=LIMIT)
    storage.observe("a", {"tenant": TENANT, "usage": {"eventBytes": 1000}})
    storage.observe("b", {"tenant": TENANT, "usage": {"eventBytes": 2000}})
    storage.observe("c", {"tenant": "other", "usage": {"eventBytes": 9000}})
    storage.observe("q", {"phase": "Pending"})  # no tenant yet: not counted
    assert (storage.used(TENANT), storage.used("other")) == (3000, 9000)
    storage.observe("a", {"tenant": TENANT, "usage": {"eventBytes": 1500}})  # a later status
    assert storage.used(TENANT) == 3500
    assert storage.wait(TENANT) is None
    storage.observe("b", {"tenant": TENANT, "usage": {"eventBytes": LIMIT}})
    wait = storage.wait(TENANT)
    assert wait is not None and wait.reason is WaitReason.EVENT_STORAGE_FULL
    assert f"take {1500 + LIMIT} bytes, at its limit of {LIMIT}" in wait.message
    assert "AGENTRUN_TENANT_EVENT_MAX_BYTES" in wait.message
    assert storage.wait("other") is not None  # 9000 > LIMIT: every tenant has its own count
    storage.forget("b")
    storage.forget("b")  # a second DELETED (relist) changes nothing
    assert storage.used(TENANT) == 1500
    assert storage.wait(TENANT) is None


STORAGE_OPS = st.lists(
    st.tuples(
        st.sampled_from(["observe", "forget"]),
        st.sampled_from(["r0", "r1", "r2", "r3"]),
        st.sampled_from(["", "a", "b"]),
        st.sampled_from([0, 1, 700, LIMIT]),
    ),
    max_size=50,
)


@settings(max_examples=300, deadline=None)
@given(STORAGE_OPS)
def test_any_order_of_statuses_and_deletions_keeps_each_tenants_bytes_the_sum_of_its_runs(
    ops: list[tuple[str, str, str, int]],
) -> None:
    """Whatever the order of statuses (a run's bytes growing, its tenant changing, a status
    naming no tenant yet) and deletions (repeated too): each tenant's count is the sum of its
    runs' last counted statuses, and the storage waits exactly at its limit."""
    storage, model = EventStorage(limit=LIMIT), {}
    for op, uid, tenant, size in ops:
        if op == "observe":
            status = {"usage": {"eventBytes": size}, **({"tenant": tenant} if tenant else {})}
            storage.observe(uid, status)
            if tenant:
                model[uid] = (tenant, size)
        else:
            storage.forget(uid)
            model.pop(uid, None)
        for name in ("a", "b"):
            used = sum(size for owner, size in model.values() if owner == name)
            assert storage.used(name) == used
            assert (storage.wait(name) is None) == (used < LIMIT)


class Writes:
    """The status writer and the live runs, recording what they are told."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.started: list[str] = []

    def submit(
        self,
        key: RunKey,
        body: dict[str, Any],
        *,
        seq: int,
        terminal: bool,
        on_end: Callable[[], None] | None = None,
    ) -> None:
        self.bodies.append(body)

    def count_end(self, uid: str, state: kernel.RunState, *, tenant: str) -> bool:
        raise AssertionError(f"no run ends here: {uid} {state.phase}")

    async def start_run(self, config: RunConfig, *, start_time: float, generation: int) -> None:
        self.started.append(config.uid)


class Configs:
    """Builds the run's config without its AgentModel (the pump's storage check comes after
    the build and before the first call's need is held)."""

    def forget(self, uid: str) -> None:
        """Nothing is kept between builds here."""

    async def build_config(
        self,
        key: RunKey,
        spec: dict[str, Any],
        policy: TenantPolicy,
        *,
        start_time: float,
        queued: bool = False,
    ) -> RunConfig:
        model = ModelConfig(
            "mock", "http://127.0.0.1:9/v1", "scripted", kernel.Pricing(), 32000, 1000
        )
        return RunConfig(
            uid=key.uid,
            namespace=key.namespace,
            name=key.name,
            goal=str(spec["goal"]),
            instructions="",
            tools=(),
            limits=kernel.Limits(),
            model=model,
            deadline=start_time + 60,
            tenant=policy.name,
        )

    def first_call_need(self, config: RunConfig) -> tuple[int, Decimal]:
        return (100, Decimal("0.01"))


async def test_a_tenant_at_its_storage_bound_admits_its_next_run_only_once_runs_are_deleted(
    client: NATS,
) -> None:
    store = await LedgerStore.open(client.jetstream(), bucket="AGENTRUN_LEDGER_STORAGE_TEST")
    obj = {
        "metadata": {"name": TENANT, "generation": 1},
        "spec": {
            "namespaces": ["ns"],
            "window": "24h",
            "budget": {"tokens": 1_000_000, "costUSD": "100.00"},
        },
    }
    policy = TenantPolicy.of(obj)
    writes = Writes()
    api = FakeKube()
    events = EventRecorder(api, throttle=recorder.standard_throttle())
    storage = EventStorage(limit=LIMIT)
    board = QueueBoard()
    deps: Any = dict(tenants=registry(api, obj), configs=Configs(), settlement=None)
    pump = QueuePump(
        PumpDeps(
            store=store,
            runs=writes,  # type: ignore[arg-type]
            shown=QueueStatus(writes, writes, events, time.time),  # type: ignore[arg-type]
            board=board,
            events=events,
            api=api,
            storage=storage,
            **deps,
        )
    )
    storage.observe("finished", {"tenant": TENANT, "usage": {"eventBytes": LIMIT + 1}})
    uid = str(uuid.uuid4())
    key = RunKey("ns", "next", uid)
    obj = RunObject.of(
        {
            "metadata": {"name": "next", "namespace": "ns", "uid": uid, "generation": 1},
            "spec": {"model": "mock", "goal": "hello"},
        }
    )
    await pump.enqueue_run(key, policy, generation=1, created=time.time(), obj=obj)
    await pump.pump_queue(TENANT)
    assert writes.started == []
    blocked = board.blocked(TENANT)
    assert blocked is not None and blocked.reason is WaitReason.EVENT_STORAGE_FULL
    assert [r.uid for r in await store.queue(TENANT)] == [uid]
    shown = writes.bodies[-1]
    assert shown["phase"] == "Queued" and shown["queuePosition"] == 1
    assert "EventStorageFull" in str(shown) and "AGENTRUN_TENANT_EVENT_MAX_BYTES" in str(shown)

    storage.forget("finished")  # deleted: its events were purged
    await pump.pump_queue(TENANT)
    assert writes.started == [uid]
    assert board.blocked(TENANT) is None
    assert await store.queue(TENANT) == []
