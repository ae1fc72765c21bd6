"""Reserving budget: a run's admission and each model call's hold; pure like ``state``.

A run is admitted when a concurrency slot is free and the budget left covers its first call's
worst case, which is held for it until that call reserves itself (``admit``). A call holds its
worst case (estimated prompt tokens + the output allowance, priced) only if
``used + reserved + worst case`` stays within every limit. A call that fits what is committed
(``used``) but not next to other runs' holds waits for them to settle instead of ending its
run (``BudgetWait``); waiters are served oldest first, and a newer call never takes the room an
older one waits for. When it fits, the output allowance shrinks down to ``min_output_tokens``
to what is left, so the last calls of a window shrink instead of failing (``Granted``).

What belongs here: these rules, as functions of a ``BookState`` that change it only through its
methods. What does not: the entry and its bookkeeping (``state``), a turn run by two deliveries
(``deliveries``, whose ``set_aside`` a reservation applies first); ``book.Book`` names these as
its methods ``admit``, ``reserve`` and ``reserve_call``.
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal

from agentrun.kernel.limits import MILLION, Pricing
from agentrun.ledger import deliveries
from agentrun.ledger.entries import (
    ADMISSION_HOLD_TTL,
    BUDGET_EXHAUSTED,
    BUDGET_HELD,
    CONCURRENCY_LIMIT,
    MAX_ACTIVE_RUNS,
    TURN_COMMITTED,
    WAITER_TTL,
    Active,
    Amount,
    BudgetRefusal,
    Hold,
    Waiter,
    worst_case,
)
from agentrun.ledger.state import BookState


@dataclasses.dataclass(frozen=True, slots=True)
class CallNeed:
    """A model call to hold budget for: its prompt and the output allowance it may shrink."""

    prompt_tokens: int
    """An upper bound of the prompt's tokens."""
    output_tokens: int
    """The output allowance every run budget leaves (the request's ``max_tokens``)."""
    pricing: Pricing
    min_output_tokens: int = 0
    """The least allowance worth calling with; the allowance shrinks down to it to fit what
    is left (0 or ``output_tokens``: never shrinks)."""

    def worst(self, output_tokens: int) -> tuple[int, Decimal]:
        """(tokens, USD) of the call with ``output_tokens`` allowed (see ``worst_case``)."""
        return worst_case(
            prompt_tokens=self.prompt_tokens, output_tokens=output_tokens, pricing=self.pricing
        )

    @property
    def floor(self) -> int:
        """The smallest allowance it accepts."""
        return min(self.output_tokens, self.min_output_tokens or self.output_tokens)


@dataclasses.dataclass(frozen=True, slots=True)
class Granted:
    """A held call: it may start with ``output_tokens`` allowed."""

    output_tokens: int
    tokens: int
    cost_usd: Decimal
    contested: bool = False
    """Another delivery of the turn held an answered call, set aside by this reservation: that
    delivery may have committed the turn already (and died before settling it), which only
    the run's events can tell (``TurnHold.reserve_call``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class BudgetWait:
    """The call fits what is committed, but not next to other runs' holds (or an older
    waiter): it waits for them to settle and asks again."""

    message: str


def admit(
    book: BookState,
    run_uid: str,
    place: tuple[str, str],
    *,
    now: float,
    need: tuple[int, Decimal],
) -> BudgetRefusal | None:
    """Take a concurrency slot for the run at ``place`` (namespace, name), if one is free and
    the budget left covers ``need`` (tokens, USD: the worst case of the run's first call; 0:
    anything left). The need is held (key ``<run-uid>:admission``) until the run's first
    reservation replaces it, so a run admitted for budget can make its first call however many
    are admitted at once.

    Idempotent: a run already active is admitted again without change (an operator that
    restarts mid-admission does not take two slots), and a run that ended is admitted again
    without a slot (an operator that restarted before it dequeued the run admits it again,
    maybe after it ran and ended: a new slot would charge its whole usage a second time when
    the sweep closed it).
    """
    book.roll(now)
    if book.active_of(run_uid) is not None or book.has_ended(run_uid):
        return None
    slot = _slot_refusal(book)
    if slot is not None:
        return slot
    need_tokens, need_cost = need
    if need_tokens or need_cost:
        refusal = admission_refusal(book, now=now, need_tokens=need_tokens, need_cost=need_cost)
    else:
        refusal = book.exhausted(now)
    if refusal is not None:
        return refusal
    book.start_run(run_uid, Active(*place, now))
    if need_tokens or need_cost:  # held for the first call until its worker reserves it
        expires = now + ADMISSION_HOLD_TTL
        hold = Hold(run_uid, -1, need_tokens, need_cost, expires, "admission", *place)
        book.put_hold(f"{run_uid}:admission", hold)
    return None


def _slot_refusal(book: BookState) -> BudgetRefusal | None:
    """``ConcurrencyLimit`` when no concurrency slot is free (``maxConcurrentRuns``; and for a
    ledger stored as one value, ``MAX_ACTIVE_RUNS``: the most runs that value holds), else
    ``None``."""
    cap = book.limits.max_concurrent_runs
    if cap is not None and book.active_runs >= cap:
        return BudgetRefusal(
            CONCURRENCY_LIMIT,
            None,
            f"{book.active_runs} of maxConcurrentRuns {cap} runs are active",
        )
    if book.one_value and book.active_runs >= MAX_ACTIVE_RUNS:
        return BudgetRefusal(
            CONCURRENCY_LIMIT,
            None,
            f"{book.active_runs} runs are active, the most one tenant's ledger entry holds",
        )
    return None


def admission_refusal(
    book: BookState, *, now: float, need_tokens: int, need_cost: Decimal
) -> BudgetRefusal | None:
    """``BudgetExhausted`` when ``need`` does not fit what is committed (``used``), so it
    never will this window; ``BudgetHeld`` when it does, but not next to the holds in
    flight and the oldest waiting call (running runs go first); else ``None``."""
    limits = book.limits
    refusal = _beyond_used("tokens", used=book.used_tokens, need=need_tokens, limit=limits.tokens)
    refusal = refusal or _beyond_used(
        "costUSD", used=book.used_cost, need=need_cost, limit=limits.cost_usd
    )
    if refusal is not None:
        return refusal
    if _wall_exhausted(book, now):
        return BudgetRefusal(BUDGET_EXHAUSTED, "wallClockSeconds", _wall_message(book, now))
    book.drop_expired_waiters(now)
    held_tokens, held_cost = book.reserved_tokens, book.reserved_cost
    ahead = _oldest_waiter_before(book, "")
    if ahead is not None:
        held_tokens, held_cost = held_tokens + ahead.tokens, held_cost + ahead.cost_usd
    for resource, over in (
        (
            "tokens",
            limits.tokens is not None
            and book.used_tokens + held_tokens + need_tokens > limits.tokens,
        ),
        (
            "costUSD",
            limits.cost_usd is not None
            and book.used_cost + held_cost + need_cost > limits.cost_usd,
        ),
    ):
        if over:
            return BudgetRefusal(
                BUDGET_HELD,
                resource,
                f"{resource}: {book.used_tokens} tokens / {book.used_cost} USD used and "
                f"{held_tokens} / {held_cost} held by calls in flight or waiting; a first "
                f"call needs up to {need_tokens} / {need_cost}",
            )
    return None


def reserve(book: BookState, key: str, hold: Hold, *, now: float) -> BudgetRefusal | None:
    """Hold ``hold`` under ``key`` (``<run-uid>:<turn>``) if it fits within every limit.

    Fits means ``used + reserved + hold ≤ limit`` for tokens and cost (the last call that
    exactly reaches a limit is allowed) and wall-clock time left. A hold already under
    ``key`` (a redelivered turn whose first worker died) is replaced, not added to; if a usage
    of its call is recorded (0 included) or it holds a call's prompt bound, it is set aside
    uncharged until the turn's committer is known (``deliveries.set_aside``). ``hold`` is held
    as given (a prompt bound only if it carries one).
    """
    book.roll(now)
    if (stale := _stale(book, key, hold)) is not None:
        return stale
    deliveries.set_aside(book, key, owner=hold.owner)
    previous = book.take_hold(key)
    limits = book.limits
    tokens = (book.used_tokens, book.reserved_tokens, hold.tokens)
    cost = (book.used_cost, book.reserved_cost, hold.cost_usd)
    over = _over_limit("tokens", amounts=tokens, limit=limits.tokens, tenant=book.tenant)
    over = over or _over_limit("costUSD", amounts=cost, limit=limits.cost_usd, tenant=book.tenant)
    if over is not None:
        return _refuse(book, key, previous, *over)
    if limits.wall_seconds is not None and book.wall_used(now) >= limits.wall_seconds:
        return _refuse(
            book,
            key,
            previous,
            "wallClockSeconds",
            f"tenant {book.tenant!r} wallClockSeconds: {book.wall_used(now):.0f} of "
            f"{limits.wall_seconds:.0f} used",
        )
    book.put_hold(key, hold)
    return None


def reserve_call(
    book: BookState, key: str, need: CallNeed, hold: Hold, *, now: float
) -> Granted | BudgetWait | BudgetRefusal:
    """Hold the call ``need`` under ``key`` (``hold`` gives its run, turn, owner and expiry;
    its amounts are set here, on a copy), or say that it waits or why it can never run.

    - Refused ``TurnCommitted`` when its turn is settled already (a stale delivery); held
      but ``contested`` when another delivery's answered call of the turn was set aside.
    - Refused when even its smallest worst case (``need.floor``) does not fit what is
      committed (``used``): used only grows in a window, so waiting would not help.
    - Waits (``BudgetWait``, recorded in ``waiting``) when it fits what is committed but
      not next to other runs' holds, or not next to the oldest earlier waiter's smallest
      worst case: waiters are served oldest first, and a newer call never takes the room
      an older one waits for.
    - Otherwise held with the largest output allowance up to ``need.output_tokens`` that
      fits (so the last calls of a window shrink to what is left instead of failing), with
      the call's prompt bound (``Hold.prompt_tokens``, charged if dropped unrecorded).
    """
    book.roll(now)
    book.drop_expired_waiters(now)
    if (stale := _stale(book, key, hold)) is not None:
        return stale
    contested = deliveries.set_aside(book, key, owner=hold.owner)
    previous = book.hold(key)
    if previous is not None and previous.owner != hold.owner:
        book.take_hold(key)  # a hold of no call's prompt (an earlier release's): nothing to charge
    own = book.take_hold(key)  # this owner asking again: its old hold is not a rival
    floor = need.floor
    alone = _largest_output(book, need, reserved=(0, Decimal(0)))
    if alone is None or alone < floor:
        book.stop_waiting(key)
        return _refuse(book, key, own, *_shortfall(book, need, floor))
    rivals = (book.reserved_tokens, book.reserved_cost)
    ahead = _oldest_waiter_before(book, key)
    if ahead is not None:
        rivals = (rivals[0] + ahead.tokens, rivals[1] + ahead.cost_usd)
    fits = _largest_output(book, need, reserved=rivals)
    if fits is None or fits < floor or _wall_exhausted(book, now):
        if _wall_exhausted(book, now):
            book.stop_waiting(key)
            return _refuse(book, key, own, "wallClockSeconds", _wall_message(book, now))
        if own is not None:  # asked again while holding: keep what it holds
            book.put_hold(key, own)
        return _wait(book, key, need.worst(floor), now=now)
    output = min(fits, need.output_tokens)
    tokens, cost = need.worst(output)
    book.stop_waiting(key)
    book.put_hold(key, hold.holding(tokens, cost, prompt=need.worst(0)))
    return Granted(output, tokens, cost, contested)


def _stale(book: BookState, key: str, hold: Hold) -> BudgetRefusal | None:
    """``TurnCommitted`` if ``hold``'s turn is one the book has settled for its run (only a
    committed turn is settled): this delivery built on the run as it was before that commit,
    so its turn can never commit and its call would be wasted. Else ``None``."""
    run = book.active_of(hold.run_uid)
    if run is None or hold.turn > run.turn:
        return None
    book.stop_waiting(key)
    return BudgetRefusal(
        TURN_COMMITTED,
        None,
        f"turn {hold.turn} of run {hold.run_uid} is committed already: this delivery is stale",
    )


def earlier_life(book: BookState, run_uid: str, life: int | None) -> BudgetRefusal | None:
    """``TurnCommitted`` if the run's slot is a later life's than ``life`` (the life of the
    delivery asking; ``BookState.later_life``): the run runs again from turn 0 (a rerun), so
    this delivery's turn, of an earlier life whose events are gone, can never commit, and its
    call must neither be held nor settle anything in the new life's slot. Else ``None``."""
    if not book.later_life(run_uid, life):
        return None
    return BudgetRefusal(
        TURN_COMMITTED,
        None,
        f"run {run_uid} runs again as a later life than {life}: this delivery is stale",
    )


def _wait(book: BookState, key: str, least: tuple[int, Decimal], *, now: float) -> BudgetWait:
    """Record (or keep alive) the call ``key`` as a waiter needing at least ``least``
    (tokens, USD), and say why it waits."""
    tokens, cost = least
    waiter = book.waiter(key)
    if waiter is None:
        book.put_waiter(key, Waiter(now, tokens, cost, now + WAITER_TTL))
    elif waiter.expires - now < WAITER_TTL / 2:
        renewed = Waiter(waiter.since, waiter.tokens, waiter.cost_usd, now + WAITER_TTL)
        book.put_waiter(key, renewed)
    return BudgetWait(
        f"tenant {book.tenant!r}: {book.used_tokens} tokens / {book.used_cost} USD "
        f"used, {book.reserved_tokens} / {book.reserved_cost} held by calls in flight; "
        f"this call needs at least {tokens} / {cost}"
    )


def _largest_output(
    book: BookState, need: CallNeed, *, reserved: tuple[int, Decimal]
) -> int | None:
    """The largest output allowance ≤ ``need.output_tokens`` that fits next to ``used``
    and ``reserved`` (tokens, USD); ``None`` if not even the prompt fits."""
    best = need.output_tokens
    limits = book.limits
    if limits.tokens is not None:
        best = min(best, limits.tokens - book.used_tokens - reserved[0] - need.prompt_tokens)
    if limits.cost_usd is not None:
        left = limits.cost_usd - book.used_cost - reserved[1] - need.worst(0)[1]
        price = need.pricing.output_per_million
        if left < 0:
            return None
        if price > 0:
            best = min(best, int(left * MILLION // price))
    return None if best < 0 else best


def _shortfall(book: BookState, need: CallNeed, floor: int) -> tuple[str, str]:
    """The resource a call's smallest worst case overruns on committed use, and why: what it
    would hold against what is left, since the tenant's ``BudgetExhausted`` stays False
    while anything is left (its ``WithinBudget`` message says what)."""
    tokens, cost = need.worst(floor)
    limits = book.limits
    why = f"a call holds its worst case (its prompt's bound plus at least {floor} output tokens)"
    if limits.tokens is not None and book.used_tokens + tokens > limits.tokens:
        left = max(0, limits.tokens - book.used_tokens)
        return "tokens", (
            f"tenant {book.tenant!r} tokens: {book.used_tokens} used + {tokens} for this "
            f"call exceeds {limits.tokens}: {left} left this window, less than {why}"
        )
    assert limits.cost_usd is not None  # a refusal is over one of the two limits
    left_usd = max(Decimal(0), limits.cost_usd - book.used_cost)
    return "costUSD", (
        f"tenant {book.tenant!r} costUSD: {book.used_cost} used + {cost} for this call "
        f"exceeds {limits.cost_usd}: {left_usd} USD left this window, less than {why}"
    )


def _oldest_waiter_before(book: BookState, key: str) -> Waiter | None:
    """The oldest waiter other than ``key`` that waits longer than ``key`` (if it waits),
    from the totals' first waiters (``BookState.put_waiter``)."""
    mine = book.waiter(key)
    first = book.first_waiters
    others = [(w.since, k) for k, w in first.items() if k != key]
    if not others:
        return None
    since, oldest = min(others)
    if mine is not None and (mine.since, key) < (since, oldest):
        return None
    return first[oldest]


def _wall_exhausted(book: BookState, now: float) -> bool:
    limit = book.limits.wall_seconds
    return limit is not None and book.wall_used(now) >= limit


def _wall_message(book: BookState, now: float) -> str:
    return (
        f"tenant {book.tenant!r} wallClockSeconds: {book.wall_used(now):.0f} of "
        f"{book.limits.wall_seconds:.0f} used"
    )


def _beyond_used(
    resource: str, *, used: Amount, need: Amount, limit: Amount | None
) -> BudgetRefusal | None:
    """``BudgetExhausted`` when ``need`` does not fit next to what is ``used`` of ``limit``
    (``None``: unlimited) — it never will this window; else ``None``."""
    if limit is None or used + need <= limit:
        return None
    return BudgetRefusal(
        BUDGET_EXHAUSTED,
        resource,
        f"{resource}: {used} used of {limit} this window; a first call needs up to {need}",
    )


def _over_limit(
    resource: str, *, amounts: tuple[Amount, Amount, Amount], limit: Amount | None, tenant: str
) -> tuple[str, str] | None:
    """``resource`` and the refusal's message when its ``amounts`` (used, reserved, this
    call's hold: tokens, or USD) add up to more than ``limit`` (``None``: unlimited); else
    ``None``."""
    used, reserved, extra = amounts
    if limit is None or used + reserved + extra <= limit:
        return None
    return resource, (
        f"tenant {tenant!r} {resource}: {used} used + {reserved} reserved + {extra} "
        f"for this call exceeds {limit}"
    )


def _refuse(
    book: BookState, key: str, previous: Hold | None, resource: str, message: str
) -> BudgetRefusal:
    if previous is not None:
        book.put_hold(key, previous)
    return BudgetRefusal(BUDGET_EXHAUSTED, resource, message)
