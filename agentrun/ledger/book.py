"""One tenant's ledger entry and the operations on it; pure (no I/O, ``now`` passed in).

The entry holds, for the current fixed window:

- ``used``: what the tenant's runs spent: tokens (input + output), cost in USD, and wall-clock
  seconds of ended runs; the elapsed time of active runs is added live (``wall_used``), so the
  wall-clock budget is charged as runs progress, not only when they end.
- ``holds``: reservations of in-flight model calls, keyed ``<run-uid>:<turn>``, each the worst
  case of its call (estimated prompt tokens + the output allowance, priced). A call starts only
  if ``used + reserved + its worst case`` stays within every limit, so concurrent turns on many
  workers cannot together overspend: the check and the record are one compare-and-set.
- ``active``: admitted runs that have not ended (``maxConcurrentRuns``), each with the run's
  cumulative usage charged so far and the turn it was charged up to.
- ``waiting``: calls that fit what is committed (``used``) but not next to other runs' holds;
  they wait for those holds to settle instead of ending the run, oldest first
  (``reserve_call``). A run ends ``tenant_budget_exhausted`` only when ``used`` plus its own
  smallest worst case exceeds a limit.
- a hold's ``spent``: what its model call used once it answered, written before the turn goes
  on, so the call is charged even if its worker dies before the turn commits (the sweep, a
  redelivery replacing the hold, or the run's close charges it as abandoned).

Settlement charges a run's *cumulative* usage after a committed turn: the ledger adds
``cumulative - charged`` only when the turn is newer than the one charged last. That makes it
idempotent (a redelivered or repeated settlement adds nothing) and order-free (a turn whose
worker died before settling is covered by the next turn's settlement or by the run's close),
and the tenant's ``used`` equals the sum of its runs' own usage exactly.
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal

from agentrun.kernel.limits import MILLION
from agentrun.ledger.entries import (
    ADMISSION_HOLD_TTL,
    BUDGET_EXHAUSTED,
    BUDGET_HELD,
    CONCURRENCY_LIMIT,
    MAX_ACTIVE_RUNS,
    WAITER_TTL,
    Active,
    BudgetRefusal,
    BudgetWait,
    CallNeed,
    Granted,
    Hold,
    TenantLimits,
    Waiter,
    window_start,
)


@dataclasses.dataclass(slots=True)
class Book:
    """One tenant's ledger entry. Operations mutate it; the store applies each to a freshly
    decoded copy and writes it back with compare-and-set, so they must stay deterministic."""

    tenant: str
    limits: TenantLimits
    window: float
    """Start of the current window, epoch seconds."""
    used_tokens: int = 0
    used_cost: Decimal = Decimal(0)
    used_wall: float = 0.0
    """Wall-clock seconds of runs ended in this window (active runs are added live)."""
    abandoned_tokens: int = 0
    """The part of ``used_tokens`` spent by model calls whose turn never committed (cancelled,
    deleted, out of time, or lost to a redelivery): spent at the provider, in no run's usage."""
    abandoned_cost: Decimal = Decimal(0)
    """The part of ``used_cost`` spent that way."""
    holds: dict[str, Hold] = dataclasses.field(default_factory=dict)
    active: dict[str, Active] = dataclasses.field(default_factory=dict)
    waiting: dict[str, Waiter] = dataclasses.field(default_factory=dict)
    """Calls waiting for holds to settle, by hold key."""

    @classmethod
    def new(cls, tenant: str, limits: TenantLimits, *, now: float) -> Book:
        """An empty entry whose window holds ``now``."""
        return cls(tenant, limits, window_start(now, limits.window_seconds))

    # --- reading --------------------------------------------------------------------------------

    @property
    def reset_time(self) -> float:
        """When the current window ends (epoch seconds)."""
        return self.window + self.limits.window_seconds

    @property
    def reserved_tokens(self) -> int:
        """Tokens held by in-flight calls."""
        return sum(h.tokens for h in self.holds.values())

    @property
    def reserved_cost(self) -> Decimal:
        """USD held by in-flight calls."""
        return sum((h.cost_usd for h in self.holds.values()), Decimal(0))

    def wall_used(self, now: float) -> float:
        """Wall-clock seconds charged in this window, active runs counted up to ``now``."""
        return self.used_wall + sum(max(0.0, now - a.since) for a in self.active.values())

    def exhausted(
        self, now: float, *, need_tokens: int = 0, need_cost: Decimal = Decimal(0)
    ) -> BudgetRefusal | None:
        """The first resource that cannot cover ``need`` (with no need: has nothing left,
        used + reserved ≥ limit), else ``None``."""
        limits = self.limits
        taken = self.used_tokens + self.reserved_tokens
        if limits.tokens is not None and (
            taken + need_tokens > limits.tokens if need_tokens else taken >= limits.tokens
        ):
            return BudgetRefusal(
                BUDGET_EXHAUSTED,
                "tokens",
                f"tokens: {self.used_tokens} used and {self.reserved_tokens} reserved of "
                f"{limits.tokens} this window"
                + (f"; a first call needs up to {need_tokens}" if need_tokens else ""),
            )
        spent = self.used_cost + self.reserved_cost
        if limits.cost_usd is not None and (
            spent + need_cost > limits.cost_usd if need_cost else spent >= limits.cost_usd
        ):
            return BudgetRefusal(
                BUDGET_EXHAUSTED,
                "costUSD",
                f"costUSD: {self.used_cost} used and {self.reserved_cost} reserved of "
                f"{limits.cost_usd} this window"
                + (f"; a first call needs up to {need_cost}" if need_cost else ""),
            )
        if limits.wall_seconds is not None and self.wall_used(now) >= limits.wall_seconds:
            return BudgetRefusal(
                BUDGET_EXHAUSTED,
                "wallClockSeconds",
                f"wallClockSeconds: {self.wall_used(now):.0f} of {limits.wall_seconds:.0f} "
                "used this window",
            )
        return None

    def expired(self, now: float) -> list[tuple[str, Hold]]:
        """Holds whose worker stopped refreshing them (presumed dead)."""
        return [(key, h) for key, h in self.holds.items() if h.expires <= now]

    # --- changing ---------------------------------------------------------------------------------

    def roll(self, now: float) -> bool:
        """Start a new window if ``now`` is past the current one: ``used`` goes to zero and
        active runs' wall-clock charge restarts at the window start. Holds and what each run
        has been charged stay. Returns True when it rolled."""
        start = window_start(now, self.limits.window_seconds)
        if start <= self.window:
            return False
        self.window = start
        self.used_tokens = 0
        self.used_cost = Decimal(0)
        self.used_wall = 0.0
        self.abandoned_tokens = 0
        self.abandoned_cost = Decimal(0)
        for run in self.active.values():
            run.since = max(run.since, start)
        return True

    def set_limits(self, limits: TenantLimits, *, now: float) -> None:
        """Apply an edited AgentTenant; a changed window length takes effect at once."""
        self.limits = limits
        self.roll(now)

    def admit(
        self,
        run_uid: str,
        namespace: str,
        name: str,
        *,
        now: float,
        need_tokens: int = 0,
        need_cost: Decimal = Decimal(0),
    ) -> BudgetRefusal | None:
        """Take a concurrency slot for a run, if one is free and the budget left covers
        ``need`` (the worst case of the run's first call; 0: anything left). The need is held
        (key ``<run-uid>:admission``) until the run's first reservation replaces it, so a run
        admitted for budget can make its first call however many are admitted at once.

        Idempotent: a run already active is admitted again without change (an operator that
        restarts mid-admission does not take two slots).
        """
        self.roll(now)
        if run_uid in self.active:
            return None
        cap = self.limits.max_concurrent_runs
        if cap is not None and len(self.active) >= cap:
            return BudgetRefusal(
                CONCURRENCY_LIMIT,
                None,
                f"{len(self.active)} of maxConcurrentRuns {cap} runs are active",
            )
        if len(self.active) >= MAX_ACTIVE_RUNS:
            return BudgetRefusal(
                CONCURRENCY_LIMIT,
                None,
                f"{len(self.active)} runs are active, the most one tenant's ledger entry holds",
            )
        if need_tokens or need_cost:
            refusal = self._admission_refusal(now, need_tokens=need_tokens, need_cost=need_cost)
        else:
            refusal = self.exhausted(now)
        if refusal is not None:
            return refusal
        self.active[run_uid] = Active(namespace, name, now)
        if need_tokens or need_cost:  # held for the first call until its worker reserves it
            self.holds[f"{run_uid}:admission"] = Hold(
                run_uid,
                -1,
                need_tokens,
                need_cost,
                now + ADMISSION_HOLD_TTL,
                "admission",
                namespace,
                name,
            )
        return None

    def _admission_refusal(
        self, now: float, *, need_tokens: int, need_cost: Decimal
    ) -> BudgetRefusal | None:
        """``BudgetExhausted`` when ``need`` does not fit what is committed (``used``), so it
        never will this window; ``BudgetHeld`` when it does, but not next to the holds in
        flight and the oldest waiting call (running runs go first); else ``None``."""
        limits = self.limits
        if limits.tokens is not None and self.used_tokens + need_tokens > limits.tokens:
            return BudgetRefusal(
                BUDGET_EXHAUSTED,
                "tokens",
                f"tokens: {self.used_tokens} used of {limits.tokens} this window; a first "
                f"call needs up to {need_tokens}",
            )
        if limits.cost_usd is not None and self.used_cost + need_cost > limits.cost_usd:
            return BudgetRefusal(
                BUDGET_EXHAUSTED,
                "costUSD",
                f"costUSD: {self.used_cost} used of {limits.cost_usd} this window; a first "
                f"call needs up to {need_cost}",
            )
        if self._wall_exhausted(now):
            return BudgetRefusal(BUDGET_EXHAUSTED, "wallClockSeconds", self._wall_message(now))
        self._drop_expired_waiters(now)
        held_tokens, held_cost = self.reserved_tokens, self.reserved_cost
        ahead = self._oldest_waiter_before("")
        if ahead is not None:
            held_tokens, held_cost = held_tokens + ahead.tokens, held_cost + ahead.cost_usd
        for resource, over in (
            (
                "tokens",
                limits.tokens is not None
                and self.used_tokens + held_tokens + need_tokens > limits.tokens,
            ),
            (
                "costUSD",
                limits.cost_usd is not None
                and self.used_cost + held_cost + need_cost > limits.cost_usd,
            ),
        ):
            if over:
                return BudgetRefusal(
                    BUDGET_HELD,
                    resource,
                    f"{resource}: {self.used_tokens} tokens / {self.used_cost} USD used and "
                    f"{held_tokens} / {held_cost} held by calls in flight or waiting; a first "
                    f"call needs up to {need_tokens} / {need_cost}",
                )
        return None

    def reserve(self, key: str, hold: Hold, *, now: float) -> BudgetRefusal | None:
        """Hold ``hold`` under ``key`` (``<run-uid>:<turn>``) if it fits within every limit.

        Fits means ``used + reserved + hold ≤ limit`` for tokens and cost (the last call that
        exactly reaches a limit is allowed) and wall-clock time left. A hold already under
        ``key`` (a redelivered turn whose first worker died) is replaced, not added to.
        """
        self.roll(now)
        previous = self.holds.pop(key, None)
        if previous is not None and previous.answered and previous.owner != hold.owner:
            # an earlier delivery's call answered and its worker is gone: the provider billed it
            self._charge_abandoned(previous)
            previous = None
        limits = self.limits
        if limits.tokens is not None:
            after = self.used_tokens + self.reserved_tokens + hold.tokens
            if after > limits.tokens:
                return self._refuse(
                    key,
                    previous,
                    "tokens",
                    f"tenant {self.tenant!r} tokens: {self.used_tokens} used + "
                    f"{self.reserved_tokens} reserved + {hold.tokens} for this call "
                    f"exceeds {limits.tokens}",
                )
        if limits.cost_usd is not None:
            cost_after = self.used_cost + self.reserved_cost + hold.cost_usd
            if cost_after > limits.cost_usd:
                return self._refuse(
                    key,
                    previous,
                    "costUSD",
                    f"tenant {self.tenant!r} costUSD: {self.used_cost} used + "
                    f"{self.reserved_cost} reserved + {hold.cost_usd} for this call "
                    f"exceeds {limits.cost_usd}",
                )
        if limits.wall_seconds is not None and self.wall_used(now) >= limits.wall_seconds:
            return self._refuse(
                key,
                previous,
                "wallClockSeconds",
                f"tenant {self.tenant!r} wallClockSeconds: {self.wall_used(now):.0f} of "
                f"{limits.wall_seconds:.0f} used",
            )
        self.holds[key] = hold
        return None

    def reserve_call(
        self, key: str, need: CallNeed, hold: Hold, *, now: float
    ) -> Granted | BudgetWait | BudgetRefusal:
        """Hold the call ``need`` under ``key`` (``hold`` gives its run, turn, owner and expiry;
        its amounts are set here), or say that it waits or why it can never run.

        - Refused when even its smallest worst case (``need.floor``) does not fit what is
          committed (``used``): used only grows in a window, so waiting would not help.
        - Waits (``BudgetWait``, recorded in ``waiting``) when it fits what is committed but
          not next to other runs' holds, or not next to the oldest earlier waiter's smallest
          worst case: waiters are served oldest first, and a newer call never takes the room
          an older one waits for.
        - Otherwise held with the largest output allowance up to ``need.output_tokens`` that
          fits (so the last calls of a window shrink to what is left instead of failing).
        """
        self.roll(now)
        self._drop_expired_waiters(now)
        previous = self.holds.get(key)
        if previous is not None and previous.owner != hold.owner:
            self.holds.pop(key)
            if previous.answered:
                self._charge_abandoned(previous)
        own = self.holds.pop(key, None)  # this owner asking again: its old hold is not a rival
        floor = need.floor
        alone = self._largest_output(need, reserved=(0, Decimal(0)))
        if alone is None or alone < floor:
            self.waiting.pop(key, None)
            return self._refuse(key, own, *self._shortfall(need, floor))
        rivals = (self.reserved_tokens, self.reserved_cost)
        ahead = self._oldest_waiter_before(key)
        if ahead is not None:
            rivals = (rivals[0] + ahead.tokens, rivals[1] + ahead.cost_usd)
        fits = self._largest_output(need, reserved=rivals)
        if fits is None or fits < floor or self._wall_exhausted(now):
            if self._wall_exhausted(now):
                self.waiting.pop(key, None)
                return self._refuse(key, own, "wallClockSeconds", self._wall_message(now))
            if own is not None:  # asked again while holding: keep what it holds
                self.holds[key] = own
            tokens, cost = need.worst(floor)
            waiter = self.waiting.get(key)
            if waiter is None:
                self.waiting[key] = Waiter(now, tokens, cost, now + WAITER_TTL)
            elif waiter.expires - now < WAITER_TTL / 2:
                waiter.expires = now + WAITER_TTL
            return BudgetWait(
                f"tenant {self.tenant!r}: {self.used_tokens} tokens / {self.used_cost} USD "
                f"used, {self.reserved_tokens} / {self.reserved_cost} held by calls in flight; "
                f"this call needs at least {tokens} / {cost}"
            )
        output = min(fits, need.output_tokens)
        tokens, cost = need.worst(output)
        hold.tokens, hold.cost_usd = tokens, cost
        self.waiting.pop(key, None)
        self.holds[key] = hold
        return Granted(output, tokens, cost)

    def _largest_output(self, need: CallNeed, *, reserved: tuple[int, Decimal]) -> int | None:
        """The largest output allowance ≤ ``need.output_tokens`` that fits next to ``used``
        and ``reserved`` (tokens, USD); ``None`` if not even the prompt fits."""
        best = need.output_tokens
        limits = self.limits
        if limits.tokens is not None:
            best = min(best, limits.tokens - self.used_tokens - reserved[0] - need.prompt_tokens)
        if limits.cost_usd is not None:
            left = limits.cost_usd - self.used_cost - reserved[1] - need.worst(0)[1]
            price = need.pricing.output_per_million
            if left < 0:
                return None
            if price > 0:
                best = min(best, int(left * MILLION // price))
        return None if best < 0 else best

    def _shortfall(self, need: CallNeed, floor: int) -> tuple[str, str]:
        """The resource a call's smallest worst case overruns on committed use, and why."""
        tokens, cost = need.worst(floor)
        limits = self.limits
        if limits.tokens is not None and self.used_tokens + tokens > limits.tokens:
            return "tokens", (
                f"tenant {self.tenant!r} tokens: {self.used_tokens} used + {tokens} for this "
                f"call exceeds {limits.tokens}"
            )
        return "costUSD", (
            f"tenant {self.tenant!r} costUSD: {self.used_cost} used + {cost} for this call "
            f"exceeds {limits.cost_usd}"
        )

    def _oldest_waiter_before(self, key: str) -> Waiter | None:
        """The oldest waiter other than ``key`` that waits longer than ``key`` (if it waits)."""
        mine = self.waiting.get(key)
        others = [(w.since, k) for k, w in self.waiting.items() if k != key]
        if not others:
            return None
        since, oldest = min(others)
        if mine is not None and (mine.since, key) < (since, oldest):
            return None
        return self.waiting[oldest]

    def _drop_expired_waiters(self, now: float) -> None:
        for key in [k for k, w in self.waiting.items() if w.expires <= now]:
            del self.waiting[key]

    def _wall_exhausted(self, now: float) -> bool:
        limit = self.limits.wall_seconds
        return limit is not None and self.wall_used(now) >= limit

    def _wall_message(self, now: float) -> str:
        return (
            f"tenant {self.tenant!r} wallClockSeconds: {self.wall_used(now):.0f} of "
            f"{self.limits.wall_seconds:.0f} used"
        )

    def stop_waiting(self, key: str) -> bool:
        """The call ``key`` no longer waits (its turn was given up); True if it did."""
        return self.waiting.pop(key, None) is not None

    def record_spend(self, key: str, *, owner: str, tokens: int, cost_usd: Decimal) -> bool:
        """The call of ``owner``'s hold answered, using ``tokens`` / ``cost_usd``: recorded on
        the hold, so it is charged even if the turn never commits. False if the hold is gone
        or not ``owner``'s."""
        hold = self.holds.get(key)
        if hold is None or hold.owner != owner:
            return False
        hold.spent_tokens, hold.spent_cost = tokens, cost_usd
        return True

    def drop_hold(self, key: str, *, committed_turn: int) -> bool:
        """Drop hold ``key`` (its worker is gone), charging its answered call as abandoned if
        its turn is newer than ``committed_turn`` (the run's last committed turn: a committed
        turn's usage is in the run's own, charged by ``settle``). True if dropped."""
        hold = self.holds.pop(key, None)
        if hold is None:
            return False
        if hold.answered and hold.turn > committed_turn:
            self._charge_abandoned(hold)
        return True

    def _charge_abandoned(self, hold: Hold) -> None:
        self.used_tokens += hold.spent_tokens
        self.used_cost += hold.spent_cost
        self.abandoned_tokens += hold.spent_tokens
        self.abandoned_cost += hold.spent_cost

    def _refuse(
        self, key: str, previous: Hold | None, resource: str, message: str
    ) -> BudgetRefusal:
        if previous is not None:
            self.holds[key] = previous
        return BudgetRefusal(BUDGET_EXHAUSTED, resource, message)

    def refresh(self, key: str, *, owner: str, expires: float) -> bool:
        """Push the expiry of ``owner``'s hold out; False if the hold is gone or not theirs."""
        hold = self.holds.get(key)
        if hold is None or hold.owner != owner:
            return False
        hold.expires = max(hold.expires, expires)
        return True

    def release(self, key: str, *, owner: str | None = None) -> bool:
        """Drop a hold without charging (its call's turn will never commit).

        With ``owner``, only that owner's hold is dropped (a replaced hold belongs to the worker
        that took the turn over). Returns True when a hold was dropped.
        """
        hold = self.holds.get(key)
        if hold is None or (owner is not None and hold.owner != owner):
            return False
        del self.holds[key]
        return True

    def abandon(self, key: str, *, owner: str, tokens: int, cost_usd: Decimal, now: float) -> bool:
        """A model call answered but its turn will never commit: charge what it really used
        (the provider bills it) and drop ``owner``'s hold. Returns False (charging nothing) if
        the hold is gone or not ``owner``'s — then the turn was settled or taken over."""
        self.roll(now)
        hold = self.holds.get(key)
        if hold is None or hold.owner != owner:
            return False
        del self.holds[key]
        self.used_tokens += tokens
        self.used_cost += cost_usd
        self.abandoned_tokens += tokens
        self.abandoned_cost += cost_usd
        return True

    def settle(
        self,
        run_uid: str,
        *,
        turn: int,
        tokens: int,
        cost_usd: Decimal,
        now: float,
        key: str | None = None,
    ) -> tuple[int, Decimal]:
        """Charge a run's cumulative usage after its committed turn ``turn``; drop hold ``key``.

        ``tokens``/``cost_usd`` are the run's totals after that turn (``.status.usage``).
        Charges ``totals - already charged`` only if ``turn`` is newer than the last charged
        one, so settling twice, late or out of order charges once. Returns what it charged.
        """
        self.roll(now)
        if key is not None:
            self.holds.pop(key, None)
        run = self.active.get(run_uid)
        if run is None or turn <= run.turn:
            return 0, Decimal(0)
        delta_tokens = max(0, tokens - run.tokens)
        delta_cost = max(Decimal(0), cost_usd - run.cost_usd)
        self.used_tokens += delta_tokens
        self.used_cost += delta_cost
        run.turn, run.tokens, run.cost_usd = (
            turn,
            max(tokens, run.tokens),
            max(cost_usd, run.cost_usd),
        )
        return delta_tokens, delta_cost

    def catch_up(
        self, run_uid: str, *, turn: int, tokens: int, cost_usd: Decimal, now: float
    ) -> None:
        """Before the run's next call reserves: settle its totals through committed turn
        ``turn`` and drop its holds of turns up to ``turn`` (they committed; their worker may
        not have settled yet — its late settlement then charges nothing more)."""
        self.settle(run_uid, turn=turn, tokens=tokens, cost_usd=cost_usd, now=now)
        for key in [k for k, h in self.holds.items() if h.run_uid == run_uid and h.turn <= turn]:
            del self.holds[key]

    def close(
        self, run_uid: str, *, turn: int, tokens: int, cost_usd: Decimal, end: float, now: float
    ) -> bool:
        """The run ended at ``end``: settle its final totals, charge its wall-clock time in this
        window, free its slot and drop any hold it left. False if it was not active."""
        self.settle(run_uid, turn=turn, tokens=tokens, cost_usd=cost_usd, now=now)
        for key in [k for k, h in self.holds.items() if h.run_uid == run_uid]:
            self.drop_hold(key, committed_turn=turn)
        for key in [k for k in self.waiting if k.startswith(f"{run_uid}:")]:
            del self.waiting[key]
        run = self.active.pop(run_uid, None)
        if run is None:
            return False
        self.used_wall += max(0.0, min(end, now) - run.since)
        return True
