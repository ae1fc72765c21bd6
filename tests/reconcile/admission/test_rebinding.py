"""A run not yet admitted belongs to the tenant its namespace binds now: when an AgentTenant is
deleted, made or edited, or the namespace relabelled, a queued run moves to the tenant that
binds its namespace now (admitted and charged there, by creation time among its runs), or ends
as a new run there would when none does; a run already admitted stays charged to the tenant
that admitted it. The rules alone (pure), then the pump against the real nats-server's
ledger and the real tenant registry."""

from __future__ import annotations

import time
import types
import uuid
from typing import Any

import kopf
import pytest
from kube_support import FakeKube
from nats.aio.client import Client as NATS

from agentrun import kernel
from agentrun.ledger import LedgerStore, QueuedRun
from agentrun.operator.admission import rebinding
from agentrun.operator.admission.pump import PumpDeps, QueuePump
from agentrun.operator.admission.queue import QueueBoard
from agentrun.operator.admission.queuestatus import QueueStatus
from agentrun.operator.admission.settlement import RunSettlement
from agentrun.operator.admission.storage import EventStorage
from agentrun.operator.handlers import admission as handlers
from agentrun.operator.platform.events import EventRecorder, Throttle
from agentrun.operator.platform.shards import ALL_OF_ONE, Ownership, RunShards, shard_of
from agentrun.operator.platform.spec import ObjectMeta
from agentrun.operator.runs import RunKey, RunObject, recovery
from agentrun.operator.runs.handled import HandledActions
from agentrun.operator.tenants import NoTenant, Tenants

from .test_poison import Configs, Runs, registry

# --- the rules ------------------------------------------------------------------------------

FATES = {
    "bound to the tenant it waits in: it stays": ("a", rebinding.Bound("a"), False, None),
    "bound to another tenant: it moves there": (
        "a",
        rebinding.Bound("b"),
        False,
        rebinding.Bound("b"),
    ),
    "bound to none: it ends as a new run there": (
        "a",
        rebinding.Unbound("no tenant"),
        False,
        rebinding.Unbound("no tenant"),
    ),
    "bound to none while its own tenant is invalid or deleted: it waits for it": (
        "a",
        rebinding.Unbound("a is invalid"),
        True,
        None,
    ),
    "its own tenant invalid or deleted, another binds it: it moves": (
        "a",
        rebinding.Bound("b"),
        True,
        rebinding.Bound("b"),
    ),
    "its namespace unreadable: it stays": ("a", rebinding.Unknown(), False, None),
    "falls to the default tenant: it moves there": (
        "a",
        rebinding.Bound("d", fallback=True),
        False,
        rebinding.Bound("d", fallback=True),
    ),
    "falls to the default tenant while its own was deleted lately: it waits": (
        "a",
        rebinding.Bound("d", fallback=True),
        True,
        None,
    ),
}


@pytest.mark.parametrize(("queued_in", "binding", "kept", "expected"), FATES.values(), ids=FATES)
def test_a_queued_runs_fate_follows_what_its_namespace_binds_now(
    queued_in: str, binding: rebinding.Binding, kept: bool, expected: rebinding.Fate | None
) -> None:
    assert rebinding.fate(queued_in, binding, waits=kept) == expected


def test_only_the_runs_that_leave_are_listed_head_first_an_unlooked_namespace_staying() -> None:
    queue = [QueuedRun(f"u{i}", ns, f"r{i}", float(i)) for i, ns in enumerate("xyzx")]
    found = {"x": rebinding.Bound("b"), "y": rebinding.Bound("a")}
    fates = rebinding.fates("a", queue, found, waits=False)
    assert [(run.name, fate) for run, fate in fates] == [
        ("r0", rebinding.Bound("b")),
        ("r3", rebinding.Bound("b")),
    ]
    assert rebinding.namespaces(queue) == ["x", "y", "z"]


DUE = {
    "never looked at": (None, 0, 0.0, True),
    "looked at just now, no binding changed": (rebinding.Checked(3, 100.0), 3, 101.0, False),
    "a binding changed since": (rebinding.Checked(3, 100.0), 4, 101.0, True),
    "the recheck interval passed (a relabel)": (
        rebinding.Checked(3, 100.0),
        3,
        100.0 + rebinding.RECHECK_EVERY,
        True,
    ),
}


@pytest.mark.parametrize(("last", "bindings", "now", "expected"), DUE.values(), ids=DUE)
def test_a_queues_namespaces_are_looked_at_again_after_a_binding_change_or_a_while(
    last: rebinding.Checked | None, bindings: int, now: float, expected: bool
) -> None:
    assert rebinding.due(last, bindings=bindings, now=now) is expected


GRACE = {
    "its grace ended after the last look: a look": (rebinding.Checked(3, 100.0), 110.0, True),
    "its grace not ended yet": (rebinding.Checked(3, 100.0), 111.0, False),
    "looked at since its grace ended": (rebinding.Checked(3, 110.0), 110.0, False),
}


@pytest.mark.parametrize(("last", "grace_ends", "expected"), GRACE.values(), ids=GRACE)
def test_a_deleted_tenants_queue_is_looked_at_again_when_its_grace_ends(
    last: rebinding.Checked, grace_ends: float, expected: bool
) -> None:
    assert rebinding.due(last, bindings=3, now=110.0, grace_ends=grace_ends) is expected


def test_a_tenant_is_deleted_lately_for_the_grace_from_the_look_that_found_it_gone() -> None:
    grace = rebinding.DELETED_GRACE
    assert rebinding.deleted_lately(100.0, now=100.0 + grace - 0.001)
    assert not rebinding.deleted_lately(100.0, now=100.0 + grace)
    assert not rebinding.deleted_lately(None, now=100.0)


# --- the pump -------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def tenant(name: str, **spec: Any) -> dict[str, Any]:
    """AgentTenant ``name``: one run at a time, 10,000 tokens, binding what ``spec`` says."""
    base = {"maxConcurrentRuns": 1, "budget": {"tokens": 10_000}}
    return {"metadata": {"name": name, "generation": 1}, "spec": {**base, **spec}}


def selecting(name: str, team: str) -> dict[str, Any]:
    return tenant(name, namespaceSelector={"matchLabels": {"team": team}})


class World:
    """A pump over a fresh ledger, the real tenant registry and namespace ``ns``; the
    AgentTenants it is given are named with ``-tag`` added (the ledger bucket is the
    session's)."""

    def __init__(self, client: NATS, *tenants: dict[str, Any]) -> None:
        self.client, self.api, self.clock = client, FakeKube(), Clock()
        self.tag = uuid.uuid4().hex[:6]
        self.tenants: Tenants = registry(self.api, *rename(tenants, self.tag))
        self.runs = Runs(lambda config: None)
        self.configs: Any = Configs(lambda name: None)
        """Admission's ``RunConfigs`` (a stub building every run's config, unless replaced)."""

    async def start(self) -> QueuePump:
        self.store = await LedgerStore.open(self.client.jetstream())
        board = QueueBoard()
        events = EventRecorder(self.api, throttle=Throttle(repeat_after=0, rate=1000, burst=1000))
        self.pump = QueuePump(
            PumpDeps(
                store=self.store,
                tenants=self.tenants,
                configs=self.configs,
                runs=self.runs,
                shown=QueueStatus(self.runs, self.runs, events, self.clock),
                settlement=RunSettlement(self.store, board),
                board=board,
                api=self.api,
                events=events,
                storage=EventStorage(limit=256 * 1024 * 1024),
                clock=self.clock,
            )
        )
        return self.pump

    async def resume(self, name: str, status: dict[str, Any], *, model: str = "mock") -> None:
        """kopf's resume of run ``name`` of ``ns`` after a restart, through the create
        handler, its object's status ``status``."""
        handling = types.SimpleNamespace(
            tenants=self.tenants,
            shown=self.pump.shown,
            pump=self.pump,
            configs=self.configs,
            ownership=ALL_OF_ONE,
            api=self.api,
        )
        await handlers._validate_and_enqueue(
            handling,  # type: ignore[arg-type]
            RunKey("ns", name, f"{name}-{self.tag}"),
            spec={"model": model, "goal": "g"},  # type: ignore[arg-type]
            meta=kopf.Body({"metadata": {"generation": 1, "name": name}}).meta,
            status=status,
        )

    def name(self, short: str) -> str:
        """A tenant's name unique to this test (the ledger bucket is the session's)."""
        return f"{short}-{self.tag}"

    async def enqueue(
        self, short: str, name: str, *, created: float, namespace: str = "ns"
    ) -> None:
        """Queue run ``name`` of ``namespace`` in tenant ``short``, as admission does."""
        obj = RunObject(metadata=ObjectMeta(generation=1), spec={"model": "mock", "goal": "g"})
        key = RunKey(namespace, name, f"{name}-{self.tag}")
        policy = self.tenants.policies[self.name(short)]
        await self.pump.enqueue_run(key, policy, generation=1, created=created, obj=obj)

    async def queued(self, short: str) -> list[str]:
        return [q.name for q in await self.store.queue(self.name(short))]

    async def charged(self, short: str) -> list[str]:
        """The runs holding a slot in tenant ``short``'s ledger book."""
        book = await self.store.read(self.name(short))
        return [] if book is None else sorted(a.name for a in book.active.values())


def rename(objects: tuple[dict[str, Any], ...], tag: str) -> list[dict[str, Any]]:
    """``objects`` (AgentTenants) with ``-tag`` added to their names."""
    return [
        {**o, "metadata": {**o["metadata"], "name": f"{o['metadata']['name']}-{tag}"}}
        for o in objects
    ]


async def queued_in_a(client: NATS, *others: dict[str, Any]) -> World:
    """Tenant ``a`` lists ``ns`` by name and runs ``r1`` (admitted) while ``r2`` waits in its
    queue; ``others`` (AgentTenants, named without the test's tag) are known too."""
    world = World(client, tenant("a", namespaces=["ns"]), *others)
    await world.start()
    await world.enqueue("a", "r1", created=1e9)
    await world.enqueue("a", "r2", created=1e9 + 1)
    await world.pump.pump_queue(world.name("a"))
    assert world.runs.started == ["r1"] and await world.queued("a") == ["r2"]
    assert world.runs.bodies["r2"]["tenant"] == world.name("a")
    return world


async def a_deleted(client: NATS, *others: dict[str, Any]) -> World:
    """``queued_in_a``, then ``ns`` labelled ``team: x`` and ``a`` deleted."""
    world = await queued_in_a(client, *others)
    world.api.labels["ns"] = {"team": "x"}
    world.tenants.remove(world.name("a"))
    return world


async def test_a_run_queued_in_a_deleted_tenant_is_admitted_and_charged_by_the_one_binding_it_now(
    client: NATS,
) -> None:
    world = await a_deleted(client, selecting("b", "x"))
    await world.pump.pump_queue(world.name("a"))
    assert await world.queued("a") == [] and await world.queued("b") == ["r2"]
    assert world.pump.board.queued(world.name("a")) == 0
    await world.pump.pump_queue(world.name("b"))
    assert world.runs.started == ["r1", "r2"] and await world.queued("b") == []
    assert await world.charged("b") == ["r2"]
    assert await world.charged("a") == ["r1"]  # admitted before: still charged where it was


async def test_a_run_whose_namespace_binds_no_tenant_now_ends_as_a_new_run_there_would(
    client: NATS,
) -> None:
    world = await queued_in_a(client)
    world.tenants.put(rename((tenant("a", namespaces=["elsewhere"]),), world.tag)[0])
    with pytest.raises(NoTenant) as new_run:  # what the admission of a new run there meets
        await world.tenants.resolve("ns")
    await world.pump.pump_queue(world.name("a"))  # it may be applied again: r2 waits a while
    world.clock.now += rebinding.DELETED_GRACE
    await world.pump.pump_queue(world.name("a"))
    ended = world.runs.bodies["r2"]
    assert ended["terminalReason"] == "invalid_spec" and ended["message"] == str(new_run.value)
    assert "tenant" not in ended  # charged to no tenant, as a rejected new run
    assert world.runs.counted == [kernel.Phase.INVALID_SPEC]
    assert await world.queued("a") == [] and await world.charged("a") == ["r1"]


async def test_a_tenant_deleted_and_applied_again_keeps_its_queued_runs(client: NATS) -> None:
    """A delete then a create of the same AgentTenant (Argo CD's Replace with Force, ``kubectl
    replace --force``): the pass the deletion kicks, between the two, leaves its queued runs
    waiting (``TenantMissing``), and the tenant applied again admits them; they end only
    once the tenant has stayed deleted ``rebinding.DELETED_GRACE`` seconds."""
    world = await queued_in_a(client)
    a = world.tenants.policies[world.name("a")]
    world.tenants.remove(a.name)
    world.clock.now += 2  # positions are refreshed at most once a second
    await world.pump.pump_queue(a.name)  # the pass the deletion kicked
    assert await world.queued("a") == ["r2"]
    assert world.runs.bodies["r2"]["conditions"][0]["reason"] == "TenantMissing"
    world.tenants.put(tenant(a.name, namespaces=["ns"]))  # applied again
    await world.store.free_run(a.name, f"r1-{world.tag}")  # r1 ended: r2's turn
    await world.pump.pump_queue(a.name)
    assert world.runs.started == ["r1", "r2"] and await world.charged("a") == ["r2"]
    assert "terminalReason" not in world.runs.bodies["r2"]


async def test_a_tenant_replaced_keeps_its_queued_runs_from_the_default_tenant(
    client: NATS,
) -> None:
    """With a default tenant, the pass between the delete and the create moved the queued runs
    to the default tenant's queue (charged to its budget, under its policy)."""
    world = await queued_in_a(client, tenant("d", namespaces=["elsewhere"]))
    world.tenants.default = default = world.name("d")
    assert (await world.tenants.resolve("other")).name == default  # what it binds: no one
    world.tenants.remove(world.name("a"))
    await world.pump.pump_queue(world.name("a"))
    assert await world.queued("a") == ["r2"] and await world.queued("d") == []
    world.clock.now += rebinding.DELETED_GRACE  # not applied again: the default tenant's now
    await world.pump.pump_queue(world.name("a"))
    assert await world.queued("a") == [] and await world.queued("d") == ["r2"]


async def test_a_resumed_run_of_a_deleted_tenants_queue_does_not_fall_to_the_default_at_once(
    client: NATS,
) -> None:
    """An operator restarted between the delete and the create: kopf's resume of the queued
    run left it to its old queue's grace, as the pass does, not queued it in the default
    tenant's queue at once."""
    world = await queued_in_a(client, tenant("d", namespaces=["elsewhere"]))
    world.tenants.default = world.name("d")
    world.tenants.remove(world.name("a"))
    await world.start()  # a new process: the queue read again from the ledger
    meta = {"name": "r2", "namespace": "ns", "uid": f"r2-{world.tag}", "generation": 1}
    world.api.put("agentruns", {"metadata": meta, "spec": {"model": "mock", "goal": "g"}})
    await world.resume("r2", {"tenant": world.name("a"), "phase": "Queued"})
    assert await world.queued("a") == ["r2"] and await world.queued("d") == []
    world.tenants.put(tenant(world.name("a"), namespaces=["ns"], maxConcurrentRuns=2))
    await world.pump.pump_queue(world.name("a"))
    assert world.runs.started == ["r1", "r2"] and await world.charged("a") == ["r1", "r2"]


async def test_a_tenant_left_deleted_ends_its_queued_runs_after_the_grace(client: NATS) -> None:
    world = await queued_in_a(client)
    world.tenants.remove(world.name("a"))
    await world.pump.pump_queue(world.name("a"))
    world.clock.now += rebinding.DELETED_GRACE - 1
    world.tenants.put(tenant(world.name("z"), namespaces=["nz"]))  # a binding changed: a look
    await world.pump.pump_queue(world.name("a"))
    assert await world.queued("a") == ["r2"]
    world.clock.now += 1
    await world.pump.pump_queue(world.name("a"))
    assert await world.queued("a") == []
    assert world.runs.bodies["r2"]["terminalReason"] == "invalid_spec"


async def test_a_resumed_run_of_a_deleted_tenants_queue_stays_there_for_it(client: NATS) -> None:
    """After an operator restart kopf resumes every queued run, as new: one waiting in the
    queue of an AgentTenant deleted since, its namespace bound by none, stays there
    (``TenantMissing``) as the queue's passes keep it, and is admitted once the tenant is
    made again; a run whose status names that tenant but whose queue does not hold it ends
    as a new run there (``invalid_spec``)."""
    world = await a_deleted(client)
    await world.start()  # a new process: the queue read again from the ledger
    meta = {"name": "r2", "namespace": "ns", "uid": f"r2-{world.tag}", "generation": 1}
    world.api.put("agentruns", {"metadata": meta, "spec": {"model": "mock", "goal": "g"}})
    status = {"tenant": world.name("a"), "phase": "Queued"}
    for name in ("r2", "r3"):
        await world.resume(name, status)
    assert "terminalReason" not in world.runs.bodies["r2"]
    assert world.runs.bodies["r3"]["terminalReason"] == "invalid_spec"
    world.clock.now += 2  # positions are refreshed at most once a second
    await world.pump.pump_queue(world.name("a"))
    assert await world.queued("a") == ["r2"]
    assert world.runs.bodies["r2"]["conditions"][0]["reason"] == "TenantMissing"
    again = tenant("a", namespaces=["ns"], maxConcurrentRuns=2)  # r1 still holds a slot
    world.tenants.put(rename((again,), world.tag)[0])
    await world.pump.pump_queue(world.name("a"))
    assert world.runs.started == ["r1", "r2"] and await world.charged("a") == ["r1", "r2"]


async def test_a_run_left_waiting_tenant_missing_is_admitted_by_a_tenant_made_later(
    client: NATS,
) -> None:
    world = await a_deleted(client, selecting("c", "other"))
    world.api.fail("namespace_labels", 503)  # what ns binds cannot be told at that pass
    world.clock.now += 2  # positions are refreshed at most once a second
    await world.pump.pump_queue(world.name("a"))
    assert await world.queued("a") == ["r2"]
    assert world.runs.bodies["r2"]["conditions"][0]["reason"] == "TenantMissing"
    world.tenants.put(selecting(world.name("b"), "x"))
    await world.pump.pump_queue(world.name("a"))
    await world.pump.pump_queue(world.name("b"))
    assert world.runs.started == ["r1", "r2"] and await world.charged("b") == ["r2"]
    assert await world.queued("a") == [] and await world.queued("b") == []


async def test_a_relabelled_namespaces_queued_run_moves_by_creation_time_and_is_charged_there(
    client: NATS,
) -> None:
    world = World(client, selecting("a", "a"), selecting("b", "b"))
    tag = world.tag
    world.api.labels.update(ns={"team": "a"}, nb={"team": "b"})
    await world.start()
    await world.enqueue("a", "r1", created=1e9)
    await world.enqueue("a", "r2", created=1e9 + 1)
    await world.pump.pump_queue(world.name("a"))
    await world.enqueue("b", "b1", created=1e9 - 5, namespace="nb")  # b's own: one runs
    await world.enqueue("b", "b2", created=1e9 + 5, namespace="nb")  # and one waits
    await world.pump.pump_queue(world.name("b"))
    world.api.labels["ns"] = {"team": "b"}
    await world.pump.pump_queue(world.name("a"))  # no watch saw it, and ns was just looked at
    assert await world.queued("a") == ["r2"]
    world.clock.now += rebinding.RECHECK_EVERY
    await world.pump.pump_queue(world.name("a"))
    assert await world.queued("a") == [] and await world.queued("b") == ["r2", "b2"]
    await world.pump.pump_queue(world.name("b"))
    shown = world.runs.bodies["r2"]
    assert (shown["tenant"], shown["queuePosition"]) == (world.name("b"), 1)
    assert shown["conditions"][0]["reason"] == "ConcurrencyLimit"
    assert world.pump.board.queued(world.name("b")) == 2
    await world.store.free_run(world.name("b"), f"b1-{tag}")  # b1 ended: r2's turn, in b
    await world.pump.pump_queue(world.name("b"))
    assert world.runs.started == ["r1", "b1", "r2"]
    assert await world.charged("b") == ["r2"] and await world.charged("a") == ["r1"]


async def test_a_relabel_a_new_run_meets_moves_the_queued_runs_at_the_next_pass(
    client: NATS,
) -> None:
    world = World(client, selecting("a", "a"), selecting("b", "b"))
    world.api.labels["ns"] = {"team": "a"}
    await world.start()
    await world.enqueue("a", "r1", created=1e9)
    await world.enqueue("a", "r2", created=1e9 + 1)
    await world.pump.pump_queue(world.name("a"))
    world.api.labels["ns"] = {"team": "b"}
    assert (await world.tenants.resolve("ns")).name == world.name("b")  # a new run's admission
    await world.pump.pump_queue(world.name("a"))
    assert await world.queued("a") == [] and await world.queued("b") == ["r2"]


async def test_a_run_queued_in_a_tenant_deleted_since_its_namespace_was_resolved_moves_at_once(
    client: NATS,
) -> None:
    world = await queued_in_a(client, selecting("b", "x"))
    resolved = world.tenants.policies[world.name("a")]  # by r3's admission, before a went
    world.api.labels["ns"] = {"team": "x"}
    world.tenants.remove(world.name("a"))
    await world.pump.pump_queue(world.name("a"))  # the deletion's pass: r2 moved
    obj = RunObject(metadata=ObjectMeta(generation=1), spec={"model": "mock", "goal": "g"})
    key = RunKey("ns", "r3", f"r3-{world.tag}")
    await world.pump.enqueue_run(key, resolved, generation=1, created=1e9 + 2, obj=obj)
    await world.pump.pump_queue(world.name("a"))
    assert await world.queued("a") == [] and await world.queued("b") == ["r2", "r3"]


async def test_a_moved_run_cancelled_by_a_status_naming_its_old_tenant_leaves_its_new_queue(
    client: NATS,
) -> None:
    world = await a_deleted(client, selecting("b", "x"))
    world.api.labels["nb"] = {"team": "x"}
    await world.enqueue("b", "b1", created=1e9 - 5, namespace="nb")  # takes b's one slot
    await world.pump.pump_queue(world.name("b"))
    await world.pump.pump_queue(world.name("a"))
    assert await world.queued("b") == ["r2"]
    key = RunKey("ns", "r2", f"r2-{world.tag}")
    assert await world.pump.cancel_queued(key, world.name("a"))  # what its status said
    assert world.runs.bodies["r2"]["terminalReason"] == "cancelled"
    assert await world.queued("b") == [] and "r2" not in world.runs.started


async def test_a_run_whose_namespace_binds_another_shards_tenant_now_is_handed_to_that_shard(
    client: NATS,
) -> None:
    """Its tenant deleted, ``ns`` binds ``b``, of another operator shard: the run leaves ``a``'s
    queue, and its status is one the owner of ``b``'s shard takes for a new run of ``b``'s
    that no process handled (its kopf admits it). Before, it stayed in ``a``'s queue,
    ``TenantMissing`` for ever: no process queued it (``b``'s owner never looks at ``a``'s
    queue, and ``a``'s owner kept it for the status naming ``a``)."""
    world = await a_deleted(client, selecting("b", "x"))
    a, b = world.name("a"), world.name("b")
    shards = next(n for n in range(2, 64) if shard_of(a, n) != shard_of(b, n))
    world.pump.ownership = mine = Ownership(shards=shards, owned=frozenset({shard_of(a, shards)}))
    queued = dict(world.runs.bodies["r2"])
    await world.pump.pump_queue(a)
    assert await world.queued("a") == [] and await world.queued("b") == []
    patch = world.runs.bodies["r2"]
    status = {k: v for k, v in {**queued, **patch}.items() if v is not None}  # merged
    assert "phase" not in status and "queuePosition" not in status and status["tenant"] == b
    assert status["conditions"][0]["reason"] == "TenantChanged"
    uid = f"r2-{world.tag}"
    body = {"kind": "AgentRun", "metadata": {"uid": uid}, "status": status}
    theirs = Ownership(shards=shards, owned=frozenset({shard_of(b, shards)}))
    assert RunShards(theirs).owns(body) and not RunShards(mine).owns(body)
    assert HandledActions().last(uid, status=status, annotations={}) is None  # a creation
    decided = recovery.decide(uid=uid, annotations={}, status=status, has_events=False)
    assert decided is recovery.Admission.ADMIT
