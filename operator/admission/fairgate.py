"""Fair shares of admission work: at most a few AgentRun admissions of one namespace are worked
on at a time, first come first served within the namespace, so that a namespace applying
1,000 runs at once does not put 1,000 handlers on the operator's one event loop (and the API
server) ahead of, and beside, another namespace's one run (issue 21).

Why here: kopf runs one handler task per object as soon as its watch event arrives, all on one
event loop. Without a bound, a burst of one namespace's creations means a burst of concurrent
admissions (each reads the namespace's tenant, the Agent, the AgentModel, and writes the run's
queue and status), and another namespace's admission waits for its turn among them. With
``AdmissionGate`` the burst's handlers beyond the bound wait here, doing nothing, in arrival
order; another namespace's admission starts at once.

Order within a namespace is kept: waiters are let in first in, first out, and the tenant's
queue orders runs by creation time whatever the order their admissions end in.

What belongs here: ``Slots`` (pure: who holds, who waits, who is next) and ``AdmissionGate``
(the asyncio wrapper the admission handler enters). What does not: the admission itself
(``handlers.admission``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Hashable

LIMIT = 4
"""Default most admissions of one namespace worked on at once
(``AGENTRUN_ADMISSION_PER_NAMESPACE``)."""


@dataclasses.dataclass(slots=True)
class Slots:
    """Pure state of a per-key bound: at most ``limit`` holders per key, the others waiting
    first in, first out. Keys are namespaces here; tickets are any hashable the caller picks.

    Raises ``ValueError`` for a ``limit`` below 1."""

    limit: int
    holding: collections.Counter[Hashable] = dataclasses.field(default_factory=collections.Counter)
    waiting: dict[Hashable, collections.deque[Hashable]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ValueError(f"limit must be at least 1, not {self.limit}")

    def request(self, key: Hashable, ticket: Hashable) -> bool:
        """Ask for a slot of ``key``: True if ``ticket`` holds one now, False if it waits (it
        is then let in by a later ``release`` of ``key``, in the order it asked)."""
        if self.holding[key] < self.limit and not self.waiting.get(key):
            self.holding[key] += 1
            return True
        self.waiting.setdefault(key, collections.deque()).append(ticket)
        return False

    def release(self, key: Hashable) -> Hashable | None:
        """Give back a slot of ``key``; returns the waiting ticket that now holds it (the
        oldest), or None. Raises ``ValueError`` if ``key`` holds no slot."""
        if self.holding[key] < 1:
            raise ValueError(f"{key!r} holds no slot")
        queue = self.waiting.get(key)
        if queue:
            ticket = queue.popleft()
            if not queue:
                del self.waiting[key]
            return ticket
        self.holding[key] -= 1
        if not self.holding[key]:
            del self.holding[key]
        return None

    def withdraw(self, key: Hashable, ticket: Hashable) -> bool:
        """Take a waiting ``ticket`` out of ``key``'s line (its caller gave up); False if it
        was not waiting."""
        queue = self.waiting.get(key)
        if not queue or ticket not in queue:
            return False
        queue.remove(ticket)
        if not queue:
            del self.waiting[key]
        return True

    def waiters(self, key: Hashable) -> int:
        """How many tickets wait for a slot of ``key``."""
        return len(self.waiting.get(key, ()))


class AdmissionGate:
    """At most ``limit`` admissions per namespace at once, FIFO within the namespace (``Slots``).

    Use: ``async with gate.turn(namespace): ...``. A task cancelled while it waits leaves the
    line; one cancelled after it was let in passes its slot on."""

    def __init__(self, limit: int = LIMIT) -> None:
        self.slots = Slots(limit)

    @contextlib.asynccontextmanager
    async def turn(self, namespace: str) -> AsyncIterator[None]:
        """Hold one of ``namespace``'s slots for the body; waits while all are held."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not self.slots.request(namespace, waiter):
            try:
                await waiter
            except asyncio.CancelledError:
                if not self.slots.withdraw(namespace, waiter):  # let in as it was cancelled
                    self._pass_on(namespace)
                raise
        try:
            yield
        finally:
            self._pass_on(namespace)

    def _pass_on(self, namespace: str) -> None:
        nxt = self.slots.release(namespace)
        if isinstance(nxt, asyncio.Future) and not nxt.done():
            nxt.set_result(None)
