"""Noticing that the NATS store the operator started on is gone (issue 25, disaster recovery).

When nats-server comes back with an empty store (its volume lost or wiped), the streams and
KV buckets the operator made at start are missing, or made again (the event consumer re-makes
the two main streams after a failed fetch) with another creation time. Start-up recovery
(the buckets made again, running runs whose events are gone ended ``checkpoint_failed``, the
tenants' usage rebuilt) runs only at start, so the leader exits on noticing it: its
Deployment starts it again, and that start runs the normal recovery.

Rule (``judge``): the store is lost when a watched stream is missing, or its ``created`` time
differs from the one seen at the watch's start (JetStream's identity of a stream: the same
name made anew has a new creation time). A transient outage with the store intact changes
neither: the probe fails (no judgement) and, once NATS is back, every stream shows the
creation time it had. A missing stream is believed only when two probes in a row see it gone.

What belongs here: that rule and the loop that applies it. What does not: the JetStream call
(``Bus.streams_created``), the recovery itself (``runs.recovery``, ``tenants.rebuild``).
Hand-over: only the leader runs the watch; it exits without releasing its Lease (like a leader
that lost it), so no standby acts while it may still act; the next leader (a standby, or this
pod restarted) takes the Lease once it expires and starts its own watch from the store it
starts on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import NoReturn

from agentrun import loops, protocol

log = logging.getLogger(__name__)

STORE = (
    protocol.STREAM_TURNS,
    protocol.STREAM_EVENTS,
    protocol.kv_stream(protocol.LEDGER_BUCKET),
    protocol.kv_stream(protocol.EFFECTS_BUCKET),
)
"""The streams the operator makes at start (the two KV buckets are streams too): the store
it watches."""
STORE_LOST_EXIT = 75
"""Exit status of an operator that saw its NATS store lost (EX_TEMPFAIL): its supervisor (the
Deployment) starts it again, and start-up recovery runs."""
WATCH_SECONDS = 2.0
"""Seconds between two probes: the store's loss is noticed within about two of them."""
PROBE_SECONDS = 5.0
"""Longest wait for one probe's answer (a request sent while the client reconnects would
otherwise wait for the JetStream context's timeout); a probe without an answer judges nothing."""

Created = datetime.datetime | None
"""A stream's creation time as JetStream reports it (None: the server does not say)."""
Probe = Callable[[], Awaitable[Mapping[str, Created]]]
"""Each watched stream that exists: its name → its creation time (a stream that does not exist
is left out); raises when NATS cannot be asked (no judgement then)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Loss:
    """What showed the store lost: the watched streams gone, and those made anew."""

    missing: tuple[str, ...] = ()
    remade: tuple[str, ...] = ()

    def __str__(self) -> str:
        parts = []
        if self.missing:
            parts.append(f"missing: {', '.join(self.missing)}")
        if self.remade:
            parts.append(f"made anew since the operator started: {', '.join(self.remade)}")
        return "; ".join(parts)


def judge(
    baseline: Mapping[str, Created], seen: Mapping[str, Created], watched: Sequence[str]
) -> Loss | None:
    """What shows the store lost (``str()`` of it names it), comparing ``seen`` (a probe's
    answer) with ``baseline`` (the creation times at the watch's start), or None when nothing
    does. A ``watched`` stream
    absent from ``seen`` is gone; one whose creation time both sides know and differ was made
    anew. Names are reported in ``watched``'s order."""
    missing = tuple(name for name in watched if name not in seen)
    remade = tuple(
        name
        for name in watched
        if name in seen
        and baseline.get(name) is not None
        and seen[name] is not None
        and seen[name] != baseline[name]
    )
    return Loss(missing, remade) if missing or remade else None


class StoreWatch:
    """Probes the ``watched`` streams every ``interval`` seconds from the first answer it gets
    (the baseline) and calls ``on_lost`` with what it saw once ``judge`` finds the store lost
    (a missing stream on two probes in a row; a stream made anew at once)."""

    def __init__(
        self,
        probe: Probe,
        watched: Sequence[str],
        *,
        on_lost: Callable[[str], object],
        interval: float = WATCH_SECONDS,
    ) -> None:
        self.probe = probe
        self.watched = tuple(watched)
        self.on_lost = on_lost
        self.interval = interval
        self.baseline: dict[str, Created] | None = None
        self._stopping = asyncio.Event()
        self._suspect: Loss | None = None
        """The loss the last probe saw (``None``: none), judged again by the next."""

    def stop(self) -> None:
        """End ``run`` at its next wait."""
        self._stopping.set()

    async def run(self) -> None:
        """Watch until stopped, or until the store is found lost (``on_lost`` called once)."""
        await loops.every(self.interval, self._look, what="store watch", stopping=self._stopping)

    async def _look(self) -> None:
        """One probe: a loss seen twice in a row (a stream made anew: once) stops the watch and
        calls ``on_lost``."""
        loss = await self._pass()
        if loss is not None and (self._suspect is not None or loss.remade):
            self._stopping.set()
            self.on_lost(str(loss))
        self._suspect = loss

    async def _pass(self) -> Loss | None:
        try:
            async with asyncio.timeout(PROBE_SECONDS):
                seen = await self.probe()
        except Exception as err:  # NATS away: no judgement until it answers
            log.debug("store watch: NATS not answering: %r", err)
            return None
        if self.baseline is None:
            self.baseline = dict(seen)  # a stream missing already is judged so below
        return judge(self.baseline, seen, self.watched)


def exit_store_lost(what: str) -> NoReturn:
    """Log one ERROR naming what was seen and exit with ``STORE_LOST_EXIT`` at once, keeping
    the leader Lease (see the module's "Hand-over"). Never returns."""
    log.error(
        "the NATS store this operator started on is gone (%s): exiting so that start-up "
        "recovery runs (the buckets made again, running runs whose events are lost ended "
        "checkpoint_failed, the tenants' usage rebuilt)",
        what,
    )
    logging.shutdown()
    os._exit(STORE_LOST_EXIT)
