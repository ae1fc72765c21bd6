"""AgentEval reconciles are shared out by tenant, not by namespace: a tenant spanning as many
namespaces as there are places, each with a suite whose reconcile takes long (a first check of
200 answer schemas, edited again and again), held every place, and another tenant's suite
waited for one of them to end. A tenant's namespaces together hold ``PER_SHARE`` places; the
next of its suites waits for its own, the other tenants' are served beside it."""

from __future__ import annotations

import asyncio
from typing import Any

from kube_support import FakeKube
from trajectory_support import NoEvents

from agentrun.operator.evals.controller import PER_SHARE, RECONCILES_AT_ONCE, EvalController
from agentrun.operator.evals.store import EVALS
from agentrun.operator.platform.events import EventRecorder, Throttle
from agentrun.operator.platform.fairwork import FairWork
from agentrun.operator.platform.kubeapi import Ref

NOISY = [f"team-a-{i}" for i in range(RECONCILES_AT_ONCE + 1)]
"""Tenant A's namespaces: one more than there are places."""
QUIET = "team-b"
"""Tenant B's one namespace."""


def party(namespace: str) -> str:
    """The tenants above, as ``Tenants.party`` names them."""
    return "tenant/a" if namespace.startswith("team-a-") else "tenant/b"


class HeldReads(FakeKube):
    """A FakeKube whose reads of tenant A's AgentEvals wait for ``release``: their reconciles
    last as long as the test wants. ``reading`` lists the suites whose reconcile has begun."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.reading: list[tuple[str, str]] = []

    async def get(self, ref: Ref) -> dict[str, Any] | None:
        if ref.plural == EVALS:
            self.reading.append((ref.namespace, ref.name))
            if party(ref.namespace) == "tenant/a":
                await self.release.wait()
        return await super().get(ref)


def suite(namespace: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "suite", "namespace": namespace, "generation": 1},
        "spec": {"agentRef": {"name": "bot"}, "cases": [{"name": "one", "goal": "g"}]},
    }


async def until(condition: Any, *, seconds: float = 5.0) -> bool:
    """Whether ``condition()`` became true within ``seconds``."""
    try:
        async with asyncio.timeout(seconds):
            while not condition():
                await asyncio.sleep(0.01)
    except TimeoutError:
        return False
    return True


async def test_one_tenants_namespaces_hold_their_share_of_places_not_every_place() -> None:
    api = HeldReads()
    for namespace in [*NOISY, QUIET]:
        api.put(EVALS, suite(namespace))
    events = EventRecorder(api, throttle=Throttle(repeat_after=0, rate=1000, burst=1000))
    checks = FairWork(party=party)
    controller = EvalController(api, runs=NoEvents(), events=events, checks=checks, retry=3600)
    loop_task = asyncio.create_task(controller.run())
    try:
        for namespace in NOISY:  # applied a moment earlier
            controller.kick(namespace, "suite")
        assert await until(lambda: len(api.reading) >= PER_SHARE)
        controller.kick(QUIET, "suite")
        served = await until(lambda: (QUIET, "suite") in api.reading, seconds=2.0)
        noisy = [key for key in api.reading if key[0] in NOISY]
        api.release.set()
        assert await until(lambda: len(api.reading) == len(NOISY) + 1)
    finally:
        loop_task.cancel()
        checks.close()
    assert served, f"tenant B's suite waited while tenant A's {len(noisy)} reconciles went on"
    assert len(noisy) == PER_SHARE, f"tenant A's namespaces held {len(noisy)} places at once"


class RekickedReads(FakeKube):
    """A FakeKube where each reconcile of the suite in ``busy`` asks for it again while it
    runs (its own status write, its cases' runs ending), ``times`` times in all."""

    def __init__(self, busy: str, times: int) -> None:
        super().__init__()
        self.busy, self.times = busy, times
        self.controller: EvalController | None = None
        self.reading: list[tuple[str, str]] = []

    async def get(self, ref: Ref) -> dict[str, Any] | None:
        if ref.plural == EVALS:
            self.reading.append((ref.namespace, ref.name))
            if ref.namespace == self.busy and self.times > 0 and self.controller is not None:
                self.times -= 1
                self.controller.kick(ref.namespace, ref.name)
            await asyncio.sleep(0.01)
        return await super().get(ref)


async def test_a_suite_asked_again_while_it_runs_waits_behind_its_tenants_parked_ones() -> None:
    """Tenant A's suite in team-a-0 is asked for again during each of its reconciles; A's
    suite in team-a-1, asked for meanwhile, waits for A's place. The suite asked again was
    queued before the parked one at each end and took the place back: team-a-1's suite
    waited for all 20 of team-a-0's reconciles. It now goes next."""
    busy, sibling = NOISY[0], NOISY[1]
    api = RekickedReads(busy, times=20)
    for namespace in (busy, sibling):
        api.put(EVALS, suite(namespace))
    events = EventRecorder(api, throttle=Throttle(repeat_after=0, rate=1000, burst=1000))
    checks = FairWork(party=party)
    controller = EvalController(api, runs=NoEvents(), events=events, checks=checks, retry=3600)
    api.controller = controller
    loop_task = asyncio.create_task(controller.run())
    try:
        controller.kick(busy, "suite")
        assert await until(lambda: len(api.reading) >= 1)
        controller.kick(sibling, "suite")
        assert await until(lambda: (sibling, "suite") in api.reading)
    finally:
        loop_task.cancel()
        await asyncio.gather(loop_task, return_exceptions=True)
        checks.close()
    before = api.reading[: api.reading.index((sibling, "suite"))]
    assert len(before) <= 2, f"team-a-1's suite waited for {len(before)} reconciles of team-a-0's"
