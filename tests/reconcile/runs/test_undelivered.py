"""The rule telling a TurnRequest the workers' consumer will never deliver from one it delivers
(``runs.undelivered.judge``), branch by branch, on figures as nats-server reports them: the
consumer's ``delivered``/``ack_floor`` stream sequences, ``num_pending``, ``num_ack_pending``,
``num_waiting``, and the work queue's message count."""

from __future__ import annotations

import pytest

from agentrun import metrics
from agentrun.bus import WorkQueue
from agentrun.operator.runs.undelivered import Verdict, judge


def queue(
    delivered: int, floor: int, pending: int, ack_pending: int, waiting: int, messages: int
) -> WorkQueue:
    """The figures of one look: the consumer's (delivered and ack floor stream sequences,
    ``num_pending``, ``num_ack_pending``, ``num_waiting``) and the stream's message count."""
    return WorkQueue(delivered, floor, pending, ack_pending, waiting, messages)


NORMAL = {
    # seq 2 fetched by a worker running it (in_progress), 3..5 behind it, no worker asking
    "a long turn in a worker's hands": (2, queue(2, 1, 3, 1, 0, 4), Verdict.IN_FLIGHT),
    # seq 2 nak'd with a delay, 3..5 delivered and in flight, an idle worker asking
    "a turn waiting out a nak's delay": (2, queue(5, 1, 0, 4, 1, 4), Verdict.IN_FLIGHT),
    "a turn queued behind busy workers": (5, queue(3, 1, 2, 2, 0, 4), Verdict.QUEUED),
    # the stream holds two messages the consumer does not account for; this one it does:
    # they pass below its ack floor once the turns before them are acked (judged then)
    "in flight beside unaccounted messages": (3, queue(3, 1, 0, 1, 0, 3), Verdict.IN_FLIGHT),
    "queued behind busy workers beside them": (7, queue(4, 2, 1, 2, 0, 5), Verdict.QUEUED),
    # figures read a moment apart that disagree (the stream read counts no message the
    # consumer does not account for): no fault is taken from them
    "at the floor, all accounted": (2, queue(3, 3, 0, 0, 1, 0), Verdict.IN_FLIGHT),
    "delivered, all accounted": (3, queue(4, 2, 0, 0, 0, 0), Verdict.IN_FLIGHT),
    "beyond delivered, all accounted": (7, queue(4, 4, 0, 0, 0, 0), Verdict.QUEUED),
}
"""(sequence, figures, verdict) the rule must leave alone."""

STUCK = {
    # nats-server #4736: after a restart, num_pending 0 and nothing awaiting an ack, the
    # stream still holding what the consumer took for delivered and acknowledged
    "the consumer counts it acknowledged": (1, queue(3, 3, 0, 0, 1, 2), Verdict.BELOW_ACK_FLOOR),
    "below the floor while turns run": (1, queue(5, 3, 0, 2, 0, 4), Verdict.BELOW_ACK_FLOOR),
    "a floor past what was delivered": (4, queue(3, 6, 0, 0, 0, 1), Verdict.BELOW_ACK_FLOOR),
    "delivered, no ack awaited": (3, queue(4, 2, 0, 0, 0, 1), Verdict.DELIVERED_NOT_PENDING),
    "beyond delivered, not counted": (7, queue(4, 4, 0, 0, 1, 1), Verdict.NOT_COUNTED),
    # nats-server #7680: counted, yet not delivered to the workers asking for it
    "counted, not delivered to idle workers": (7, queue(4, 4, 1, 0, 2, 1), Verdict.NOT_DELIVERED),
}
"""(sequence, figures, verdict) of a TurnRequest the consumer will never deliver."""


@pytest.mark.parametrize(("seq", "figures", "verdict"), NORMAL.values(), ids=NORMAL.keys())
def test_a_turn_the_consumer_delivers_or_will_deliver_is_left_alone(
    seq: int, figures: WorkQueue, verdict: Verdict
) -> None:
    assert judge(seq, figures) is verdict
    assert not verdict.stuck


@pytest.mark.parametrize(("seq", "figures", "verdict"), STUCK.values(), ids=STUCK.keys())
def test_a_turn_the_consumer_will_never_deliver_is_stuck(
    seq: int, figures: WorkQueue, verdict: Verdict
) -> None:
    assert judge(seq, figures) is verdict
    assert verdict.stuck


def test_a_paused_consumer_holds_its_queue_by_a_persons_choice() -> None:
    """Workers ask, the turn is counted, nothing is delivered: paused, that is no fault."""
    _, figures, _ = STUCK["counted, not delivered to idle workers"]
    paused = WorkQueue(**{**vars_of(figures), "paused": True})
    assert judge(7, paused) is Verdict.QUEUED


def test_a_consumer_awaiting_its_most_acks_holds_its_queue_while_workers_ask() -> None:
    """Workers ask, the turn is counted, nothing is delivered: the consumer awaits as many
    acks as its ``max_ack_pending`` allows (a JetStream account or server limit), so it
    delivers nothing until one comes; that is no fault. Below the limit, it is one."""
    full = WorkQueue(4, 2, 1, 2, 2, 3, max_ack_pending=2)
    assert judge(7, full) is Verdict.QUEUED
    room = WorkQueue(4, 2, 1, 2, 2, 3, max_ack_pending=3)
    assert judge(7, room) is Verdict.NOT_DELIVERED
    unlimited = WorkQueue(4, 2, 1, 2, 2, 3, max_ack_pending=-1)
    assert judge(7, unlimited) is Verdict.NOT_DELIVERED


def test_every_stuck_verdict_has_its_counter_reason() -> None:
    stuck = {verdict.value for verdict in Verdict if verdict.stuck}
    assert stuck == set(metrics.UNDELIVERED_REASONS)
    assert queue(2, 1, 1, 1, 0, 5).unaccounted == 3
    assert queue(2, 1, 3, 1, 0, 2).unaccounted == 0


def vars_of(figures: WorkQueue) -> dict[str, object]:
    """``figures``'s fields by name."""
    return {name: getattr(figures, name) for name in WorkQueue.__slots__}
