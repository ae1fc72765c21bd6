"""How the operator's background loops are stopped at shutdown.

What belongs here: ``cancel_and_wait``. What does not: the shape of a loop (``agentrun.loops``:
``every``, ``sleep_until_set``, which the worker's loops share) and the loops themselves (each
part that runs one).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

log = logging.getLogger(__name__)


async def cancel_and_wait(tasks: Iterable[asyncio.Task[None]], *, timeout: float) -> None:
    """Cancel ``tasks`` and wait up to ``timeout`` seconds for them to end, so that each runs
    its cancellation through: a task cancelled and left behind at shutdown never retrieves the
    outcome of the ``asyncio.gather`` it awaited, and asyncio logs "_GatheringFuture exception
    was never retrieved". An error a task ended with is logged; tasks still running after
    ``timeout`` are left (cancelled). Raises nothing but a ``CancelledError`` of the caller."""
    every = list(tasks)
    pending = [t for t in every if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=timeout)
    for task in every:
        if task.done() and not task.cancelled() and task.exception() is not None:
            log.warning("task %s ended with %r", task.get_name(), task.exception())
