"""One turn's hold on its tenant's budget: reserve before the model call, settle after commit.

The order: reserve the call's worst case (``reserve_call``: held, waiting for other runs'
holds, or refused) → call the model → record what it used (``spend``, written to the hold) →
run tools → commit the turn event → settle the run's cumulative usage. A turn that never
commits (cancelled, lost the commit race, its worker shut down) gives its hold back when its
``async with`` block exits: it is released, or abandoned — charged what the model call used —
if the model had answered or its call was cut after its request went out (the provider bills
that call). A worker that dies leaves its hold to expire; the operator's ledger sweep then
drops it, charging the usage ``spend`` recorded on it — or, with none recorded, the call's
prompt bound the reservation stored on it (its request most likely went out) — unless its own
delivery committed the turn. The hold is refreshed with the turn's JetStream
heartbeat, so only a dead worker's hold expires.

Two deliveries may run one turn at once (a redelivery while the first still runs it). Each
delivery has its own ``owner`` id, which the committed turn event carries; the committer's
settlement drops every hold of the turn and charges the others' answered calls as abandoned,
and the next turn's reservation and settlement do the same for the turn before it with
``prior_owner`` (the committer its event names), so a committer that died before settling is
never charged twice. A delivery whose commit lost charges its call as it leaves
(``Book.abandon``).

``TurnHold`` keeps what one delivery knows (its owner id, whether it holds, waits, or has a
spend not yet recorded) and changes the book only through ``TurnLedger``, the port of named
operations it needs (``LedgerStore`` implements it: each operation is one compare-and-set write
of the tenant's entry).

    async with store.turn_hold(ref, ttl=...) as h:
        answer = await h.reserve_call(need, before=state)   # Granted | BudgetWait | refusal
        ...                      # the model call: await h.spend(usage) once it answered
        ...                      # commit the turn event
        await h.settle(after)    # or leave the block uncommitted: released / abandoned
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Protocol

from agentrun import kernel
from agentrun.ledger.entries import NO_CALL_OWNER, TURN_COMMITTED, BudgetRefusal, Hold
from agentrun.ledger.reserve import BudgetWait, CallNeed, Granted

log = logging.getLogger(__name__)

DEFAULT_HOLD_TTL = 60.0
"""Seconds a hold lives without a refresh (``AGENTRUN_HOLD_TTL``)."""

MovedOn = Callable[[], Awaitable[bool]]
"""Whether the run's events have moved past what a delivery built its turn on (its turn was
committed by another delivery), read from the event stream's leader."""


@dataclasses.dataclass(frozen=True, slots=True)
class TurnRef:
    """Which delivery of which turn holds budget: ``key`` ``<run-uid>:<turn>`` in the book."""

    tenant: str
    run_uid: str
    namespace: str
    name: str
    turn: int
    life: int | None = None
    """The life of the run the delivery's turn is of (the ``reruns`` its admission sealed;
    ``None``: not known): a rerun's slot, a later life's, refuses it (``Book.earlier_life``)."""

    @property
    def place(self) -> tuple[str, str]:
        """(namespace, name) of the run."""
        return self.namespace, self.name

    @property
    def key(self) -> str:
        """The hold's key in the tenant's book."""
        return f"{self.run_uid}:{self.turn}"


class TurnLedger(Protocol):
    """The ledger operations one delivery of a turn makes, each one write of the tenant's
    book (``ref.tenant``) by compare-and-set; ``LedgerStore`` implements it. ``owner`` is the
    delivery's id, ``now`` epoch seconds. Each raises ``LedgerUnavailable`` or a NATS error
    when the book cannot be written (a write whose answer was lost may still have landed)."""

    async def reserve_turn(
        self,
        ref: TurnRef,
        hold: Hold,
        *,
        before: kernel.RunState | None,
        prior_owner: str,
        now: float,
    ) -> BudgetRefusal | None:
        """Settle the run through the turn before ``ref`` (``before``: the run's state before
        this turn, if given; that turn's holds resolved by ``prior_owner``), then hold ``hold``
        under ``ref.key`` if it fits (``Book.reserve``); the refusal otherwise."""
        ...

    async def reserve_call(
        self,
        ref: TurnRef,
        need: CallNeed,
        hold: Hold,
        *,
        before: kernel.RunState | None,
        prior_owner: str,
        now: float,
    ) -> Granted | BudgetWait | BudgetRefusal:
        """As ``reserve_turn``, for the call ``need`` (``hold`` gives its run, turn, owner and
        expiry): held, waiting or refused (``Book.reserve_call``)."""
        ...

    async def record_spend(
        self, ref: TurnRef, *, owner: str, usage: kernel.Usage, answered: bool = True
    ) -> bool:
        """Write what ``owner``'s model call used (or, not ``answered``, delivered so far) on
        its hold; False if it holds none."""
        ...

    async def refresh_hold(self, ref: TurnRef, *, owner: str, expires: float) -> bool:
        """Push the expiry of ``owner``'s hold out to ``expires``; False if it holds none."""
        ...

    async def settle_turn(
        self, ref: TurnRef, *, owner: str, prior_owner: str, after: kernel.Usage, now: float
    ) -> tuple[int, Decimal]:
        """``owner`` committed turn ``ref``: resolve its holds (and the turn before's, by
        ``prior_owner``) and charge the run's cumulative usage ``after`` it; what it charged
        (tokens, USD)."""
        ...

    async def release_hold(self, ref: TurnRef, *, owner: str) -> bool:
        """Drop ``owner``'s hold uncharged; False if it holds none."""
        ...

    async def abandon_hold(
        self, ref: TurnRef, *, owner: str, usage: kernel.Usage, unrecorded: bool, now: float
    ) -> bool:
        """Drop ``owner``'s hold, charging ``usage`` as abandoned (``Book.abandon``); True if
        it charged."""
        ...

    async def stop_waiting(self, ref: TurnRef) -> bool:
        """The call of turn ``ref`` leaves the waiting calls; False if it did not wait."""
        ...


class TurnHold:
    """The ledger operations of one delivery of one turn (a fresh owner id per delivery).

    Use as ``async with``: leaving the block with the hold still taken (the turn did not
    commit) releases it, or abandons it if ``spend`` recorded a model call's usage.
    """

    def __init__(
        self,
        ledger: TurnLedger,
        ref: TurnRef,
        *,
        ttl: float = DEFAULT_HOLD_TTL,
        clock: Callable[[], float] = time.time,
        prior_owner: str = "",
        moved_on: MovedOn | None = None,
    ) -> None:
        """``prior_owner``: the delivery that committed the run's previous turn, as its turn
        event names it ("" if none or unknown); that turn's holds are resolved when this
        delivery reserves or settles. ``moved_on``: asked when a reservation is contested
        (``reserve_call``); ``None``: never asked."""
        self._ledger = ledger
        self._moved_on = moved_on
        self.prior_owner = prior_owner
        self.ref = ref
        self.key = ref.key
        self.ttl = ttl
        self.clock = clock
        self.owner = uuid.uuid4().hex[:16]
        self.held = False
        """Whether this delivery may hold budget in the book now."""
        self.spent: kernel.Usage | None = None
        """What this turn's model call used, from its answer until the turn settles."""
        self.recorded = False
        """Whether ``spent`` was written to this delivery's hold in the book (then whoever drops
        that hold charges it; otherwise leaving uncommitted charges it directly)."""
        self.waiting = False
        """Whether this delivery's call waits in the book for other runs' holds."""
        self.granted = False
        """Whether the book granted this delivery's hold and it has not given it up or
        settled since (``refresh`` then tells a hold the book no longer has)."""
        self.charged_aside = False
        """Whether this delivery's call was charged as abandoned (``abandon``)."""

    async def __aenter__(self) -> TurnHold:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.held:  # the turn did not commit (or did, but did not settle): give it back
            await asyncio.shield(self._give_back())
        elif self.waiting:  # given up while waiting: let the next waiter go first
            await asyncio.shield(self._stop_waiting())

    async def reserve(
        self, *, tokens: int, cost_usd: Decimal, before: kernel.RunState | None = None
    ) -> BudgetRefusal | None:
        """Hold ``tokens`` / ``cost_usd`` (the call's worst case) or say why it does not fit.

        ``before`` is the run's state before this turn: its totals through the last committed
        turn are settled first, in the same write, and that turn's hold dropped — so a call is
        never refused for a previous turn whose worker has not settled yet.

        Raises ``LedgerUnavailable`` or a NATS error when the ledger cannot be changed (the
        turn is then retried by redelivery, never run unreserved).
        """
        now, ref = self.clock(), self.ref
        expires = now + self.ttl
        hold = Hold(ref.run_uid, ref.turn, tokens, cost_usd, expires, self.owner, *ref.place)
        self.held = True  # if cancelled mid-write, the exit still drops it (owner-checked)
        refusal = await self._ledger.reserve_turn(
            ref, hold, before=before, prior_owner=self.prior_owner, now=now
        )
        self.held = self.granted = refusal is None
        return refusal

    async def reserve_call(
        self, need: CallNeed, *, before: kernel.RunState | None = None
    ) -> Granted | BudgetWait | BudgetRefusal:
        """Hold the call ``need`` (its output allowance shrunk to what is left, if need be),
        or learn that it waits for other runs' holds (ask again later) or can never run this
        window (``Book.reserve_call``). ``before`` as for ``reserve``.

        A turn whose book is settled is refused ``TurnCommitted`` by the book. One committed
        whose committer died before settling is not settled yet, but that committer's answered
        hold is still there: the reservation sets it aside and says so
        (``Granted.contested``), and then the run's events decide (``moved_on``): if they
        moved on, this delivery is stale and gives its hold back, refused ``TurnCommitted``
        before any model call, as the book would have refused it.

        Raises ``LedgerUnavailable`` or a NATS error when the ledger (or the events asked)
        cannot be read or changed.
        """
        now, ref = self.clock(), self.ref
        template = Hold(
            ref.run_uid, ref.turn, 0, Decimal(0), now + self.ttl, self.owner, *ref.place
        )
        self.held = True  # if cancelled mid-write, the exit still drops it (owner-checked)
        answer = await self._ledger.reserve_call(
            ref, need, template, before=before, prior_owner=self.prior_owner, now=now
        )
        self.held = self.granted = isinstance(answer, Granted)
        self.waiting = isinstance(answer, BudgetWait)
        if isinstance(answer, Granted) and answer.contested and await self._committed_elsewhere():
            await self.release()
            return BudgetRefusal(
                TURN_COMMITTED,
                None,
                f"turn {ref.turn} of run {ref.run_uid} is committed already (the run's events "
                "moved on): this delivery is stale",
            )
        return answer

    async def _committed_elsewhere(self) -> bool:
        """Whether the run's events moved on past this delivery's base (``moved_on``; False
        when there is none to ask)."""
        return self._moved_on is not None and await self._moved_on()

    async def spend(self, usage: kernel.Usage, *, answered: bool = True) -> None:
        """The model call answered with ``usage`` — or, not ``answered``, its response
        delivered that much so far: charged if the turn is abandoned now, and written to the
        hold so that it is charged even if this process dies before the turn commits (the
        hold then holds exactly ``usage`` once answered, its worst case still while the
        response streams). A failed write is logged, not raised (the turn goes on; only a
        worker dying while the ledger is also unreachable loses the charge)."""
        self.spent = usage
        self.recorded = False
        if not self.held:
            return
        try:
            self.recorded = await self._ledger.record_spend(
                self.ref, owner=self.owner, usage=usage, answered=answered
            )
        except Exception as err:
            log.warning("usage of hold %s not recorded (%r); kept in memory only", self.key, err)
            return
        if not self.recorded:
            log.info("hold %s was taken by another delivery of its turn", self.key)

    def note(self, usage: kernel.Usage) -> None:
        """The model call was abandoned (the run cancelled, its deadline, the stream broken)
        having used ``usage`` so far — mid-response, or its prompt alone before the answer:
        kept in memory, so leaving the block uncommitted charges it (``abandon``). Never
        awaits: it runs while a cancellation unwinds."""
        self.spent = usage
        self.recorded = False

    async def refresh(self) -> bool:
        """Keep the hold alive while the turn runs (called with each heartbeat). False when
        the book no longer has the hold it granted — swept as expired while this worker was
        slow (its refreshes did not land), or taken by another delivery of the turn: its budget
        is held no more, so the caller stops the model call (``TurnConsumer``); True
        otherwise, and when it holds nothing. Raises what the write raises."""
        if not self.held:
            return True
        expires = self.clock() + self.ttl
        kept = await self._ledger.refresh_hold(self.ref, owner=self.owner, expires=expires)
        return kept or not (self.held and self.granted)

    async def settle(self, after: kernel.RunState) -> None:
        """This delivery committed the turn: charge the run's cumulative usage after it
        (``after``) and drop every hold of the turn (and of the turn before, by
        ``prior_owner``). Its own call's usage is in the run's from now on, never charged as
        abandoned; another delivery's answered call is (``Book.resolve_turn``)."""
        self.spent = None
        self.granted = False  # dropped by this write: a refresh meanwhile finds it gone
        await self._ledger.settle_turn(
            self.ref,
            owner=self.commit_owner,
            prior_owner=self.prior_owner,
            after=after.usage,
            now=self.clock(),
        )
        self.held = False

    async def release(self) -> None:
        """Drop this delivery's hold without charging (its model call got no answer and was
        not cut after its request went out: it never connected, was refused, or was never
        made); a conservative charge of its prompt's bound made by whoever dropped the hold
        meanwhile is taken back (``Book.release``)."""
        await self._drop(None)

    async def abandon(self, usage: kernel.Usage) -> None:
        """Drop this delivery's hold, charging ``usage`` (a model call whose turn will never
        commit — cancelled, or another delivery of the turn committed it — or whose turn
        commits a record that holds none of it, a failure: the provider bills it either
        way). A commit of this delivery then names no owner (``commit_owner``)."""
        self.charged_aside = True
        await self._drop(usage)

    @property
    def commit_owner(self) -> str:
        """The owner a commit of this delivery's turn names, the delivery whose model call
        the record holds: ``owner``, or ``NO_CALL_OWNER`` once the call was charged aside
        (``abandon``) — named, the commit's settlement would take that charge back as the
        run's (``Book.resolve_turn``), though the record holds none of it; the turn's other
        deliveries' answered calls are still charged as abandoned."""
        return NO_CALL_OWNER if self.charged_aside else self.owner

    async def _drop(self, usage: kernel.Usage | None) -> None:
        """Drop the hold if this delivery still owns it, charging ``usage`` if given — also
        when it owns none, if ``usage`` never reached its hold (``Book.abandon``)."""
        if not self.held:
            return
        self.held = self.granted = False
        if usage is None:
            await self._ledger.release_hold(self.ref, owner=self.owner)
            return
        unrecorded = not (self.recorded and usage is self.spent)
        await self._ledger.abandon_hold(
            self.ref, owner=self.owner, usage=usage, unrecorded=unrecorded, now=self.clock()
        )

    async def _stop_waiting(self) -> None:
        """Leave the book's waiting calls, best effort: a stale waiter expires anyway."""
        self.waiting = False
        try:
            await self._ledger.stop_waiting(self.ref)
        except Exception as err:
            log.info("waiter %s not removed (%r); it expires", self.key, err)

    async def _give_back(self) -> None:
        """Release or abandon, best effort: an unreleased hold expires anyway."""
        try:
            await self._drop(self.spent)
        except Exception as err:
            log.info("hold %s not given back (%r); it expires", self.key, err)
