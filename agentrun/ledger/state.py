"""One tenant's ledger entry: its state and the bookkeeping that keeps it consistent; pure
(no I/O, ``now`` passed in).

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
  they wait for those holds to settle instead of ending the run, oldest first. A run ends
  ``tenant_budget_exhausted`` only when ``used`` plus its own smallest worst case exceeds a
  limit.
- a hold's ``spent``: what its model call used once it answered, written before the turn goes
  on, so the call is charged even if its worker dies before the turn commits (the sweep, the
  turn's settlement or the run's close charges it as abandoned; for a turn run by two
  deliveries at once, see ``deliveries``).

Settlement charges a run's *cumulative* usage after a committed turn: the ledger adds
``cumulative - charged`` only when the turn is newer than the one charged last. That makes it
idempotent (a redelivered or repeated settlement adds nothing) and order-free (a turn whose
worker died before settling is covered by the next turn's settlement or by the run's close),
and the tenant's ``used`` equals the sum of its runs' own usage exactly.

What belongs here: the entry's fields, what they add up to, and every change of them — the
window's roll, settlement and a run's close, a hold's own lifecycle (record its spend, refresh,
release, abandon, drop) and the primitive puts and takes the rules elsewhere are built from.
Only this module assigns the entry's fields; everyone may read them. What does not: the rules
for reserving (``reserve``: a run's admission, a call held, waiting or refused) and for a turn
run by two deliveries (``deliveries``), which import this module and change the entry through
its methods; the entry with every operation named (``book.Book``), its JSON (``codec``).
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from typing import Self

from agentrun.ledger.entries import (
    BUDGET_EXHAUSTED,
    CHARGED_MEMORY,
    Active,
    BudgetRefusal,
    Hold,
    Seed,
    TenantLimits,
    UsageFloor,
    Waiter,
    aside_key,
    short_of,
    window_start,
)

SLACK = 1.0
"""Seconds within which ``undercuts`` takes two times of a window for the same (a floor read
from the AgentTenant status has whole seconds)."""


@dataclasses.dataclass(slots=True)
class BookState:
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
    charged: dict[str, float] = dataclasses.field(default_factory=dict)
    """Calls charged as abandoned by whoever dropped their hold: ``<run-uid>:<turn>/<owner>``
    → until when it is remembered (epoch seconds; see ``deliveries``)."""
    end: float = 0.0
    """End of the current window, epoch seconds (0 when built: ``window`` plus the window
    length). It differs from that only after the length was edited (``set_limits``): the
    current window keeps its end, and the first window after it runs from it to the next
    boundary aligned to the new length (``roll``)."""

    def __post_init__(self) -> None:
        if self.end <= self.window:
            self.end = self.window + self.limits.window_seconds

    @classmethod
    def new(cls, tenant: str, limits: TenantLimits, *, now: float) -> Self:
        """An empty entry whose window holds ``now``."""
        return cls(tenant, limits, window_start(now, limits.window_seconds))

    # --- reading ----------------------------------------------------------------------------------

    @property
    def reset_time(self) -> float:
        """When the current window ends (epoch seconds): ``end``."""
        return self.end

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
        short = short_of(
            "tokens",
            used=self.used_tokens,
            reserved=self.reserved_tokens,
            need=need_tokens,
            limit=limits.tokens,
        ) or short_of(
            "costUSD",
            used=self.used_cost,
            reserved=self.reserved_cost,
            need=need_cost,
            limit=limits.cost_usd,
        )
        if short is not None:
            return short
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

    # --- the window -------------------------------------------------------------------------------

    def roll(self, now: float) -> bool:
        """Start a new window if ``now`` is at or past the current one's ``end``: ``used``
        goes to zero and active runs' wall-clock charge restarts at the window start. Holds
        and what each run has been charged stay. Returns True when it rolled.

        The new window is the one of the current length holding ``now``, aligned to the
        epoch, except that it never starts before the old ``end``: after the length was
        edited, the first window runs from the old end to the next aligned boundary (shorter
        than the length), and every later one is aligned."""
        for key in [k for k, until in self.charged.items() if until <= now]:
            del self.charged[key]
        if now < self.end:
            return False
        length = self.limits.window_seconds
        start = window_start(now, length)
        self.window = max(self.end, start)
        self.end = start + length
        while self.end <= now:  # float rounding at a boundary: the window must hold ``now``
            self.end += length
        self.used_tokens = 0
        self.used_cost = Decimal(0)
        self.used_wall = 0.0
        self.abandoned_tokens = 0
        self.abandoned_cost = Decimal(0)
        for run in self.active.values():
            run.since = max(run.since, self.window)
        return True

    def undercuts(self, floor: UsageFloor, *, now: float) -> bool:
        """Whether this entry shows less than ``floor`` (the operator saw more in the same
        window, or saw that window end later than this entry's window began), claims a
        window that has not started at ``now``, or moved the end of the floor's window:
        a rollback by a writer of the bucket, which no rule of the ledger makes (no rule
        moves a window's end; a window begins only when the one before it ended).

        Times are compared to the second (``SLACK``): a floor read from the AgentTenant
        status has whole seconds, and windows may be as short as 1 s."""
        if self.window > now or self.end <= self.window:
            return True
        if abs(self.window - floor.window) >= SLACK:
            return self.window < floor.window or floor.end - self.window >= SLACK
        return (
            (floor.end > 0 and abs(self.end - floor.end) >= SLACK)
            or self.used_tokens < floor.tokens
            or self.used_cost < floor.cost_usd
            or self.used_wall < floor.wall_seconds
        )

    def restore(self, floor: UsageFloor, *, now: float) -> None:
        """Undo a rollback (``undercuts``): an entry in another window than the floor's goes
        back to the floor's window (its end and use the floor's; the end is ``window`` plus the
        length if the floor has none), within the floor's window ``used`` is raised to the
        floor's and a moved end put back; then the window rolls as the ledger would at ``now``
        (a floor's window that has ended gives way to the next, its use 0)."""
        end = floor.end or floor.window + self.limits.window_seconds
        if abs(self.window - floor.window) >= SLACK:
            self.window, self.end = floor.window, end
            self.used_tokens, self.used_cost = floor.tokens, floor.cost_usd
            self.used_wall = floor.wall_seconds
        else:
            if abs(self.end - end) >= SLACK:
                self.end = end
            self.used_tokens = max(self.used_tokens, floor.tokens)
            self.used_cost = max(self.used_cost, floor.cost_usd)
            self.used_wall = max(self.used_wall, floor.wall_seconds)
        self.roll(now)

    def seed(self, seed: Seed) -> None:
        """Start a book made anew (after the ledger lost it) from ``seed``, if it is of this
        window: ``used`` raised to its floor's, and its runs' slots taken (a slot already
        here stays). Else nothing."""
        floor = seed.used
        if floor.window != self.window:
            return
        self.used_tokens = max(self.used_tokens, floor.tokens)
        self.used_cost = max(self.used_cost, floor.cost_usd)
        self.used_wall = max(self.used_wall, floor.wall_seconds)
        for uid, run in seed.active.items():
            if uid not in self.active:
                self.active[uid] = dataclasses.replace(run, since=max(run.since, self.window))

    def set_limits(self, limits: TenantLimits, *, now: float) -> None:
        """Apply an edited AgentTenant at ``now``. ``used`` never changes: a lower limit
        than ``used`` leaves the tenant exhausted, a higher one frees room at once. A new
        window length applies from the end of the current window (rolled first under the
        old length if it ended before ``now``): its end does not move, and ``roll`` starts
        the windows of the new length from it, aligned to the epoch."""
        self.roll(now)
        self.limits = limits

    # --- a run's slot and its settlement ----------------------------------------------------------

    def start_run(self, run_uid: str, run: Active) -> None:
        """The run takes a concurrency slot (whoever admits it checked that one is free)."""
        self.active[run_uid] = run

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

    # --- holds ------------------------------------------------------------------------------------

    def put_hold(self, key: str, hold: Hold) -> None:
        """Hold ``hold`` under ``key``, replacing what was there (whoever puts it checked that
        it fits)."""
        self.holds[key] = hold

    def take_hold(self, key: str) -> Hold | None:
        """Remove the hold under ``key`` uncharged and return it (``None``: there was none)."""
        return self.holds.pop(key, None)

    def record_spend(self, key: str, *, owner: str, tokens: int, cost_usd: Decimal) -> bool:
        """The call of ``owner``'s hold answered, using ``tokens`` / ``cost_usd``: recorded on
        the hold, so it is charged even if the turn never commits. False if the hold is gone
        or not ``owner``'s."""
        hold = self.holds.get(key)
        if hold is None or hold.owner != owner:
            return False
        hold.spent_tokens, hold.spent_cost = tokens, cost_usd
        return True

    def refresh(self, key: str, *, owner: str, expires: float) -> bool:
        """Push the expiry of ``owner``'s hold out (also one set aside for it by another
        delivery of its turn: its worker is alive); False if it has none."""
        hold = self.holds.get(key)
        if hold is None or hold.owner != owner:
            hold = self.holds.get(aside_key(key, owner))
        if hold is None:
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

    def drop_hold(self, key: str, *, committed_turn: int) -> bool:
        """Drop hold ``key`` (its worker is gone), charging its answered call as abandoned if
        its turn is newer than ``committed_turn`` (the run's last committed turn: a committed
        turn's usage is in the run's own, charged by ``settle``). True if dropped."""
        hold = self.holds.pop(key, None)
        if hold is None:
            return False
        if hold.answered and hold.turn > committed_turn:
            self.charge_abandoned(hold)
        return True

    def charge_abandoned(self, hold: Hold) -> None:
        """Charge ``hold``'s answered call (its ``spent``) to ``used``, as abandoned: the
        provider billed it, but its turn will never commit (remembered in ``charged``). The
        hold itself is its caller's to drop."""
        memo = aside_key(f"{hold.run_uid}:{hold.turn}", hold.owner)
        self.charged[memo] = hold.expires + CHARGED_MEMORY
        self.used_tokens += hold.spent_tokens
        self.used_cost += hold.spent_cost
        self.abandoned_tokens += hold.spent_tokens
        self.abandoned_cost += hold.spent_cost

    def abandon(
        self,
        key: str,
        *,
        owner: str,
        tokens: int,
        cost_usd: Decimal,
        now: float,
        unrecorded: bool = False,
    ) -> bool:
        """A model call answered but its turn will never commit (cancelled, or another
        delivery committed it): charge what it really used (the provider bills it) and drop
        ``owner``'s hold (under ``key``, or set aside for it).

        With no such hold, it is charged only if ``unrecorded`` (its usage write did not land,
        as far as its delivery knows) and not in ``charged``: a hold that carried it was
        charged by whoever dropped it. Returns True if it charged."""
        self.roll(now)
        hold = self.holds.get(key)
        if hold is not None and hold.owner == owner:
            del self.holds[key]
        elif self.holds.pop(aside_key(key, owner), None) is None and (
            not unrecorded or aside_key(key, owner) in self.charged
        ):
            return False
        self.used_tokens += tokens
        self.used_cost += cost_usd
        self.abandoned_tokens += tokens
        self.abandoned_cost += cost_usd
        return True

    # --- waiting calls ----------------------------------------------------------------------------

    def put_waiter(self, key: str, waiter: Waiter) -> None:
        """The call ``key`` waits (or waits on, with ``waiter``'s expiry) for holds to settle."""
        self.waiting[key] = waiter

    def stop_waiting(self, key: str) -> bool:
        """The call ``key`` no longer waits (its turn was given up, held or refused); True if
        it did."""
        return self.waiting.pop(key, None) is not None

    def drop_expired_waiters(self, now: float) -> None:
        """Forget the waiters whose call stopped asking (past their expiry at ``now``)."""
        for key in [k for k, w in self.waiting.items() if w.expires <= now]:
            del self.waiting[key]
