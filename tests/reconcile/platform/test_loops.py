"""How the operator stops its background loops at shutdown: cancelled, and waited for."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable

import pytest

from agentrun.operator.platform import loops


def never_retrieved(stop: Callable[[list[asyncio.Task[None]]], Awaitable[None]]) -> list[str]:
    """What asyncio reports after a loop whose task, awaiting a gather, is stopped by ``stop``
    and the loop then closed (as the operator's at shutdown)."""
    reported: list[str] = []
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda _, context: reported.append(context["message"]))

    async def scenario() -> None:
        async def child() -> None:
            await asyncio.sleep(60)

        async def parent() -> None:
            await asyncio.gather(child(), child())

        task = asyncio.create_task(parent())
        await asyncio.sleep(0.01)
        await stop([task])

    loop.run_until_complete(scenario())
    loop.close()
    gc.collect()
    return reported


def test_a_loop_cancelled_and_waited_for_retrieves_its_gathers_outcome() -> None:
    async def cancel_only(tasks: list[asyncio.Task[None]]) -> None:
        for task in tasks:
            task.cancel()
        await asyncio.sleep(0)  # the old shutdown: one more step, then the loop ended

    async def cancel_and_wait(tasks: list[asyncio.Task[None]]) -> None:
        await loops.cancel_and_wait(tasks, timeout=5.0)

    assert any("_GatheringFuture" in m for m in never_retrieved(cancel_only))  # the old way
    assert never_retrieved(cancel_and_wait) == []


async def test_a_loop_that_failed_is_logged_when_waited_for(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(broken(), name="broken")
    await asyncio.sleep(0)
    hung = asyncio.create_task(asyncio.Event().wait())
    await loops.cancel_and_wait([task, hung], timeout=1.0)
    assert hung.cancelled()
    assert "task broken ended with RuntimeError('boom')" in caplog.text
