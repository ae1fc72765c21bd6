"""The wait every background loop ends its pass with: woken by its event, or by its deadline."""

from __future__ import annotations

import asyncio
import time

from agentrun.operator.platform.loops import sleep_until_set


async def test_an_event_set_meanwhile_wakes_the_loop_before_its_deadline() -> None:
    event = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, event.set)
    started = time.monotonic()
    assert await sleep_until_set(event, 30.0) is True
    assert time.monotonic() - started < 5.0
    assert event.is_set()  # left for the caller to clear


async def test_the_deadline_wakes_the_loop_when_nothing_happens() -> None:
    started = time.monotonic()
    assert await sleep_until_set(asyncio.Event(), 0.05) is False
    assert time.monotonic() - started >= 0.04


async def test_without_a_deadline_only_the_event_wakes_it() -> None:
    event = asyncio.Event()
    waiting = asyncio.create_task(sleep_until_set(event, None))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    event.set()
    assert await waiting is True
