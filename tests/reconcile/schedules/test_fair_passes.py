"""Schedules due are reconciled a few at a time, one tenant's after another's in turn (the
namespaces inside a tenant in turn too; a namespace no tenant binds is a share of its own),
each taken as a place frees: a namespace's thousands of schedules due every second, whose runs
never end, delay another namespace's every-second schedule by a few reconciles, not by a whole
pass of theirs; a tenant spanning five namespaces takes the turns of a tenant in one.

The fake store answers each API call after 5 ms (a busy API server answers a label-selected
list no faster).
"""

from __future__ import annotations

import asyncio
import collections
import copy
import time
from collections.abc import Callable, Mapping
from typing import Any

from kube_support import FakeKube

from agentrun.operator.platform.events import EventRecorder, Throttle
from agentrun.operator.schedules import controller as schedules
from agentrun.operator.schedules.spec import CRON_LABEL, SCHEDULED_ANNOTATION
from agentrun.operator.schedules.turns import Turns

LATENCY = 0.005
WINDOW = 6
"""Seconds the victim's every-second schedule is watched."""
ATTACKER_CRONS = 1500
"""Every-second schedules of one namespace, each with a run that never ends (``Forbid``): in
passes over all those due together, a pass took about 5 s here, and another namespace's
every-second schedule due a moment after a pass began waited for all of it (2 runs in 12 s)."""


class SlowStore:
    """``CronStore`` over every namespace, each call answered after ``LATENCY``."""

    def __init__(self) -> None:
        self.runs: dict[tuple[str, str], dict[str, Any]] = {}
        self.created: list[tuple[str, str, float]] = []
        """(namespace, name, when created: time.time())."""
        self.reconciles: collections.Counter[str] = collections.Counter()
        """Reconciles (each lists its schedule's runs once) by namespace."""

    async def list_runs(self, namespace: str, cron: str) -> list[dict[str, Any]]:
        self.reconciles[namespace] += 1
        await asyncio.sleep(LATENCY)
        return [
            copy.deepcopy(r)
            for (ns, _), r in self.runs.items()
            if ns == namespace and r["metadata"]["labels"].get(CRON_LABEL) == cron
        ]

    async def create_run(self, manifest: Mapping[str, Any]) -> bool:
        await asyncio.sleep(LATENCY)
        meta = manifest["metadata"]
        key = (meta["namespace"], meta["name"])
        if key in self.runs:
            return False
        run = copy.deepcopy(dict(manifest))
        run["metadata"]["uid"] = f"uid-{key}"
        self.runs[key] = run
        self.created.append((*key, time.time()))
        return True

    async def cancel_run(self, namespace: str, name: str) -> None:
        await asyncio.sleep(LATENCY)

    async def delete_run(self, namespace: str, name: str) -> None:
        await asyncio.sleep(LATENCY)
        self.runs.pop((namespace, name), None)

    async def release_run(self, namespace: str, name: str, uid: str) -> None:
        pass

    async def patch_status(self, cron: Mapping[str, Any], body: Mapping[str, Any]) -> bool:
        await asyncio.sleep(LATENCY)
        return True


def cron(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{namespace}-{name}",
            "generation": 1,
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {
            "schedule": "* * * * * *",
            "runTemplate": {"spec": {"agentRef": {"name": "bot"}, "goal": "report"}},
            **spec,
        },
    }


def stuck(
    store: SlowStore, controller: schedules.ScheduleController, namespace: str, name: str
) -> None:
    """An every-second ``Forbid`` schedule whose one run waits Queued for ever (the tenant's
    ``maxConcurrentRuns``): due every second, it creates nothing."""
    body = cron(namespace, name, concurrencyPolicy="Forbid")
    body["status"] = {"lastScheduleTime": "2026-01-01T00:00:00Z"}
    controller.observe(body)
    store.runs[(namespace, f"{name}-1")] = {
        "metadata": {
            "name": f"{name}-1",
            "namespace": namespace,
            "uid": f"run-{namespace}-{name}",
            "labels": {CRON_LABEL: name},
            "annotations": {SCHEDULED_ANNOTATION: "2026-01-01T00:00:01Z"},
            "ownerReferences": [
                {"uid": f"uid-{namespace}-{name}", "controller": True, "kind": "CronAgentRun"}
            ],
        },
        "status": {"phase": "Queued"},
    }


def controller_of(store: SlowStore, **kwargs: Any) -> schedules.ScheduleController:
    events = EventRecorder(FakeKube(), throttle=Throttle(repeat_after=60, rate=2, burst=25))
    return schedules.ScheduleController(store, events=events, **kwargs)


async def run_for(controller: schedules.ScheduleController, seconds: float) -> None:
    task = asyncio.create_task(controller.run())
    try:
        await asyncio.sleep(seconds)
    finally:
        controller.stop()
        task.cancel()


async def test_an_every_second_schedule_keeps_time_beside_another_namespaces_hundreds() -> None:
    store = SlowStore()
    controller = controller_of(store)
    now = time.time()
    for i in range(ATTACKER_CRONS):
        stuck(store, controller, "a-team", f"spam-{i}")
    victim = cron("z-team", "report", successfulRunsHistoryLimit=100, failedRunsHistoryLimit=100)
    victim["metadata"]["creationTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    controller.observe(victim)
    await run_for(controller, WINDOW)
    mine = [(name, at) for ns, name, at in store.created if ns == "z-team"]
    lateness = [at - int(name.rsplit("-", 1)[1]) for name, at in mine]
    # every second has a schedule time: a run for (almost) each, started within a second
    assert len(mine) >= WINDOW - 1 and max(lateness) < 1.0, (
        f"z-team's every-second schedule got {len(mine)} runs in {WINDOW} s, started "
        f"{', '.join(f'{x:.1f}' for x in lateness)} s late, behind a-team's "
        f"{ATTACKER_CRONS} schedules"
    )


def test_due_schedules_take_turns_by_namespace() -> None:
    turns = Turns()
    turns.add(sorted({("a", "1"), ("a", "2"), ("a", "3"), ("b", "1"), ("c", "1"), ("c", "2")}))
    assert [turns.take(), turns.take()] == [("a", "1"), ("b", "1")]
    turns.add([("b", "2"), ("a", "2"), ("d", "1")])  # a waiting one keeps its place
    assert len(turns) == 6 and ("b", "2") in turns and ("b", "1") not in turns
    taken = [turns.take() for _ in range(7)]
    assert taken == [
        ("c", "1"), ("a", "2"), ("b", "2"), ("d", "1"), ("c", "2"), ("a", "3"), None
    ]  # fmt: skip


def tenant_a(namespace: str) -> str:
    """``Tenants.party`` where AgentTenant ``a`` binds every ``a-*`` namespace."""
    return "tenant/a" if namespace.startswith("a-") else namespace


def a_spread_over(namespaces: int, crons: int = 300) -> Turns:
    """Tenant a's ``crons`` schedules due, spread over ``namespaces`` of its namespaces."""
    turns = Turns(tenant_a)
    turns.add((f"a-{i % namespaces}", f"spam-{i}") for i in range(crons))
    return turns


def takes_until(turns: Turns, key: tuple[str, str]) -> int:
    """How many other schedules are taken before ``key``."""
    taken = 0
    while (got := turns.take()) != key:
        assert got is not None, f"{key} was never taken"
        taken += 1
    return taken


def b_share(turns: Turns, *, takes: int = 300) -> float:
    """The share of ``takes`` reconciles that go to tenant b's one namespace, with hundreds of
    its schedules waiting beside tenant a's."""
    turns.add(("b-team", f"report-{i}") for i in range(takes))
    return sum(turns.take()[0] == "b-team" for _ in range(takes)) / takes  # type: ignore[index]


def test_a_tenant_in_five_namespaces_takes_the_turn_of_a_tenant_in_one() -> None:
    # tenant b's one schedule, due while tenant a has hundreds waiting, waits for one of a's,
    # as beside a single-namespace neighbour (turns by namespace: one of each of a's five)
    waits = {spread: a_spread_over(spread) for spread in (1, 5)}
    for turns in waits.values():
        turns.take()
        turns.add([("b-team", "report")])
    assert {
        spread: takes_until(turns, ("b-team", "report")) for spread, turns in waits.items()
    } == {
        1: 1,
        5: 1,
    }
    # over time: b's one namespace gets half the reconciles, however many namespaces a spans
    # (turns by namespace: a sixth beside a's five)
    assert b_share(a_spread_over(5)) == b_share(a_spread_over(1)) == 0.5


def test_a_tenants_namespaces_take_turns_inside_its_share() -> None:
    turns = Turns(tenant_a)
    turns.add([("a-0", "1"), ("a-0", "2"), ("a-1", "1"), ("b", "1"), ("b", "2"), ("a-1", "2")])
    taken = [turns.take() for _ in range(7)]
    assert taken == [
        ("a-0", "1"), ("b", "1"), ("a-1", "1"), ("b", "2"), ("a-0", "2"), ("a-1", "2"), None
    ]  # fmt: skip


def test_a_waiting_schedule_keeps_the_share_it_joined_under() -> None:
    tenants = {"x": "tenant/t"}
    turns = Turns(lambda namespace: tenants.get(namespace, namespace))
    turns.add([("x", "1"), ("y", "1")])
    tenants["x"] = "x"  # the namespace moved to no tenant: its waiting schedule keeps its place
    turns.add([("x", "1"), ("x", "2")])
    assert len(turns) == 3 and ("x", "1") in turns
    assert [turns.take() for _ in range(4)] == [("x", "1"), ("y", "1"), ("x", "2"), None]


async def b_share_of_reconciles(spread: int, share_of: Callable[[str], str]) -> float:
    """Tenant b's share of the reconciles made in 3 s, its one namespace's 300 stuck
    every-second schedules beside tenant a's 1,500 spread over ``spread`` namespaces."""
    store = SlowStore()
    controller = controller_of(store, share_of=share_of)
    for i in range(ATTACKER_CRONS):
        stuck(store, controller, f"a-{i % spread}", f"spam-{i}")
    for i in range(300):
        stuck(store, controller, "b-team", f"report-{i}")
    await run_for(controller, 3)
    return store.reconciles["b-team"] / sum(store.reconciles.values())


async def test_the_controller_shares_reconciles_by_tenant() -> None:
    # measured here: by namespace, b had 0.50 of the reconciles beside a in one namespace and
    # 0.17 beside a in five; by tenant, 0.50 in both
    alone = await b_share_of_reconciles(1, tenant_a)
    spread = await b_share_of_reconciles(5, tenant_a)
    assert spread >= 0.45 and abs(spread - alone) < 0.05, (
        f"b had {spread:.2f} of the reconciles beside tenant a in five namespaces, "
        f"{alone:.2f} beside a in one"
    )


class HeldStore(SlowStore):
    """``SlowStore`` whose listing of ``held``'s runs never answers (a tenant's reconciles
    made slow: thousands of its own ended runs to release and delete, each)."""

    def __init__(self, held: str) -> None:
        super().__init__()
        self.held = held
        self.holding = 0
        """Reconciles of ``held`` waiting now."""

    async def list_runs(self, namespace: str, cron: str) -> list[dict[str, Any]]:
        if namespace != self.held:
            return await super().list_runs(namespace, cron)
        self.holding += 1
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_one_tenants_slow_reconciles_hold_at_most_its_share_of_the_places() -> None:
    store = HeldStore("a-team")
    controller = controller_of(store)
    for i in range(2 * schedules.RECONCILES_AT_ONCE):
        stuck(store, controller, "a-team", f"spam-{i}")
    controller.observe(cron("z-team", "report"))
    await run_for(controller, 1.5)
    assert store.holding == schedules.PER_SHARE < schedules.RECONCILES_AT_ONCE
    assert store.reconciles["z-team"] >= 1, "z-team's schedule found no place free"


def test_a_share_at_its_cap_is_passed_over_and_keeps_its_place() -> None:
    turns = Turns()
    turns.add([("a", "1"), ("b", "1"), ("a", "2")])
    assert turns.take(full={"a"}) == ("b", "1")
    assert turns.take(full={"a"}) is None
    assert [turns.take(), turns.take()] == [("a", "1"), ("a", "2")]
