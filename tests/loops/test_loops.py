"""The background loop both processes run (``agentrun.loops``): a pass every so many seconds or
when woken, until stopped; a failing pass logged and the loop going on."""

from __future__ import annotations

import asyncio
import gc
import logging
import time

import pytest

from agentrun import loops
from agentrun.loops import sleep_until_set

WHAT = "the test's work"


async def settle() -> None:
    """Let every task that can run, run (a few loop steps)."""
    for _ in range(5):
        await asyncio.sleep(0)


class Work:
    """A pass that counts itself, fails while ``failures`` are queued, and sets ``stopping``
    after ``stop_after`` passes."""

    def __init__(
        self,
        *,
        stopping: asyncio.Event | None = None,
        stop_after: int = 0,
        failures: list[Exception] | None = None,
    ) -> None:
        self.stopping = stopping
        self.stop_after = stop_after
        self.failures = list(failures or [])
        self.times: list[float] = []

    async def __call__(self) -> None:
        self.times.append(time.monotonic())
        if self.stopping is not None and len(self.times) == self.stop_after:
            self.stopping.set()
        if self.failures:
            raise self.failures.pop(0)


async def test_the_first_pass_runs_at_once_and_the_next_after_the_interval() -> None:
    stopping = asyncio.Event()
    work = Work(stopping=stopping, stop_after=3)
    await asyncio.wait_for(loops.every(0.05, work, what=WHAT, stopping=stopping), 30)
    assert len(work.times) == 3
    gaps = [b - a for a, b in zip(work.times, work.times[1:], strict=False)]
    assert all(gap >= 0.04 for gap in gaps), gaps  # never sooner than the interval


async def test_a_long_interval_leaves_one_pass_until_it_passes() -> None:
    work = Work()
    task = asyncio.create_task(loops.every(30.0, work, what=WHAT, stopping=asyncio.Event()))
    await asyncio.sleep(0.1)
    assert len(work.times) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_wait_first_begins_with_the_interval_not_a_pass() -> None:
    stopping = asyncio.Event()
    work = Work()
    task = asyncio.create_task(
        loops.every(30.0, work, what=WHAT, stopping=stopping, wait_first=True)
    )
    await asyncio.sleep(0.1)
    assert work.times == []
    stopping.set()  # wakes the first wait; the loop ends without a pass
    await asyncio.wait_for(task, 5)
    assert work.times == []


async def test_stop_ends_the_loop_in_its_wait_long_before_the_interval() -> None:
    stopping = asyncio.Event()
    work = Work()
    task = asyncio.create_task(loops.every(3600.0, work, what=WHAT, stopping=stopping))
    await settle()
    stopping.set()
    await asyncio.wait_for(task, 30)  # far sooner than the hour
    assert len(work.times) == 1


async def test_a_stop_during_a_pass_lets_it_finish_and_runs_no_other() -> None:
    stopping = asyncio.Event()
    work = Work(stopping=stopping, stop_after=1)
    await asyncio.wait_for(loops.every(0.0, work, what=WHAT, stopping=stopping), 5)
    assert len(work.times) == 1


async def test_a_failing_pass_is_logged_once_and_the_loop_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="agentrun.loops")
    stopping = asyncio.Event()
    boom = [RuntimeError("boom"), RuntimeError("boom"), RuntimeError("boom")]
    work = Work(stopping=stopping, stop_after=5, failures=boom)
    await asyncio.wait_for(loops.every(0.0, work, what=WHAT, stopping=stopping), 5)
    assert len(work.times) == 5  # the failures stopped nothing
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    failed = f"{WHAT} failed: RuntimeError: boom; trying again at the next pass"
    assert lines == [
        (logging.WARNING, failed),
        (logging.DEBUG, failed),
        (logging.DEBUG, failed),
        (logging.INFO, f"{WHAT} recovered"),
    ]


async def test_another_error_is_warned_of_again(caplog: pytest.LogCaptureFixture) -> None:
    stopping = asyncio.Event()
    errors: list[Exception] = [RuntimeError("boom"), ConnectionError("gone")]
    work = Work(stopping=stopping, stop_after=2, failures=errors)
    await asyncio.wait_for(loops.every(0.0, work, what=WHAT, stopping=stopping), 5)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [m.split(";")[0] for m in warned] == [
        f"{WHAT} failed: RuntimeError: boom",
        f"{WHAT} failed: ConnectionError: gone",
    ]


async def test_a_cancellation_inside_a_pass_ends_the_loop() -> None:
    async def cancelled() -> None:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(loops.every(0.0, cancelled, what=WHAT), 5)


async def test_without_a_stop_only_cancelling_ends_the_loop() -> None:
    work = Work()
    task = asyncio.create_task(loops.every(0.01, work, what=WHAT, wait_first=True))
    async with asyncio.timeout(30):
        while len(work.times) < 2:
            await asyncio.sleep(0.01)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_wake_runs_a_pass_at_once_and_is_cleared_before_it() -> None:
    wake, stopping = asyncio.Event(), asyncio.Event()
    seen: list[bool] = []

    async def work() -> None:
        seen.append(wake.is_set())
        if len(seen) == 1:
            wake.set()  # woken during the first pass: a second one follows at once

    task = asyncio.create_task(
        loops.every(None, work, what=WHAT, stopping=stopping, wake=wake, wait_first=True)
    )
    await settle()
    assert seen == []  # no deadline: only a wake-up starts a pass
    wake.set()
    await settle()
    assert seen == [False, False]
    stopping.set()
    wake.set()  # a caller with its own wake sets it when it stops
    await asyncio.wait_for(task, 5)
    assert len(seen) == 2


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


async def test_a_task_nobody_awaits_has_its_error_logged_not_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``log_failure``: the error of a task nobody awaits is logged, naming its work, and
    retrieved (asyncio reports no "Task exception was never retrieved" when the task goes);
    a cancelled task or one that returned is let go."""
    loop = asyncio.get_running_loop()
    unretrieved: list[object] = []
    handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: unretrieved.append(context))

    async def fails() -> None:
        raise RuntimeError("a bug")

    try:
        with caplog.at_level(logging.INFO, logger="agentrun.loops"):
            tasks = [asyncio.create_task(fails()), asyncio.create_task(asyncio.sleep(0))]
            tasks.append(asyncio.create_task(asyncio.sleep(60)))
            for task in tasks:
                loops.log_failure(task, what=WHAT)
            tasks[2].cancel()
            await asyncio.wait(tasks)
            await settle()
            del tasks, task
            gc.collect()
    finally:
        loop.set_exception_handler(handler)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.ERROR, f"{WHAT} failed: RuntimeError: a bug")
    ]
    assert unretrieved == []
