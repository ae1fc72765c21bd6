"""Blocking checks of what tenants write, off the event loop, fair across tenants.

A JSON Schema's first check (``schemas.known_problem``: its meta-schema, its patterns on the
linear engine) takes up to a second of CPU, and every distinct schema a tenant writes is one:
an Agent's output schema, a queued run's, an AgentEval's answer schemas, a tool server's
discovered input schemas. On the event loop's default thread pool they were served first come,
first served, beside everything else sent there: a tenant creating a thousand Agents with
distinct costly schemas queued minutes of checks in front of another tenant's admission, and
every busy thread took its share of the interpreter from the event loop.

``FairWork`` runs them on a few threads of its own, and the checks waiting for a thread are
taken in turn per *party* (the AgentTenant a namespace is bound to, or the namespace itself:
``Tenants.party``): one party's thousand checks wait behind each other, not in front of
another's one, which waits for at most one check per thread.

What belongs here: the threads and their order. What does not: what is checked (the callers'
functions).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

THREADS = 2
"""Threads checks run on at once: checks are CPU-bound Python, so more threads add no speed
on the interpreter's one lock, only take more of it from the event loop."""


class FairWork:
    """Runs blocking functions on ``threads`` threads of its own, the waiting ones in turn per
    party (round-robin, each party's own in the order they came). Use within one event loop;
    ``close`` when done."""

    def __init__(
        self, threads: int = THREADS, *, party: Callable[[str], str] | None = None
    ) -> None:
        """``threads`` (≥ 1): checks running at once; ``party``: whose turn a namespace's
        checks take (default: each namespace its own). Raises ``ValueError`` for fewer than one
        thread."""
        if threads < 1:
            raise ValueError(f"FairWork needs at least one thread, not {threads}")
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix="agentrun-check"
        )
        self._free = threads
        self._party = party or (lambda namespace: namespace)
        self._waiting: collections.OrderedDict[str, collections.deque[asyncio.Future[None]]] = (
            collections.OrderedDict()
        )

    def party(self, namespace: str) -> str:
        """Whose turn ``namespace``'s checks take (the ``party`` given; by default the
        namespace itself)."""
        return self._party(namespace)

    @property
    def waiting(self) -> int:
        """Checks waiting for a thread."""
        return sum(len(queue) for queue in self._waiting.values())

    async def run(self, namespace: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on one of the threads, once it is the turn of
        ``namespace``'s party; returns what it returns, raises what it raises. Cancelled while
        it waits, it is dropped; cancelled while it runs, the thread finishes it (a thread
        cannot be stopped) and is given to the next only then."""
        await self._turn(self._party(namespace))
        loop = asyncio.get_running_loop()
        try:
            done = self._pool.submit(functools.partial(fn, *args, **kwargs))
        except BaseException:
            self._release()
            raise
        try:
            return await asyncio.wrap_future(done)
        finally:
            if done.done():
                self._release()
            else:  # cancelled while its thread runs it: the thread is given on once it ends
                done.add_done_callback(lambda _: loop.call_soon_threadsafe(self._release))

    def close(self) -> None:
        """Stop taking checks; the running ones finish on their threads."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _turn(self, party: str) -> None:
        """Wait until a thread is ``party``'s."""
        if self._free > 0 and not self._waiting:
            self._free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(party, collections.deque()).append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release()  # given a thread as it was cancelled: give it on
            else:
                self._drop(party, waiter)
            raise

    def _drop(self, party: str, waiter: asyncio.Future[None]) -> None:
        queue = self._waiting.get(party)
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            if not queue:
                del self._waiting[party]

    def _release(self) -> None:
        """A thread is free: give it to the next party's first waiting check (that party then
        goes last), or keep it."""
        while self._waiting:
            party, queue = next(iter(self._waiting.items()))
            waiter = queue.popleft()
            if queue:
                self._waiting.move_to_end(party)
            else:
                del self._waiting[party]
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1
