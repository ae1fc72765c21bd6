"""The shape the operator's background loops share: do a pass, then sleep until woken or a
deadline.

What belongs here: ``sleep_until_set``, the wait every loop ends its pass with (an event set by
a kick, an observation or a stop, or the time of its next due work, whichever comes first), and
``cancel_and_wait``, how they are stopped. What does not: the loops themselves (each part that
runs one).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable

log = logging.getLogger(__name__)


async def sleep_until_set(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds passed (``None``: no deadline);
    whether it was set. The event is left as it is (the caller clears it where its pass
    begins)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await event.wait()
            return True
    return False


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
