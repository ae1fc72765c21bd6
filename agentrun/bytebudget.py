"""Bytes a process holds at once across its tasks, and each tenant's share of them.

A `ByteBudget` bounds a sum of bytes held at once: a task waits (backpressure) before it takes
more than remain, in the order asked, so a big amount is not passed over for ever by small
ones; nothing is dropped or cut. An amount larger than the whole budget takes all of it: it is
held alone. A tenant takes at most its share of the budget (`Shares`): its tasks wait behind
each other for room within the share, so one tenant holding much leaves the others the rest.

Two processes use it. The trajectory server bounds the events its reads and follows hold (a
follow reads a few events ahead of its client, each up to the bus's largest message: by count
alone, 64 follows × 3 events × 1 MiB, more than the pod's memory limit). The worker bounds the
memory of the turns it runs (``worker.memory``: a turn of a run at the per-run event cap holds
state and a model request of about seven times those events).

What belongs here: the budget and its shares (asyncio, no I/O). What does not: what is
charged, and when, and whose share a task takes (the callers).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Protocol


class Bytes(Protocol):
    """What a read or a follow holds its records' bytes of: a `ByteBudget`, or a tenant's
    `Share` of one."""

    async def take(self, size: int) -> int: ...

    def give(self, amount: int) -> None: ...

    def holding(self, size: int) -> contextlib.AbstractAsyncContextManager[None]: ...


class _Holding:
    """`holding`, for anything with `take` and `give`."""

    async def take(self, size: int) -> int:
        raise NotImplementedError

    def give(self, amount: int) -> None:
        raise NotImplementedError

    @contextlib.asynccontextmanager
    async def holding(self, size: int) -> AsyncIterator[None]:
        """`take` ``size`` bytes for the block, `give` them back after it."""
        amount = await self.take(size)
        try:
            yield
        finally:
            self.give(amount)


class ByteBudget(_Holding):
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


class Share(_Holding):
    """One tenant's share of a `ByteBudget`: a `take` waits for room in the share (its own
    `ByteBudget` of ``share`` bytes) first, then in the whole budget, so a tenant waits behind
    its own reads, never holding the whole budget. An event larger than the share takes all of
    the share (alone within it) and its size of the whole budget (at most all of it)."""

    def __init__(self, whole: ByteBudget, share: int) -> None:
        self.whole = whole
        self.own = ByteBudget(min(share, whole.total))

    async def take(self, size: int) -> int:
        """Take ``size`` bytes of the share, then of the whole budget (each waits its turn);
        returns the amount to `give` back. Cancelled while waiting, it takes nothing."""
        await self.own.take(size)
        try:
            return await self.whole.take(size)
        except BaseException:
            self.own.give(min(max(size, 0), self.own.total))
            raise

    def give(self, amount: int) -> None:
        """Give back ``amount`` that `take` returned, to the whole budget and the share."""
        self.whole.give(amount)
        self.own.give(min(amount, self.own.total))


class Shares:
    """The tenants' shares of one `ByteBudget`, each ``whole.total // parts`` bytes (at least
    1): a share lives while a read or follow uses it (`using`), and is forgotten after."""

    def __init__(self, whole: ByteBudget, *, parts: int) -> None:
        """``parts`` (≥ 1): how many shares the budget is cut into. Raises ``ValueError``."""
        if parts < 1:
            raise ValueError(f"a byte budget cut into {parts} shares holds nothing")
        self.whole = whole
        self.size = max(whole.total // parts, 1)
        self._shares: dict[str, tuple[Share, int]] = {}
        """party → (its share, the reads and follows using it)."""

    @contextlib.contextmanager
    def using(self, party: str) -> Iterator[Share]:
        """``party``'s share for the block (a read or a follow)."""
        share, users = self._shares.get(party) or (Share(self.whole, self.size), 0)
        self._shares[party] = (share, users + 1)
        try:
            yield share
        finally:
            share, users = self._shares[party]
            if users <= 1:
                del self._shares[party]
            else:
                self._shares[party] = (share, users - 1)
