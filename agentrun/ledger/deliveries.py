"""A turn run by more than one delivery: whose model call is charged how; pure like ``state``.

One turn may be run by two deliveries at once (a redelivery while the first worker still runs
it, as after a NATS outage), so every model call made must be charged exactly once: the call
the committed turn contains through the run's usage, every other call as abandoned (what it
used, or, its usage unknown, its prompt's bound). A turn event names the delivery (hold owner)
that committed it; only that tells the calls apart. So a reservation never charges another
delivery's hold of its turn (answered, or holding a call's prompt bound): it sets it aside
(key ``<run-uid>:<turn>/<owner>``) until the turn's committer is known, and
``resolve_turn`` — called by the committer's settlement, the next turn's reservation, the
sweep and the run's close with the owner read from the turn's event — drops every hold of the
turn, charging the calls of other owners as abandoned (what each recorded, or with nothing
recorded its prompt's bound: ``BookState.charge_dropped``). A delivery that leaves its turn
uncommitted charges its own call: on its hold if it still has one, directly if its usage never
reached a hold (``abandon``; ``charged`` remembers the calls others charged, so a usage write
that timed out but landed is not charged twice).

What belongs here: the operations that tell a turn's deliveries apart (``set_aside`` on a
takeover, ``resolve_turn`` once the committer is known), as functions of a ``BookState`` that
change it only through its methods. What does not: the rest of a hold's lifecycle (``state``,
``reserve``).
"""

from __future__ import annotations

from agentrun.ledger.entries import aside_key
from agentrun.ledger.state import BookState


def set_aside(book: BookState, key: str, *, owner: str) -> bool:
    """Another delivery (``owner``) reserves turn ``key``: if the hold under ``key`` is a
    different owner's whose call may have been billed (``Hold.billable``: a usage recorded on
    it, 0 included, or a model call's prompt bound), move it to ``<key>/<its owner>``, holding
    exactly what it would be charged dropped (``Hold.dropped_charge``), uncharged — whether
    that call is the one its turn commits is known only once the turn's committer is
    (``resolve_turn``); its delivery, if alive, still records its usage there
    (``BookState.record_spend``). True if the call it moved had a usage recorded
    (``Hold.recorded``, whatever the amount: the reservation is then contested, as that
    delivery may have committed the turn). A hold of no model call is left for the
    reservation to replace."""
    previous = book.hold(key)
    if previous is None or previous.owner == owner or not previous.billable:
        return False
    book.take_hold(key)
    book.put_hold(aside_key(key, previous.owner), previous.holding(*previous.dropped_charge))
    return previous.recorded


def resolve_turn(book: BookState, run_uid: str, turn: int, *, committer: str) -> int:
    """Turn ``turn`` of the run committed, by the delivery ``committer`` (the hold owner its
    turn event names): drop every hold of that turn. ``committer``'s call is in the run's
    usage (charged by ``BookState.settle``); every other delivery's call lost the commit and is
    charged as abandoned (``BookState.charge_dropped``): what it recorded, or with nothing
    recorded its prompt's bound (its worker presumed dead after its request went out; one
    alive charges what its call used beyond that as it leaves, ``BookState.abandon``, or has
    it taken back if its call never answered, ``BookState.release``). An empty ``committer``
    (an event that names none) resolves nothing. ``committer``'s own call, if the sweep
    charged it as abandoned when its hold expired (its worker was only slow), is taken back
    (``BookState.uncharge``): it is charged once, as the run's. Returns how many calls it
    charged as abandoned."""
    if not committer:
        return 0
    book.uncharge(aside_key(f"{run_uid}:{turn}", committer))
    charged = 0
    of_turn = [(k, h) for k, h in book.holds_of(run_uid) if h.turn == turn]
    for key, hold in of_turn:
        book.take_hold(key)
        if hold.owner != committer and book.charge_dropped(hold):
            charged += 1
    return charged
