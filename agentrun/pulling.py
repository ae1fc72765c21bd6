"""The shared pull loop of ``Bus.consume``: fetch one message at a time from a JetStream pull
consumer and hand each to a handler, bound again after every reconnect, re-created after a
failed fetch, and drained on stop.

What belongs here: the loop and its subscription's life. What to do with a message is the
handler's (the worker's ``TurnConsumer``, the operator's dispatcher); every other call into
nats-py is ``bus``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, Protocol

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from agentrun.natsclient import reconnections

log = logging.getLogger(__name__)

Subscribe = Callable[[], Awaitable[JetStreamContext.PullSubscription]]
"""Binds a pull consumer (``Bus.turn_subscription``, ``Bus.event_subscription``)."""
Handle = Callable[[Msg], Coroutine[Any, Any, None]]
"""Handles one fetched message (acks, naks or terms it itself)."""
HANDED_BACK: Final = "agentrun: the consumer stopped; the message is handed back"
"""The message ``consume`` cancels the handlers it stops with (``Task.cancel(msg=...)``, which
the ``CancelledError`` raised in the handler carries): the platform's cut, not one the
message's sender asked for (``handed_back``). A worker's model call so cut is charged as any
call cut before its end (``worker.budget.SpendWatch``) while one of its attempts is out: the
provider read its prompt. Cut between attempts (after a refusal, a failed connection, while
the client waits to retry), it is charged nothing: it is asked again elsewhere."""


def handed_back(cancel: BaseException) -> bool:
    """Whether ``cancel`` is ``consume`` stopping a handler (the end of a drain, or ``consume``
    itself cancelled) rather than any other cancellation (a tenant's cancel, a deadline)."""
    return isinstance(cancel, asyncio.CancelledError) and cancel.args[:1] == (HANDED_BACK,)


class Bus(Protocol):
    """What the loop needs of ``bus.Bus``: its connection, and whether it provisions (then it
    re-creates the streams after a failed fetch)."""

    nc: NATS
    provision: bool

    async def ensure_streams(self) -> None:
        """Create (or update) the streams and the workers' consumer."""


async def consume(
    bus: Bus,
    subscribe: Subscribe,
    handle: Handle,
    *,
    stopping: asyncio.Event,
    concurrency: int = 0,
    drain: float = 0.0,
) -> None:
    """Pull messages from the consumer ``subscribe`` binds and pass each to ``handle``,
    until ``stopping`` is set.

    ``concurrency`` 0 handles each message before fetching the next (in stream order);
    ``n > 0`` runs up to ``n`` handlers as tasks at once. Once ``stopping`` is set nothing
    more is fetched; handlers still running get ``drain`` seconds (from the moment the loop
    sees the stop: within a one-second poll) to finish, then are cancelled (with
    ``HANDED_BACK``), and this returns when every one has ended. Cancelling ``consume``
    itself cancels them at once, the same way.
    Messages are fetched one per pull request: nats-py's ``fetch(batch > 1)`` waits for the
    whole batch or its timeout once the stream is idle, which would delay a message by up
    to the timeout. A handler that raises is logged and the loop goes on (``_handled``). A
    fetch that fails other than as an empty poll (server restarted,
    stream lost) re-creates the subscription a second later (and, on a provisioning bus,
    the streams); after the
    connection reconnected, the subscription is bound again before the next fetch.
    """
    puller = _Puller(bus, subscribe)
    tasks: set[asyncio.Task[None]] = set()
    try:
        await _pull(puller, handle, tasks, stopping=stopping, concurrency=concurrency)
        if tasks and drain > 0:
            log.info("stopping: %d handler(s) get %.0fs to finish", len(tasks), drain)
            await asyncio.wait(tasks, timeout=drain)
    finally:
        if tasks:
            log.info("cancelling %d handler(s) still running", len(tasks))
        for task in list(tasks):
            task.cancel(msg=HANDED_BACK)
        await asyncio.gather(*tasks, return_exceptions=True)
        await puller.unbind()


async def _pull(
    puller: _Puller,
    handle: Handle,
    tasks: set[asyncio.Task[None]],
    *,
    stopping: asyncio.Event,
    concurrency: int,
) -> None:
    """The fetch loop of ``consume``: returns once ``stopping`` is set."""
    stop = asyncio.ensure_future(stopping.wait())
    try:
        while not stopping.is_set():
            if concurrency and len(tasks) >= concurrency:  # full: a slot, or the stop
                await asyncio.wait({*tasks, stop}, return_when=asyncio.FIRST_COMPLETED)
                continue
            for msg in await puller.fetch():
                if not concurrency:
                    await _handled(handle, msg)
                    continue
                task = asyncio.create_task(_handled(handle, msg))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
    finally:
        stop.cancel()


async def _handled(handle: Handle, msg: Msg) -> None:
    """``handle(msg)``; an exception it lets through (an ack or nak lost with the connection,
    a bug) is logged and the loop goes on: the message, not acked, comes again after the
    consumer's ack wait, and the other messages are not held up by it."""
    try:
        await handle(msg)
    except Exception:
        log.exception(
            "handling the message on %s failed; it comes again after the ack wait", msg.subject
        )


class _Puller:
    """One pull subscription of ``Bus.consume``, bound again after each reconnect and
    re-created (with the streams) after a failed fetch."""

    def __init__(self, bus: Bus, subscribe: Subscribe) -> None:
        self.bus = bus
        self.subscribe = subscribe
        self.sub: JetStreamContext.PullSubscription | None = None
        self.bound_at = reconnections(bus.nc)
        """The connection's reconnect count when ``sub`` was bound."""

    async def fetch(self) -> list[Msg]:
        """The next message, or none after an empty poll (one second) or a failure (the
        streams and the subscription are re-created a second later)."""
        try:
            if self.sub is not None and self.bound_at != reconnections(self.bus.nc):
                await self.unbind()
            if self.sub is None:
                self.bound_at = reconnections(self.bus.nc)
                self.sub = await self.subscribe()
            return await self.sub.fetch(batch=1, timeout=1.0)
        except (nats.errors.TimeoutError, TimeoutError):
            return []
        except Exception as err:
            log.warning("consumer: %r; re-creating streams and consumer in 1s", err)
            await self.unbind()  # dropped unsubscribed, each failure would leave one behind
            await asyncio.sleep(1.0)
            if self.bus.provision:
                with contextlib.suppress(Exception):
                    await self.bus.ensure_streams()
            return []

    async def unbind(self) -> None:
        """Unsubscribe (best effort). A subscription left registered on the connection would
        hold its inbox's interest on the server and, once a late message sat in its queue,
        hold the connection's drain at close until the drain timeout."""
        sub, self.sub = self.sub, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
