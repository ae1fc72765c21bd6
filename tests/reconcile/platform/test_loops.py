"""How the operator watches its background loops while they run (one that ends by an error
ends the process) and stops them at shutdown: cancelled, and waited for."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import subprocess
import sys
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


async def ended(*tasks: asyncio.Task[None]) -> None:
    await asyncio.wait(tasks, timeout=5.0)
    await asyncio.sleep(0)  # done callbacks run one step after the task ends


async def test_a_loop_ending_by_an_error_is_reported_one_cancelled_or_returned_is_not() -> None:
    failed: list[str] = []
    supervision = loops.Supervision(lambda task: failed.append(task.get_name()))

    async def broken() -> None:
        raise KeyError("r0")

    async def returns() -> None:
        return None

    hung = asyncio.create_task(asyncio.Event().wait(), name="hung")
    tasks = supervision.watch(
        asyncio.create_task(broken(), name="turn-gate"),
        asyncio.create_task(returns(), name="orphan-purge"),
        hung,
    )
    hung.cancel()
    await ended(*tasks)
    assert failed == ["turn-gate"]


async def test_at_shutdown_a_loop_may_end_by_an_error() -> None:
    failed: list[str] = []
    supervision = loops.Supervision(lambda task: failed.append(task.get_name()))
    closing = asyncio.Event()

    async def connection_closed() -> None:
        await closing.wait()
        raise ConnectionError("closed")

    task = supervision.watch(asyncio.create_task(connection_closed(), name="event-consumer"))[0]
    supervision.stop()
    closing.set()
    await ended(task)
    assert failed == []


async def test_every_loop_the_operator_starts_is_watched() -> None:
    """Each of ``wiring``'s loops, and the status writer, made to fail at once: every one
    that can end by an error is reported (the orphan purge logs its own and ends)."""
    from agentrun.operator import wiring

    def failing(name: str) -> Callable[..., Awaitable[None]]:
        async def fail(*_: object, **__: object) -> None:
            raise RuntimeError(name)

        return fail

    class Part:
        def __init__(self, name: str) -> None:
            self.name = name

        def __getattr__(self, attr: str) -> object:
            if attr in ("gate", "runs", "writer"):
                return Part(f"{self.name}.{attr}")
            if attr == "start":  # the status writer
                return lambda: asyncio.create_task(failing(self.name)(), name="status-writer")
            return failing(f"{self.name}.{attr}")

    failed: list[str] = []
    supervision = loops.Supervision(lambda task: failed.append(task.get_name()))
    names = [field.name for field in dataclasses.fields(wiring.Parts)]
    parts = wiring.Parts(
        **{name: Part(name) for name in names if name not in ("tasks", "supervision")},
        supervision=supervision,
    )
    started = wiring._start_loops(parts, cluster=True)
    await ended(*started)
    every = {task.get_name() for task in started} | {"status-writer"}
    assert sorted(failed) == sorted(every - {"orphan-purge"})
    assert len(started) >= 15


def test_a_failed_loop_logs_one_error_naming_it_and_ends_the_process_at_once() -> None:
    code = (
        "import asyncio, logging, sys; logging.basicConfig(stream=sys.stderr, level=logging.INFO);"
        "from agentrun.operator.platform import loops\n"
        "async def gate():\n    raise KeyError('r0')\n"
        "async def main():\n"
        "    loops.Supervision().watch(asyncio.create_task(gate(), name='turn-gate'))\n"
        "    await asyncio.sleep(5)\n    print('returned')\n"
        "asyncio.run(main())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == loops.LOOP_FAILED_EXIT
    assert "returned" not in done.stdout
    errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1 and "the operator's turn-gate loop ended by an error" in errors[0]
    assert "KeyError: 'r0'" in done.stderr  # its traceback


def test_the_exit_status_is_none_of_the_others() -> None:
    from agentrun.operator.main import LOST_LEADERSHIP_EXIT
    from agentrun.operator.platform.storewatch import STORE_LOST_EXIT

    assert loops.LOOP_FAILED_EXIT not in (0, 1, 2, LOST_LEADERSHIP_EXIT, STORE_LOST_EXIT)
