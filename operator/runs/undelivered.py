"""The rule telling a TurnRequest the workers' consumer will never deliver from one it delivers.

What belongs here: ``judge``, pure (no I/O, no clock), over one look at the workers' consumer
(``Figures``, what ``agentrun.bus.WorkQueue`` holds) and the stream sequence of a TurnRequest
seen still in the work queue. What does not: reading the figures (``agentrun.bus``), acting on
the verdict (``orphans.OrphanWatch``).

A work-queue stream keeps a message until its consumer's ack removes it, so every message it
holds is, by the consumer's count, either delivered and awaiting its ack (``ack_pending``: all
above ``ack_floor`` and at or below ``delivered``) or still to deliver (``pending``: all above
``delivered``). A consumer whose state no longer matches the stream — restored behind its
stream after a restart, its ack floor moved past messages still stored — leaves messages that
are neither, and delivers them to nobody, for ever, with idle workers asking. A TurnRequest is
judged stuck when it provably is none of the messages the consumer accounts for, or is one it
does not deliver to workers asking:

- at or below the ack floor: the consumer counts it acknowledged (``BELOW_ACK_FLOOR``);
- at or below ``delivered`` while the consumer awaits no ack at all (``DELIVERED_NOT_PENDING``);
- above ``delivered`` while the consumer counts nothing to deliver (``NOT_COUNTED``);
- above ``delivered`` while workers wait for a message (``NOT_DELIVERED``): the consumer
  counts it but does not deliver it (an idle pull request is served at once otherwise, unless
  the consumer awaits as many acks as its ``max_ack_pending`` allows: then it delivers
  nothing until one comes).

The first three also need the stream to hold more messages than the consumer accounts for
(``unaccounted`` > 0), which they imply: figures read a moment apart that disagree are not
taken for a fault. Every other TurnRequest waits normally: delivered and in a worker's hands,
waiting out a nak's delay or its redelivery (``IN_FLIGHT``), or queued behind others while
every worker is busy, the consumer is paused or awaits its most acks (``QUEUED``). The counts
cannot tell a message the consumer lost between its ack floor and ``delivered`` from one in
flight while other acks are awaited; the floor passes it once the turns before it are acked,
and it is judged then. A stuck verdict is acted on only when it holds over several looks
(``orphans.STUCK_LOOKS``), never on one.
"""

from __future__ import annotations

import enum
from typing import Protocol


class Figures(Protocol):
    """One look at the workers' consumer and its stream (``agentrun.bus.WorkQueue``)."""

    @property
    def delivered(self) -> int:
        """The highest stream sequence delivered."""

    @property
    def ack_floor(self) -> int:
        """The stream sequence at or below which every message counts as acknowledged."""

    @property
    def pending(self) -> int:
        """Messages above ``delivered`` still to deliver."""

    @property
    def ack_pending(self) -> int:
        """Messages delivered and not acknowledged yet."""

    @property
    def waiting(self) -> int:
        """Pull requests waiting for a message."""

    @property
    def paused(self) -> bool:
        """Whether the consumer is paused."""

    @property
    def full(self) -> bool:
        """Whether the consumer awaits as many acks as its ``max_ack_pending`` allows."""

    @property
    def unaccounted(self) -> int:
        """Messages in the stream the consumer counts neither pending nor awaiting an ack."""


class Verdict(enum.StrEnum):
    """What one look says of a TurnRequest still in the work queue."""

    IN_FLIGHT = "in_flight"
    """Delivered and awaiting its ack: a worker runs it, or it waits out a nak's delay or
    ``ack_wait`` before its redelivery."""
    QUEUED = "queued"
    """Not delivered yet, behind others: every worker is busy (or the consumer is paused, or
    awaits as many acks as its ``max_ack_pending`` allows)."""
    BELOW_ACK_FLOOR = "below_ack_floor"
    """At or below the consumer's ack floor: it counts it acknowledged."""
    DELIVERED_NOT_PENDING = "delivered_not_pending"
    """At or below ``delivered`` while the consumer awaits no acknowledgement at all."""
    NOT_COUNTED = "not_counted"
    """Above ``delivered`` while the consumer counts nothing left to deliver."""
    NOT_DELIVERED = "not_delivered"
    """Above ``delivered``, counted, yet not delivered while workers wait for a message."""

    @property
    def stuck(self) -> bool:
        """Whether the consumer will never deliver the TurnRequest."""
        return self not in (Verdict.IN_FLIGHT, Verdict.QUEUED)


def judge(seq: int, queue: Figures) -> Verdict:
    """The verdict on the TurnRequest at stream sequence ``seq`` (> 0), found still in the
    work queue after ``queue`` was read (so a message acked before the read is not judged),
    by the rules of the module docstring, in their order."""
    if queue.unaccounted:
        if seq <= queue.ack_floor:
            return Verdict.BELOW_ACK_FLOOR
        if seq <= queue.delivered and not queue.ack_pending:
            return Verdict.DELIVERED_NOT_PENDING
        if seq > queue.delivered and not queue.pending:
            return Verdict.NOT_COUNTED
    if seq <= queue.delivered:
        return Verdict.IN_FLIGHT
    if queue.waiting and not queue.paused and not queue.full:
        return Verdict.NOT_DELIVERED
    return Verdict.QUEUED
