"""Fair shares of admission work (issue 21): a few admissions per namespace at once, first in
first out within the namespace, so one namespace's creation burst does not hold another's."""

from __future__ import annotations

import asyncio
import types
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun.operator.admission.fairgate import AdmissionGate, Slots
from agentrun.operator.handlers import admission as handlers


def test_slots_let_in_up_to_the_limit_per_key_and_the_rest_first_in_first_out() -> None:
    slots = Slots(2)
    assert [slots.request("a", n) for n in range(5)] == [True, True, False, False, False]
    assert slots.request("b", "b0")  # another key is not held by a's line
    assert slots.waiters("a") == 3 and slots.waiters("b") == 0
    assert [slots.release("a") for _ in range(3)] == [2, 3, 4]
    assert slots.release("a") is None and slots.release("a") is None
    assert slots.holding == {"b": 1} and slots.waiting == {}


SLOT_OPS = st.lists(
    st.tuples(st.sampled_from(["request", "release", "withdraw"]), st.sampled_from(["a", "b"])),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(SLOT_OPS, st.integers(min_value=1, max_value=3), st.randoms(use_true_random=False))
def test_any_order_of_requests_releases_and_withdrawals_keeps_holders_and_lines_in_step(
    ops: list[tuple[str, str]], limit: int, pick: Any
) -> None:
    """Whatever the order of requests, releases and withdrawals (a waiter that gave up): no
    key holds more than ``limit``; a key has a line only while it holds all its slots; the
    line is let in first in, first out, withdrawn tickets never; nothing empty is kept."""
    slots, holders, lines = Slots(limit), {"a": 0, "b": 0}, {"a": [], "b": []}
    for ticket, (op, key) in enumerate(ops):
        if op == "request":
            if slots.request(key, ticket):
                holders[key] += 1
            else:
                lines[key].append(ticket)
        elif op == "release" and holders[key]:
            let_in = slots.release(key)
            assert let_in == (lines[key].pop(0) if lines[key] else None)
            if let_in is None:  # else the slot passed to the first in line
                holders[key] -= 1
        elif op == "release":
            with pytest.raises(ValueError):
                slots.release(key)
        elif op == "withdraw" and lines[key]:
            gave_up = pick.choice(lines[key])
            assert slots.withdraw(key, gave_up) and not slots.withdraw(key, gave_up)
            lines[key].remove(gave_up)
        for k in ("a", "b"):
            assert slots.holding.get(k, 0) == holders[k] <= limit
            assert list(slots.waiting.get(k, ())) == lines[k] and slots.waiters(k) == len(lines[k])
            assert not lines[k] or holders[k] == limit
        assert all(slots.holding.values()) and all(slots.waiting.values())


def test_a_newcomer_waits_behind_the_line_even_when_a_slot_is_counted_free() -> None:
    slots = Slots(1)
    assert slots.request("a", 0) and not slots.request("a", 1)
    assert slots.withdraw("a", 1) and not slots.withdraw("a", 1)
    assert not slots.request("a", 2)  # a holds its one slot
    assert slots.release("a") == 2 and slots.release("a") is None


def test_slots_refuse_a_limit_below_one_and_a_release_without_a_hold() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Slots(0)
    with pytest.raises(ValueError, match="holds no slot"):
        Slots(1).release("a")


async def _hold(
    gate: AdmissionGate, ns: str, order: list[str], tag: str, go: asyncio.Event
) -> None:
    async with gate.turn(ns):
        order.append(tag)
        await go.wait()


async def test_a_burst_of_one_namespace_does_not_hold_another_and_keeps_its_order() -> None:
    gate, order, go = AdmissionGate(2), list[str](), asyncio.Event()
    burst = [asyncio.create_task(_hold(gate, "a", order, f"a{n}", go)) for n in range(50)]
    await asyncio.sleep(0)
    async with asyncio.timeout(1):
        async with gate.turn("b"):  # let in at once, beside a's two
            order.append("b")
    assert order == ["a0", "a1", "b"] and gate.slots.waiters("a") == 48
    go.set()
    await asyncio.gather(*burst)
    assert order == ["a0", "a1", "b"] + [f"a{n}" for n in range(2, 50)]
    assert gate.slots.holding == {} and gate.slots.waiting == {}


async def test_a_waiter_cancelled_leaves_the_line_and_one_let_in_passes_its_slot_on() -> None:
    gate, order, go = AdmissionGate(1), list[str](), asyncio.Event()
    first = asyncio.create_task(_hold(gate, "a", order, "a0", go))
    await asyncio.sleep(0)
    second = asyncio.create_task(_hold(gate, "a", order, "a1", go))
    third = asyncio.create_task(_hold(gate, "a", order, "a2", go))
    await asyncio.sleep(0)
    second.cancel()  # while it waits
    await asyncio.sleep(0)
    assert gate.slots.waiters("a") == 1
    go.set()
    await asyncio.sleep(0)  # first ends and lets third in; third has not run yet
    assert first.done() and not third.done()
    third.cancel()  # let in, cancelled before it ran
    await asyncio.gather(second, third, return_exceptions=True)
    assert order == ["a0"] and gate.slots.holding == {} and gate.slots.waiting == {}
    async with asyncio.timeout(1), gate.turn("a"):  # the slot was passed on, not lost
        pass


class Recovering:
    """Live runs whose recovery of a run of namespace ``slow`` waits until released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started: list[str] = []

    async def recover(
        self, namespace: str, name: str, uid: str, *, generation: int, reruns: int = 0
    ) -> bool:
        self.started.append(name)
        if namespace == "slow":
            await self.release.wait()
        return True


async def _create(handling: Any, namespace: str, name: str) -> None:
    memo = types.SimpleNamespace(running=lambda: types.SimpleNamespace(runs=handling))
    await handlers.admit_run(
        spec={"goal": "g"},  # type: ignore[arg-type]
        meta={"generation": 1},  # type: ignore[arg-type]
        status={},  # type: ignore[arg-type]
        namespace=namespace,
        name=name,
        uid=f"uid-{name}",
        retry=0,
        memo=memo,  # type: ignore[arg-type]
    )


async def test_the_create_handler_admits_another_namespace_while_one_namespace_bursts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def recovered(parts: Any, key: Any, annotations: Any) -> None:
        return None

    monkeypatch.setattr(handlers, "_recovered", recovered)
    runs = Recovering()
    handling = types.SimpleNamespace(runs=runs, gate=AdmissionGate(2))
    burst = [asyncio.create_task(_create(handling, "slow", f"a{n}")) for n in range(20)]
    await asyncio.sleep(0.01)
    async with asyncio.timeout(1):
        await _create(handling, "quick", "b")
    assert runs.started == ["a0", "a1", "b"]  # the burst's other 18 wait in the gate
    runs.release.set()
    await asyncio.gather(*burst)
    assert runs.started == ["a0", "a1", "b"] + [f"a{n}" for n in range(2, 20)]
