"""The shared byte budget (the trajectory server's events, the worker's turns): first come
first served, an amount larger than the budget held alone, a waiter that gives up takes
nothing."""

from __future__ import annotations

import asyncio

import pytest

from agentrun import bytebudget


async def waiting(task: asyncio.Task[int]) -> bool:
    """Whether ``task`` still waits once every ready task has run."""
    for _ in range(3):
        await asyncio.sleep(0)
    return not task.done()


async def waiters(taken: int, *sizes: int) -> tuple[bytebudget.ByteBudget, list[asyncio.Task[int]]]:
    """A budget of 10 bytes with ``taken`` of them taken, and a take of each of ``sizes``,
    asked in that order, all waiting."""
    bytes_ = bytebudget.ByteBudget(10)
    assert await bytes_.take(taken) == taken
    tasks = [asyncio.create_task(bytes_.take(size)) for size in sizes]
    for task in tasks:
        assert await waiting(task)
    return bytes_, tasks


async def test_a_take_that_fits_waits_behind_an_earlier_one_that_does_not() -> None:
    bytes_, (big, small) = await waiters(8, 5, 1)  # the 1 fits now, but was asked after the 5
    bytes_.give(8)
    assert (await big, await small) == (5, 1)
    assert bytes_.held == 6


async def test_an_event_larger_than_the_budget_is_taken_alone() -> None:
    bytes_, (huge,) = await waiters(1, 100)
    bytes_.give(1)
    assert await huge == 10 and bytes_.held == 10
    after = asyncio.create_task(bytes_.take(1))
    assert await waiting(after)
    bytes_.give(10)
    assert await after == 1


async def test_a_waiter_that_is_cancelled_takes_nothing_and_lets_the_next_in() -> None:
    bytes_, (blocked, behind) = await waiters(6, 8, 4)
    blocked.cancel()
    assert await behind == 4  # the line moved without any give
    with pytest.raises(asyncio.CancelledError):
        await blocked
    bytes_.give(6)
    bytes_.give(4)
    assert bytes_.held == 0


async def test_a_waiter_cancelled_once_granted_gives_its_bytes_back() -> None:
    bytes_, (granted,) = await waiters(10, 3)
    bytes_.give(10)  # grants it; cancelled before it runs again
    granted.cancel()
    with pytest.raises(asyncio.CancelledError):
        await granted
    assert bytes_.held == 0


def test_a_budget_must_hold_a_byte() -> None:
    with pytest.raises(ValueError):
        bytebudget.ByteBudget(0)


async def test_a_tenant_over_its_share_waits_while_another_tenant_takes_the_rest() -> None:
    shares = bytebudget.Shares(bytebudget.ByteBudget(100), parts=4)
    with shares.using("tenant:a") as a, shares.using("tenant:b") as b:
        assert await a.take(25) == 25
        more = asyncio.create_task(a.take(1))  # a holds its quarter: it waits for its own
        assert await waiting(more)
        assert await b.take(25) == 25 and shares.whole.held == 50  # b is not held up by a
        a.give(25)
        assert await more == 1
        a.give(1)
        b.give(25)
    assert shares.whole.held == 0


async def test_an_event_larger_than_the_share_is_served_alone_within_it() -> None:
    shares = bytebudget.Shares(bytebudget.ByteBudget(100), parts=4)
    with shares.using("tenant:a") as a:
        async with a.holding(60):  # a quarter is 25: it takes the share and 60 of the whole
            assert (a.own.held, shares.whole.held) == (25, 60)
        assert (a.own.held, shares.whole.held) == (0, 0)


async def test_a_share_waiting_for_the_whole_budget_cancelled_takes_nothing() -> None:
    shares = bytebudget.Shares(bytebudget.ByteBudget(100), parts=2)
    await shares.whole.take(100)  # others hold the whole budget
    with shares.using("tenant:a") as a:
        task = asyncio.create_task(a.take(10))
        assert await waiting(task)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert a.own.held == 0


def test_a_share_nobody_uses_is_forgotten() -> None:
    shares = bytebudget.Shares(bytebudget.ByteBudget(100), parts=4)
    with shares.using("tenant:a") as first, shares.using("tenant:a") as second:
        assert first is second
    with shares.using("tenant:a") as again:
        assert again is not first
    assert not shares._shares
