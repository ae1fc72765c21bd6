"""Background loops, the same shape in the operator and the worker: a pass every so many
seconds (or when woken) until stopped, an error logged and the next pass run all the same.

What belongs here: ``every``, that loop, ``sleep_until_set``, the wait it (and every loop
whose next wait is computed by its pass) ends a pass with, and ``log_failure``, for a task of
its own that nobody awaits (its error logged, not lost). What does not: the passes
themselves (each part that runs one), loops fed by a queue or with a wait their pass computes
(they use ``sleep_until_set`` alone), and stopping tasks at shutdown
(``operator.platform.loops.cancel_and_wait``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)


def log_failure(task: asyncio.Future[Any], *, what: str) -> None:
    """Have ``task`` (a task nobody awaits) logged if it ends by an error: one ERROR naming
    ``what`` (e.g. ``"discovery of AgentToolServer ns/name"``), with its traceback. Its
    exception is retrieved, so asyncio never reports it as "Task exception was never
    retrieved" (at garbage collection, unnamed, or never). A task cancelled or ending by its
    own return is let go. For a task whose end must stop the process, the operator's
    ``Supervision`` instead."""

    def ended(done: asyncio.Future[Any]) -> None:
        if done.cancelled():
            return
        error = done.exception()
        if error is not None:
            log.error("%s failed: %s: %s", what, type(error).__name__, error, exc_info=error)

    task.add_done_callback(ended)


async def sleep_until_set(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds passed (``None``: no deadline);
    whether it was set. The event is left as it is (the caller clears it where its pass
    begins)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await event.wait()
            return True
    return False


async def every(
    seconds: float | None,
    work: Callable[[], Awaitable[object]],
    *,
    what: str,
    stopping: asyncio.Event | None = None,
    wake: asyncio.Event | None = None,
    wait_first: bool = False,
) -> None:
    """Await ``work()``, then wait ``seconds`` (``None``: no deadline) or until ``wake`` is set,
    and again, until ``stopping`` is set (``None``: until the task is cancelled).

    ``wake`` (default: ``stopping``) cuts a wait short; it is cleared just before each pass,
    so a wake-up during a pass runs one more at once. A caller with its own ``wake`` sets it
    when it sets ``stopping``. ``wait_first``: begin with a wait, not a pass. ``stopping`` is
    checked before each pass, so a pass in progress is never cut off by it.

    An ``Exception`` a pass raises is logged (``what`` names the work in the line: a warning
    the first time, debug while the same error repeats, info at the first pass that succeeds
    after it) and the next pass comes as if it had succeeded. Returns once ``stopping`` is
    set; raises nothing but a ``CancelledError`` of the task.
    """
    bell = wake or stopping or asyncio.Event()
    if wait_first:
        await sleep_until_set(bell, seconds)
    failing = ""
    while stopping is None or not stopping.is_set():
        if wake is not None:
            wake.clear()
        try:
            await work()
        except Exception as err:  # a pass's failure never ends the loop
            text = f"{type(err).__name__}: {err}"
            level = logging.DEBUG if text == failing else logging.WARNING
            log.log(level, "%s failed: %s; trying again at the next pass", what, text)
            failing = text
        else:
            if failing:
                log.info("%s recovered", what)
            failing = ""
        await sleep_until_set(bell, seconds)
