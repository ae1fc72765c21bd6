"""The status writer's passes take the namespaces in turn: one namespace with hundreds of
writes due delays another namespace's terminal status by one pass, not by all of its writes."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from agentrun.operator.platform.kubeapi import Ref
from agentrun.operator.runs import RunKey
from agentrun.operator.runs.writer import PASS_WRITES, StatusWriter

CONCURRENCY = 8
FLOOD = 400


class ManyRuns:
    """An API server port holding any number of AgentRuns, each patch taking ``delay``
    seconds; ``order`` lists the runs in the order their patches landed."""

    def __init__(
        self, delay: float, *, hung: frozenset[str] = frozenset(), slow: float = 0.0
    ) -> None:
        self.delay = delay
        self.hung = hung
        self.slow = slow
        """Seconds the patch of a run named ``slow…`` takes instead of ``delay``."""
        """Names of runs whose patch never gets an answer (a connection gone dead)."""
        self.order: list[RunKey] = []

    async def get(self, ref: Ref) -> dict[str, Any]:
        return {"metadata": {"uid": f"uid-{ref.name}", "resourceVersion": "1"}, "status": {}}

    async def patch_status(
        self, ref: Ref, status: Mapping[str, Any], *, uid: str = "", version: str = ""
    ) -> dict[str, Any]:
        await asyncio.sleep(self.slow if ref.name.startswith("slow") else self.delay)
        if ref.name in self.hung:
            await asyncio.Event().wait()
        self.order.append(RunKey(ref.namespace, ref.name, uid))
        return {"metadata": {"uid": uid, "resourceVersion": "2"}, "status": dict(status)}


def run(namespace: str, name: str) -> RunKey:
    return RunKey(namespace, name, f"uid-{name}")


def ended(seq: int) -> dict[str, Any]:
    return {"phase": "Succeeded", "terminalReason": "completed", "lastEventSequence": seq}


async def test_another_namespaces_terminal_status_waits_one_pass_not_the_flood() -> None:
    """400 terminal statuses of namespace ``flood`` are due (each patch 5 ms, 8 at once: a
    quarter of a second in all); namespace ``quiet``'s run ends just after the writer started
    on them. Its status lands within the flood's next pass; before, after all 400."""
    api = ManyRuns(delay=0.005)
    writer = StatusWriter(api, interval=30.0, concurrency=CONCURRENCY)  # type: ignore[arg-type]
    for index in range(FLOOD):
        writer.submit(run("flood", f"f{index}"), ended(2), seq=2, terminal=True)
    writer.start()
    await asyncio.sleep(0.002)  # the writer's first pass has begun
    quiet = run("quiet", "q")
    writer.submit(quiet, ended(2), seq=2, terminal=True)
    async with asyncio.timeout(20):
        while quiet not in api.order:
            await asyncio.sleep(0.005)
    before = api.order.index(quiet)
    async with asyncio.timeout(20):  # and the flood's are all written too
        while len(api.order) < FLOOD + 1:
            await asyncio.sleep(0.005)
    await writer.flush_and_stop()
    assert len(set(api.order)) == FLOOD + 1  # each once
    assert before <= 2 * CONCURRENCY * PASS_WRITES, before


def tenant_of(namespace: str) -> str:
    """Tenant A binds every ``a-*`` namespace, tenant B the others (``Tenants.party``)."""
    return "tenant/a" if namespace.startswith("a-") else "tenant/b"


async def test_a_tenants_namespaces_together_take_one_turn_of_each_pass() -> None:
    """Tenant A's terminal statuses are due in five namespaces, tenant B's in one, as many
    each; a pass took the namespaces in turn, so B got one write in six. The parties take
    turns (A's namespaces in turn inside A's): B's statuses are half of the first passes."""
    api = ManyRuns(delay=0.001)
    writer = StatusWriter(api, interval=30.0, concurrency=CONCURRENCY, party=tenant_of)  # type: ignore[arg-type]
    noisy = [run(f"a-{i}", f"a{i}-{n}") for n in range(40) for i in range(5)]
    quiet = [run("b", f"b-{n}") for n in range(40)]
    for key in [*noisy, *quiet]:
        writer.submit(key, ended(2), seq=2, terminal=True)
    writer.start()
    first = 2 * CONCURRENCY * PASS_WRITES
    async with asyncio.timeout(20):
        while len(api.order) < first:
            await asyncio.sleep(0.005)
    await writer.flush_and_stop()
    share = sum(key.namespace == "b" for key in api.order[:first]) / first
    assert share == 0.5, f"tenant B had {share:.2f} of the first {first} writes"


async def test_a_write_that_gets_no_answer_holds_its_connection_not_the_other_writes() -> None:
    """Two runs' patches never get an answer (a connection gone dead without a reset waits out
    the request timeout); 200 other runs end beside them. Each of the 200 lands, on the
    writer's six other connections; before, the pass holding a hung write never ended and no
    write after that pass started."""
    api = ManyRuns(delay=0.001, hung=frozenset({"h0", "h1"}))
    writer = StatusWriter(api, interval=30.0, concurrency=CONCURRENCY)  # type: ignore[arg-type]
    for name in ("h0", "h1"):
        writer.submit(run("dead", name), ended(2), seq=2, terminal=True)
    others = [run(f"ns-{n % 4}", f"r{n}") for n in range(200)]
    for key in others:
        writer.submit(key, ended(2), seq=2, terminal=True)
    writer.start()
    async with asyncio.timeout(20):
        while len(api.order) < len(others):
            await asyncio.sleep(0.005)
    late = run("late", "l")  # and one submitted after them all
    writer.submit(late, ended(2), seq=2, terminal=True)
    async with asyncio.timeout(20):
        while late not in api.order:
            await asyncio.sleep(0.005)
    await writer.flush_and_stop()
    assert set(api.order) == {*others, late}


async def test_stopping_lets_a_write_under_way_land_and_writes_what_is_pending() -> None:
    """A terminal status whose patch is under way when the operator stops lands (before,
    it was cancelled mid-patch: the run's end was not shown, nor counted); one submitted
    while the writer stops is written by the flush."""
    api = ManyRuns(delay=0.01, slow=1.0)
    writer = StatusWriter(api, interval=30.0, concurrency=CONCURRENCY)  # type: ignore[arg-type]
    going, late = run("ns", "slow-going"), run("ns", "late")
    writer.start()
    writer.submit(going, ended(2), seq=2, terminal=True)
    await asyncio.sleep(0.05)  # its patch is on its way
    writer.submit(late, ended(2), seq=2, terminal=True)
    stopping = asyncio.ensure_future(writer.flush_and_stop())
    async with asyncio.timeout(10):
        await stopping
    assert set(api.order) == {going, late}
