"""The bytes of events the trajectory server holds at once, across all its connections.

A follow reads a few events ahead of its client and a whole read holds the one it writes,
each up to the bus's largest message: bounded per connection by count, that is 64 follows ×
3 events × NATS's ``max_payload`` (1 MiB by default, more where configured) — more than the
pod's memory limit. One `ByteBudget` per server bounds their sum in bytes: a connection waits
(backpressure) before it takes more than remain, in the order asked, so a big event is not
passed over for ever by small ones; nothing is dropped or cut. An event larger than the whole
budget takes all of it: it is served alone.

What belongs here: the budget (asyncio, no I/O). What does not: what is charged, and when
(``server``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator


class ByteBudget:
    """At most ``total`` bytes taken at once (first come, first served): `take` waits until
    an amount fits, `give` returns it. Not thread-safe: one event loop's tasks share it."""

    def __init__(self, total: int) -> None:
        """``total``: bytes, at least 1. Raises ``ValueError`` otherwise."""
        if total < 1:
            raise ValueError(f"a byte budget of {total} holds nothing")
        self.total = total
        self.held = 0
        """Bytes taken and not given back."""
        self._waiting: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    async def take(self, size: int) -> int:
        """Wait until ``size`` bytes (at most ``total``: a larger event takes the whole
        budget, alone) fit beside what is held, behind every take that waits already, and
        take them; returns the amount taken, to `give` back. Cancelled while waiting, it takes
        nothing."""
        amount = min(max(size, 0), self.total)
        if not self._waiting and self.held + amount <= self.total:
            self.held += amount
            return amount
        entry = (amount, asyncio.get_running_loop().create_future())
        self._waiting.append(entry)
        try:
            await entry[1]
        except asyncio.CancelledError:
            if entry[1].cancelled():  # still waiting: leave the line, which may free the next
                with contextlib.suppress(ValueError):  # `_grant` may have dropped it already
                    self._waiting.remove(entry)
                self._grant()
            else:  # granted as it was cancelled
                self.give(amount)
            raise
        return amount

    def give(self, amount: int) -> None:
        """Give back ``amount`` bytes a `take` returned, and let the waiters that now fit in
        (in order) take theirs."""
        self.held -= amount
        self._grant()

    @contextlib.asynccontextmanager
    async def holding(self, size: int) -> AsyncIterator[None]:
        """`take` ``size`` bytes for the block, `give` them back after it."""
        amount = await self.take(size)
        try:
            yield
        finally:
            self.give(amount)

    def _grant(self) -> None:
        while self._waiting:
            amount, granted = self._waiting[0]
            if granted.cancelled():  # its task has not yet left the line itself
                self._waiting.popleft()
                continue
            if self.held + amount > self.total:
                return
            self._waiting.popleft()
            self.held += amount
            granted.set_result(None)
