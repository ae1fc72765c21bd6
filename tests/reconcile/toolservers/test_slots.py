"""Discovery slots: one namespace's hanging servers hold its own share, never every slot."""

from __future__ import annotations

import asyncio

import pytest

from agentrun.operator.toolservers.refresher import NamespaceSlots


async def hold(
    slots: NamespaceSlots, namespace: str, release: asyncio.Event, held: list[str]
) -> None:
    async with slots.slot(namespace):
        held.append(namespace)
        await release.wait()


async def test_sixteen_hanging_discoveries_of_one_namespace_leave_slots_for_another() -> None:
    slots = NamespaceSlots(16, per_namespace=4)
    release, held = asyncio.Event(), []
    hanging = [asyncio.create_task(hold(slots, "a", release, held)) for _ in range(16)]
    await asyncio.sleep(0.01)
    assert held == ["a"] * 4 and slots.users("a") == 16  # 12 wait for a's own slots
    async with asyncio.timeout(1):  # b is not behind a's twelve
        async with slots.slot("b"):
            assert slots.users("b") == 1
    assert slots.users("b") == 0  # forgotten once nobody holds or waits
    release.set()
    await asyncio.gather(*hanging)
    assert held == ["a"] * 16 and slots.users("a") == 0


async def test_the_total_bounds_every_namespace_together() -> None:
    slots = NamespaceSlots(4, per_namespace=2)
    release, held = asyncio.Event(), []
    tasks = [asyncio.create_task(hold(slots, ns, release, held)) for ns in "aabbcc"]
    await asyncio.sleep(0.01)
    assert len(held) == 4 and held.count("c") == 0  # c waits for a shared slot, first in line
    release.set()
    await asyncio.gather(*tasks)
    assert sorted(held) == sorted("aabbcc")


async def test_a_cancelled_waiter_gives_its_place_back() -> None:
    slots = NamespaceSlots(1, per_namespace=1)
    release, held = asyncio.Event(), []
    first = asyncio.create_task(hold(slots, "a", release, held))
    await asyncio.sleep(0.01)
    waiting = asyncio.create_task(hold(slots, "a", release, held))
    await asyncio.sleep(0.01)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert slots.users("a") == 1
    release.set()
    await first
    assert slots.users("a") == 0


def test_a_share_above_the_total_is_refused() -> None:
    with pytest.raises(ValueError, match="per_namespace"):
        NamespaceSlots(4, per_namespace=5)
