"""How the operator's background loops are watched while they run and stopped at shutdown.

A background loop (the turn gate, the event consumer, the status writer…) never ends by an
error on its own: each catches what NATS or the API server raise and tries again. One that
ends by an error anyway met a fault in the operator's own state, and the work it carried
would stop without a word (runs that wait forever while the process looks healthy). So
``Supervision`` ends the process instead, logging the error: its Deployment starts it again,
and start-up recovery re-dispatches every running run from its events, the way a crashed
leader's successor does.

What belongs here: ``Supervision`` and ``cancel_and_wait``. What does not: the shape of a
loop (``agentrun.loops``: ``every``, ``sleep_until_set``, which the worker's loops share) and
the loops themselves (each part that runs one).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterable
from typing import NoReturn

log = logging.getLogger(__name__)

LOOP_FAILED_EXIT = 71
"""Exit status of an operator one of whose background loops ended by an error (70 is a lost
Lease's, 75 a lost store's): its Deployment starts it again, and start-up recovery runs."""


def exit_loop_failed(task: asyncio.Task[None]) -> NoReturn:
    """Log one ERROR naming the loop and its error (with its traceback) and exit with
    ``LOOP_FAILED_EXIT`` at once. Never returns. Keeps the leader Lease, as a leader that
    lost it does: no standby acts while this process may still act."""
    error = task.exception()
    log.error(
        "the operator's %s loop ended by an error: exiting so that start-up recovery runs "
        "(every running run's turn dispatched again from its events)",
        task.get_name(),
        exc_info=error,
    )
    logging.shutdown()
    os._exit(LOOP_FAILED_EXIT)


class Supervision:
    """Calls ``on_failed`` (default: ``exit_loop_failed``) for a watched task that ends by an
    error before ``stop``; a task cancelled, or ending by its own return, is let go."""

    def __init__(
        self, on_failed: Callable[[asyncio.Task[None]], object] = exit_loop_failed
    ) -> None:
        self.on_failed = on_failed
        self.stopping = False
        """Set by ``stop``: at shutdown a loop may end by the error of a closed connection."""

    def watch(self, *tasks: asyncio.Task[None]) -> tuple[asyncio.Task[None], ...]:
        """Watch ``tasks``; returns them."""
        for task in tasks:
            task.add_done_callback(self._ended)
        return tasks

    def stop(self) -> None:
        """From now on, let every task end as it may (the operator is stopping its parts)."""
        self.stopping = True

    def _ended(self, task: asyncio.Task[None]) -> None:
        if self.stopping or task.cancelled() or task.exception() is None:
            return
        self.on_failed(task)


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
