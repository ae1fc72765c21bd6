"""One tenant's ledger: its totals, the entries of its runs, and the bookkeeping that keeps them
consistent; pure (no I/O, ``now`` passed in).

The ledger holds, for the current fixed window:

- ``used``: what the tenant's runs spent: tokens (input + output), cost in USD, and wall-clock
  seconds of ended runs; the elapsed time of active runs is added live (``wall_used``), so the
  wall-clock budget is charged as runs progress, not only when they end.
- holds: reservations of in-flight model calls, keyed ``<run-uid>:<turn>``, each the worst
  case of its call (estimated prompt tokens + the output allowance, priced). A call starts only
  if ``used + reserved + its worst case`` stays within every limit, so concurrent turns on many
  workers cannot together overspend: the check and the record are one compare-and-set.
- active runs: admitted runs that have not ended (``maxConcurrentRuns``), each with the run's
  cumulative usage charged so far and the turn it was charged up to.
- waiting calls: calls that fit what is committed (``used``) but not next to other runs' holds;
  they wait for those holds to settle instead of ending the run, oldest first. A run ends
  ``tenant_budget_exhausted`` only when ``used`` plus its own smallest worst case exceeds a
  limit.
- a hold's ``spent``: what its model call used once it answered, written before the turn goes
  on, so the call is charged even if its worker dies before the turn commits (the sweep, the
  turn's settlement or the run's close charges it as abandoned; for a turn run by two
  deliveries at once, see ``deliveries``); with nothing recorded yet, the hold's call's prompt
  bound (``Hold.prompt_tokens``, stored by the reservation) is charged instead: its worker died
  after its reservation, when its request most likely went out (``charge_dropped``).

Settlement charges a run's *cumulative* usage after a committed turn: the ledger adds
``cumulative - charged`` only when the turn is newer than the one charged last. That makes it
idempotent (a redelivered or repeated settlement adds nothing) and order-free (a turn whose
worker died before settling is covered by the next turn's settlement or by the run's close),
and the tenant's ``used`` equals the sum of its runs' own usage exactly.

**Totals and run entries.** Everything about one run — its slot, its holds, its waiting calls,
the calls others charged for it — is its ``RunEntry``; the tenant's *totals* are what every
decision needs and nothing per run: ``used``, the sums of all holds (``reserved_tokens``,
``reserved_cost``), the number of active runs and the sum of their wall-clock start offsets,
and the few oldest waiting calls (``first_waiters``). So an operation on one run needs the
totals and that run's entry only, and a ``BookState`` may hold the entries of some runs only
(``runs``: those loaded; the store loads the ones an operation touches): the totals are kept
exact by the primitive puts and takes below, which every change goes through. Fully loaded,
the totals equal the sums over the entries (``totals_mismatch`` says where they do not). An
operation costs O(1) in the tenant's runs plus O(runs loaded) for the window's and the waiting
calls' housekeeping, so the store keeps few loaded.

What belongs here: the ledger's fields, what they add up to, and every change of them — the
window's roll, settlement and a run's close, a hold's own lifecycle (record its spend, refresh,
release, abandon, drop) and the primitive puts and takes the rules elsewhere are built from.
Only this module assigns the ledger's fields; everyone may read them. What does not: the rules
for reserving (``reserve``: a run's admission, a call held, waiting or refused) and for a turn
run by two deliveries (``deliveries``), which import this module and change the ledger through
its methods; the ledger with every operation named (``book.Book``), its JSON (``codec``).
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from typing import Self

from agentrun.ledger.entries import (
    BUDGET_EXHAUSTED,
    CHARGED_MEMORY,
    ENDED_MEMORY,
    FIRST_WAITERS,
    Active,
    BudgetRefusal,
    Hold,
    RunEntry,
    Seed,
    TenantLimits,
    UsageFloor,
    Waiter,
    aside_key,
    run_of,
    short_of,
    window_start,
)

SLACK = 1.0
"""Seconds within which ``undercuts`` takes two times of a window for the same (a floor read
from the AgentTenant status has whole seconds)."""
CLOCK_SKEW = 10.0
"""Seconds the clocks of the ledger's writers (operators, workers) may be apart: each rolls
a tenant's window at its own clock, so one a little ahead begins the next window first, and
``undercuts`` takes a window that begins no later than this past another's ``now`` as begun."""


@dataclasses.dataclass(slots=True)
class BookState:
    """One tenant's ledger: its totals and the entries of the runs loaded (``runs``).
    Operations mutate it; the store applies each to a freshly decoded copy and writes it back
    with compare-and-set, so they must stay deterministic."""

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
    credited_tokens: int = 0
    """Tokens taken back out of ``used_tokens`` in this window by ``uncharge`` (a call charged
    as abandoned whose turn committed after all): ``used + credited`` only grows within a
    window, which is what ``undercuts`` compares with a floor."""
    credited_cost: Decimal = Decimal(0)
    """USD taken back out of ``used_cost`` that way."""
    reserved_tokens: int = 0
    """Tokens held by in-flight calls: the sum over every run's holds."""
    reserved_cost: Decimal = Decimal(0)
    """USD held by in-flight calls: the sum over every run's holds."""
    active_runs: int = 0
    """Runs admitted and not ended (every run's ``active``)."""
    since_offsets: float = 0.0
    """The sum, over active runs, of how far into the window each one's wall-clock charge
    starts (``since_of(run) - window``, seconds): what ``wall_used`` subtracts."""
    first_waiters: dict[str, Waiter] = dataclasses.field(default_factory=dict)
    """The oldest waiting calls (at most ``FIRST_WAITERS``), by hold key; each is also in its
    run's entry."""
    runs: dict[str, RunEntry] = dataclasses.field(default_factory=dict)
    """The entries of the runs loaded, by run uid (all of them, or those an operation touches)."""
    one_value: bool = False
    """Whether the ledger is stored as one value (the ``single`` layout, ``entries.LAYOUTS``):
    then every run is loaded, and at most ``MAX_ACTIVE_RUNS`` runs may be active."""
    end: float = 0.0
    """End of the current window, epoch seconds (0 when built: ``window`` plus the window
    length). It differs from that only after the length was edited (``set_limits``): the
    current window keeps its end, and the first window after it runs from it to the next
    boundary aligned to the new length (``roll``)."""

    def __post_init__(self) -> None:
        if self.end <= self.window:
            self.end = self.window + self.limits.window_seconds

    @classmethod
    def new(cls, tenant: str, limits: TenantLimits, *, now: float, one_value: bool = False) -> Self:
        """An empty ledger whose window holds ``now`` (stored as one value if ``one_value``)."""
        window = window_start(now, limits.window_seconds)
        return cls(tenant, limits, window, one_value=one_value)

    # --- reading ----------------------------------------------------------------------------------

    @property
    def reset_time(self) -> float:
        """When the current window ends (epoch seconds): ``end``."""
        return self.end

    @property
    def holds(self) -> dict[str, Hold]:
        """Every hold of the runs loaded, by key (a new dict: change holds through methods)."""
        return {key: hold for entry in self.runs.values() for key, hold in entry.holds.items()}

    @property
    def active(self) -> dict[str, Active]:
        """The active runs loaded, by uid (a new dict)."""
        return {uid: e.active for uid, e in self.runs.items() if e.active is not None}

    @property
    def waiting(self) -> dict[str, Waiter]:
        """The waiting calls of the runs loaded, by hold key (a new dict)."""
        return {key: w for entry in self.runs.values() for key, w in entry.waiting.items()}

    @property
    def charged(self) -> dict[str, float]:
        """The calls charged as abandoned of the runs loaded: ``<run-uid>:<turn>/<owner>`` →
        until when it is remembered (a new dict)."""
        return {key: t for entry in self.runs.values() for key, t in entry.charged.items()}

    def hold(self, key: str) -> Hold | None:
        """The hold under ``key`` (its run must be loaded), or ``None``."""
        entry = self.runs.get(run_of(key))
        return None if entry is None else entry.holds.get(key)

    def holds_of(self, run_uid: str) -> list[tuple[str, Hold]]:
        """The holds of one run (loaded), by key."""
        entry = self.runs.get(run_uid)
        return [] if entry is None else list(entry.holds.items())

    def forgettable(self, now: float) -> list[str]:
        """The runs loaded that hold nothing but memories (that they ended, calls charged as
        abandoned), every one expired by ``now``: a roll at ``now`` empties their entries,
        which then go (the sweep does, so an ended run's entry does not stay for ever)."""
        return [
            uid
            for uid, e in self.runs.items()
            if e.active is None
            and not (e.holds or e.waiting)
            and (e.ended or e.charged)
            and e.ended <= now
            and all(until <= now for until in e.charged.values())
        ]

    def forget_end(self, run_uid: str) -> None:
        """The run (its entry loaded) is no longer remembered as ended: its next admission is
        a new one (a run freed to run again from turn 0)."""
        entry = self.runs.get(run_uid)
        if entry is not None:
            entry.ended = 0.0

    def has_ended(self, run_uid: str) -> bool:
        """Whether the run (its entry loaded) is remembered as ended (``RunEntry.ended``)."""
        entry = self.runs.get(run_uid)
        return entry is not None and entry.ended > 0

    def active_of(self, run_uid: str) -> Active | None:
        """The run's slot and charges if it is active (its entry must be loaded)."""
        entry = self.runs.get(run_uid)
        return None if entry is None else entry.active

    def waiter(self, key: str) -> Waiter | None:
        """The waiting call ``key`` (its run loaded), or ``None``."""
        entry = self.runs.get(run_of(key))
        return None if entry is None else entry.waiting.get(key)

    def remembers_charged(self, memo: str) -> bool:
        """Whether the call ``<run-uid>:<turn>/<owner>`` was charged as abandoned by whoever
        dropped its hold (and is still remembered)."""
        entry = self.runs.get(run_of(memo))
        return entry is not None and memo in entry.charged

    def since_of(self, run: Active) -> float:
        """When the run's wall-clock charge in this window starts: its own ``since``, or the
        window's start if it was admitted in an earlier window."""
        return max(run.since, self.window)

    def slot_since(self, run_uid: str) -> float | None:
        """When the run's slot's charge starts in this window (``since_of``; its entry
        loaded), or ``None`` if it holds no slot: what tells its entries apart across its
        lives (a rerun's slot starts later; the sweep's ``Repair.since``). A window's roll
        moves an older slot's start to the window's."""
        run = self.active_of(run_uid)
        return None if run is None else self.since_of(run)

    def later_life(self, run_uid: str, life: int | None) -> bool:
        """Whether the run's slot (its entry loaded) was admitted for a later life of the run
        than ``life`` (its ``status.reruns``; ``None``: not known): a rerun admitted while
        something of an earlier life — its close, its release, a stale delivery of one of its
        turns — was still on its way. What an earlier life does by the run's uid must then
        leave the slot, its charges and its holds alone. False when either life is not known
        (a slot of an earlier release, a caller that names none) or the run holds no slot."""
        run = self.active_of(run_uid)
        if run is None or run.life is None or life is None:
            return False
        return run.life > life

    def name_life(self, run_uid: str, life: int | None) -> None:
        """Record that the run's slot (its entry loaded) was admitted for its life ``life``
        (``Active.life``), if the slot names none yet: a slot just taken by its admission, or
        one an earlier release took. A slot that names a life keeps it (an admission done again
        is the same life's). Nothing for a run holding no slot or a ``life`` of ``None``."""
        run = self.active_of(run_uid)
        if run is not None and run.life is None:
            run.life = life

    def wall_used(self, now: float) -> float:
        """Wall-clock seconds charged in this window, active runs counted up to ``now``."""
        live = self.active_runs * (now - self.window) - self.since_offsets
        return self.used_wall + max(0.0, live)

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
        """Holds of the runs loaded whose worker stopped refreshing them (presumed dead)."""
        return [(key, h) for key, h in self.holds.items() if h.expires <= now]

    def totals_mismatch(self) -> list[str]:
        """Where the totals differ from the sums over the run entries (meaningful only when
        every run is loaded): one line per total, empty when they agree."""
        holds = [h for entry in self.runs.values() for h in entry.holds.values()]
        active = [e.active for e in self.runs.values() if e.active is not None]
        sums: dict[str, tuple[object, object]] = {
            "reserved_tokens": (self.reserved_tokens, sum(h.tokens for h in holds)),
            "reserved_cost": (self.reserved_cost, sum((h.cost_usd for h in holds), Decimal(0))),
            "active_runs": (self.active_runs, len(active)),
        }
        found = [f"{name}: totals {a}, entries {b}" for name, (a, b) in sums.items() if a != b]
        offsets = sum(self.since_of(run) - self.window for run in active)
        if abs(offsets - self.since_offsets) > 1e-6 * max(1, len(active)):
            found.append(f"since_offsets: totals {self.since_offsets}, entries {offsets}")
        stray = [k for k in self.first_waiters if self.waiter(k) != self.first_waiters[k]]
        if stray:
            found.append(f"first_waiters not in their runs' entries: {sorted(stray)}")
        return found

    def recount(self) -> None:
        """Set the totals to the sums over the entries loaded (every run of the tenant must
        be): for a ledger made anew over the run entries a lost totals value left behind."""
        holds = [h for entry in self.runs.values() for h in entry.holds.values()]
        active = self._active_loaded()
        self.reserved_tokens = sum(h.tokens for h in holds)
        self.reserved_cost = sum((h.cost_usd for h in holds), Decimal(0))
        self.active_runs = len(active)
        self.since_offsets = sum(self.since_of(run) - self.window for run in active)
        waiting = sorted(self.waiting.items(), key=lambda kw: (kw[1].since, kw[0]))
        self.first_waiters = dict(waiting[:FIRST_WAITERS])

    # --- the window -------------------------------------------------------------------------------

    def roll(self, now: float) -> bool:
        """Start a new window if ``now`` is at or past the current one's ``end``: ``used``
        goes to zero and active runs' wall-clock charge restarts at the window start. Holds
        and what each run has been charged stay. Forgets the loaded runs' expired memos of
        abandoned calls and of ended runs. Returns True when it rolled.

        The new window is the one of the current length holding ``now``, aligned to the
        epoch, except that it never starts before the old ``end``: after the length was
        edited, the first window runs from the old end to the next aligned boundary (shorter
        than the length), and every later one is aligned."""
        for entry in self.runs.values():
            if entry.charged:
                for key in [k for k, until in entry.charged.items() if until <= now]:
                    del entry.charged[key]
                    entry.spent.pop(key, None)
            if entry.ended and entry.ended <= now:
                entry.ended = 0.0
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
        self.credited_tokens = 0
        self.credited_cost = Decimal(0)
        # runs not loaded started before the old end, so by the new window: their offset is 0
        self.since_offsets = sum(self.since_of(run) - self.window for run in self._active_loaded())
        for run in self._active_loaded():
            run.since = self.since_of(run)
        return True

    def _active_loaded(self) -> list[Active]:
        return [e.active for e in self.runs.values() if e.active is not None]

    def undercuts(self, floor: UsageFloor, *, now: float) -> bool:
        """Whether this entry shows less than ``floor`` (the operator saw more in the same
        window, or saw that window end later than this entry's window began), claims a
        window that has not started at ``now`` (``CLOCK_SKEW`` allowed), or moved the end of
        the floor's window:
        a rollback by a writer of the bucket, which no rule of the ledger makes (no rule
        moves a window's end; a window begins only when the one before it ended).

        Times are compared to the second (``SLACK``): a floor read from the AgentTenant
        status has whole seconds, and windows may be as short as 1 s."""
        if self.window - now > CLOCK_SKEW or self.end <= self.window:
            return True
        if abs(self.window - floor.window) >= SLACK:
            return self.window < floor.window or floor.end - self.window >= SLACK
        tokens, cost, wall = self.usage_floor()
        return (
            (floor.end > 0 and abs(self.end - floor.end) >= SLACK)
            or tokens < floor.tokens
            or cost < floor.cost_usd
            or wall < floor.wall_seconds
        )

    def usage_floor(self) -> tuple[int, Decimal, float]:
        """What the window has used as a floor compares it (tokens, USD, wall seconds): ``used``
        with what ``uncharge`` took back out of it (``credited``), so a figure that never goes
        down within a window; ``used`` itself goes down when a charge is taken back."""
        return (
            self.used_tokens + self.credited_tokens,
            self.used_cost + self.credited_cost,
            self.used_wall,
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
            self.credited_tokens, self.credited_cost = 0, Decimal(0)
        else:
            if abs(self.end - end) >= SLACK:
                self.end = end
            self.used_tokens = max(self.used_tokens, floor.tokens - self.credited_tokens)
            self.used_cost = max(self.used_cost, floor.cost_usd - self.credited_cost)
            self.used_wall = max(self.used_wall, floor.wall_seconds)
        self.roll(now)

    def seed(self, seed: Seed) -> None:
        """Start a book made anew (after the ledger lost it) from ``seed``, if it is of this
        window: ``used`` raised to its floor's, and its runs' slots taken. A slot already here
        (an entry the lost ledger left, or an earlier attempt at this book wrote before it
        stopped) stays, charged at least what the seed counts for its run (the floor holds
        that much of it: its next settlement must not charge it again). Else nothing."""
        floor = seed.used
        if floor.window != self.window:
            return
        self.used_tokens = max(self.used_tokens, floor.tokens)
        self.used_cost = max(self.used_cost, floor.cost_usd)
        self.used_wall = max(self.used_wall, floor.wall_seconds)
        for uid, run in seed.active.items():
            here = self.active_of(uid)
            if here is None:
                self.start_run(uid, dataclasses.replace(run, since=max(run.since, self.window)))
            else:
                here.tokens = max(here.tokens, run.tokens)
                here.cost_usd = max(here.cost_usd, run.cost_usd)

    def set_limits(self, limits: TenantLimits, *, now: float) -> None:
        """Apply an edited AgentTenant at ``now``. ``used`` never changes: a lower limit
        than ``used`` leaves the tenant exhausted, a higher one frees room at once. A new
        window length applies from the end of the current window (rolled first under the
        old length if it ended before ``now``): its end does not move, and ``roll`` starts
        the windows of the new length from it, aligned to the epoch."""
        self.roll(now)
        self.limits = limits

    # --- a run's entry ----------------------------------------------------------------------------

    def load(self, run_uid: str, entry: RunEntry) -> None:
        """Add a run's stored entry to the loaded ones (the store does, before an operation;
        the totals already count it)."""
        self.runs[run_uid] = entry

    def unload(self, run_uid: str) -> None:
        """Drop a run's entry from the loaded ones (it stays in the totals' sums: the store
        keeps the rest of the ledger for its next change)."""
        self.runs.pop(run_uid, None)

    def _entry(self, run_uid: str) -> RunEntry:
        """The run's loaded entry, a new empty one if it has none (the store loads every run
        an operation touches, so a missing one is a run with nothing in the ledger)."""
        entry = self.runs.get(run_uid)
        if entry is None:
            entry = self.runs[run_uid] = RunEntry()
        return entry

    # --- a run's slot and its settlement ----------------------------------------------------------

    def start_run(self, run_uid: str, run: Active) -> None:
        """The run takes a concurrency slot (whoever admits it checked that one is free)."""
        entry = self._entry(run_uid)
        if entry.active is not None:
            self._end_run(entry)
        entry.active = run
        self.active_runs += 1
        self.since_offsets += self.since_of(run) - self.window

    def _end_run(self, entry: RunEntry) -> Active | None:
        run, entry.active = entry.active, None
        if run is not None:
            self.active_runs -= 1
            self.since_offsets -= self.since_of(run) - self.window
            if self.active_runs == 0:
                self.since_offsets = 0.0  # no float residue once nothing runs
        return run

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
            self.take_hold(key)
        run = self.active_of(run_uid)
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
        for key in [k for k, h in self.holds_of(run_uid) if h.turn <= turn]:
            self.take_hold(key)

    def close(
        self, run_uid: str, *, turn: int, tokens: int, cost_usd: Decimal, end: float, now: float
    ) -> bool:
        """The run ended at ``end``: settle its final totals, charge its wall-clock time in this
        window, free its slot and drop any hold it left. False if it was not active.

        The run is remembered as ended (``RunEntry.ended``, for ``ENDED_MEMORY``), so an
        admission of it done again takes no slot; ``forget_end`` undoes that for a run freed
        to run again from turn 0 (a rerun)."""
        self.settle(run_uid, turn=turn, tokens=tokens, cost_usd=cost_usd, now=now)
        for key, _ in self.holds_of(run_uid):
            self.drop_hold(key, committed_turn=turn)
        entry = self._entry(run_uid)
        for key in list(entry.waiting):
            self.stop_waiting(key)
        run = entry.active
        if run is None:
            return False
        entry.ended = now + ENDED_MEMORY
        since = self.since_of(run)
        self._end_run(entry)
        self.used_wall += max(0.0, min(end, now) - since)
        return True

    # --- holds ------------------------------------------------------------------------------------

    def put_hold(self, key: str, hold: Hold) -> None:
        """Hold ``hold`` under ``key``, replacing what was there (whoever puts it checked that
        it fits)."""
        self.take_hold(key)
        self._entry(run_of(key)).holds[key] = hold
        self.reserved_tokens += hold.tokens
        self.reserved_cost += hold.cost_usd

    def take_hold(self, key: str) -> Hold | None:
        """Remove the hold under ``key`` uncharged and return it (``None``: there was none)."""
        entry = self.runs.get(run_of(key))
        hold = None if entry is None else entry.holds.pop(key, None)
        if hold is not None:
            self.reserved_tokens -= hold.tokens
            self.reserved_cost -= hold.cost_usd
        return hold

    def record_spend(
        self, key: str, *, owner: str, tokens: int, cost_usd: Decimal, answered: bool = True
    ) -> bool:
        """The call of ``owner``'s hold answered, using ``tokens`` / ``cost_usd``: recorded on
        the hold (``Hold.recorded``, 0 included), so it is charged that even if the turn never
        commits, never its prompt's bound; and the hold now holds exactly that — the call can
        spend nothing more, so what its worst case held beyond it is free for other calls at
        once, and a call that used more than its worst case (a provider counting prompt tokens
        it was not sent) is held for all it used. So ``used +
        reserved`` is exact from the answer until the turn settles (or its worker's dead hold
        is resolved). Not ``answered`` (its response still streams, this much delivered so
        far), it is recorded the same but the hold keeps holding at least its worst case: the
        rest of the allowance may still come. A hold a redelivery of the turn set aside for
        ``owner`` (``<key>/<owner>``) is still its call's: its answer, or anything once its
        call recorded something, is recorded there. False if ``owner`` has no hold of the
        turn, or for what a response delivered so far (not ``answered``) on one set aside with
        nothing recorded: that hold holds no more than its call's prompt bound, not its worst
        case, so its delivery stops the call (as ``refresh`` says) and charges what it used as
        it leaves (``abandon``)."""
        hold = self.hold(key)
        if hold is None or hold.owner != owner:
            hold = self.hold(aside_key(key, owner))
            if hold is None or not (hold.recorded or answered):
                return False
        held_tokens, held_cost = tokens, cost_usd
        if not answered:
            held_tokens, held_cost = max(hold.tokens, tokens), max(hold.cost_usd, cost_usd)
        self.reserved_tokens += held_tokens - hold.tokens
        self.reserved_cost += held_cost - hold.cost_usd
        hold.tokens, hold.cost_usd = held_tokens, held_cost
        hold.spent_tokens, hold.spent_cost, hold.recorded = tokens, cost_usd, True
        return True

    def refresh(self, key: str, *, owner: str, expires: float) -> bool:
        """Push the expiry of ``owner``'s hold out (also one set aside for it by another
        delivery of its turn once something of its call is recorded there: its worker is
        alive); False if it has none, or only one set aside with nothing recorded, which holds
        no more than its call's prompt bound — its call no longer has its worst case held, so
        its delivery stops it (charged what it used as it leaves), as if the hold were gone."""
        hold = self.hold(key)
        if hold is None or hold.owner != owner:
            hold = self.hold(aside_key(key, owner))
            if hold is None or not hold.recorded:
                return False
        hold.expires = max(hold.expires, expires)
        return True

    def release(self, key: str, *, owner: str | None = None) -> bool:
        """Drop a hold without charging (its call's turn will never commit, and its call got
        no answer: it never connected, was refused, or was never made).

        With ``owner``, only that owner's hold is dropped (a replaced hold belongs to the worker
        that took the turn over), also one set aside for it by another delivery of its turn;
        and if it has none left because someone else dropped it and charged its call its
        prompt's bound (``charge_dropped``: its worker seemed dead, but was only slow), that
        charge is taken back — the owner knows its call was never answered nor noted (a live
        worker's own failure charges nothing). Returns True when a hold was dropped.
        """
        hold = self.hold(key)
        if hold is not None and (owner is None or hold.owner == owner):
            self.take_hold(key)
            return True
        if owner is None:
            return False
        memo = aside_key(key, owner)
        if self.take_hold(memo) is not None:
            return True
        self._take_back(memo)
        return False

    def drop_hold(self, key: str, *, committed_turn: int) -> bool:
        """Drop hold ``key`` (its worker is gone), charging its call as abandoned if its turn
        is newer than ``committed_turn`` (the run's last committed turn: a committed turn's
        usage is in the run's own, charged by ``settle``): what it recorded, or with nothing
        recorded its prompt's bound (``charge_dropped``). True if dropped."""
        hold = self.take_hold(key)
        if hold is None:
            return False
        if hold.turn > committed_turn:
            self.charge_dropped(hold)
        return True

    def load_memo(self, memo: str, until: float) -> None:
        """Remember that the call ``<run-uid>:<turn>/<owner>`` was charged as abandoned, until
        ``until`` (epoch seconds): a memo read from an earlier release's ledger."""
        self._entry(run_of(memo)).charged[memo] = until

    def load_spent(self, memo: str, tokens: int, cost_usd: Decimal) -> None:
        """What the call ``memo`` (charged as abandoned, ``load_memo``) was charged: read from
        a one-value ledger, where it is kept beside the memo."""
        self._entry(run_of(memo)).spent[memo] = (tokens, cost_usd)

    def load_end(self, run_uid: str, until: float) -> None:
        """Remember the run as ended until ``until`` (epoch seconds): read from a one-value
        ledger (``RunEntry.ended``)."""
        self._entry(run_uid).ended = until

    def split_out(self) -> None:
        """The ledger is to be stored split (totals and run entries) from now on: no longer
        capped at ``MAX_ACTIVE_RUNS`` active runs (``one_value``)."""
        self.one_value = False

    def charge_dropped(self, hold: Hold) -> bool:
        """Charge ``hold``'s call to ``used``, as abandoned, as whoever drops the hold of
        another delivery (the sweep, a run's close, its turn resolved by another committer):
        the provider billed it, but its turn will never commit. What it charges is
        ``Hold.dropped_charge``: the usage recorded on it (``Hold.recorded``, 0 included: a
        recorded 0 charges nothing and is not remembered, so a delivery alive whose later
        record missed the hold charges all its call used as it leaves), or with none its
        prompt's bound —
        the conservative bound of a call whose worker died (or was cut off) after its
        reservation, when its request most likely went out; nothing for a hold of no model
        call (the admission's). Remembered in its run's ``charged`` with what it was charged,
        so a delivery that was only slow is charged what its call used beyond that as it
        leaves (``abandon``), has it taken back if its turn commits by it (``uncharge``) or if
        its call never answered (``release``). The hold itself is its caller's to drop. True if
        it charged anything."""
        tokens, cost = hold.dropped_charge
        if not (tokens or cost):
            return False
        memo = aside_key(f"{hold.run_uid}:{hold.turn}", hold.owner)
        self._charge(memo, tokens, cost, until=hold.expires)
        return True

    def _charge(self, memo: str, tokens: int, cost_usd: Decimal, *, until: float) -> None:
        """Charge the call ``memo`` (``<run-uid>:<turn>/<owner>``) as abandoned, remembered
        (``charged``, with what it was charged) for ``CHARGED_MEMORY`` past ``until``: taken
        back should its turn turn out to be committed by that owner (``uncharge``)."""
        entry = self._entry(run_of(memo))
        entry.charged[memo] = max(entry.charged.get(memo, 0.0), until + CHARGED_MEMORY)
        if tokens or cost_usd:
            entry.spent[memo] = (tokens, cost_usd)
        self.used_tokens += tokens
        self.used_cost += cost_usd
        self.abandoned_tokens += tokens
        self.abandoned_cost += cost_usd

    def uncharge(self, memo: str) -> bool:
        """The call ``<run-uid>:<turn>/<owner>`` was charged as abandoned (its hold dropped as
        expired), but its turn committed by that owner after all: its usage is in the run's
        own, charged by ``settle``, so what it was charged as abandoned is taken back out of
        ``used`` and ``abandoned`` — once, and only while the run is active (its settlement
        still to come or done). True if it took anything back."""
        entry = self.runs.get(run_of(memo))
        return entry is not None and entry.active is not None and self._take_back(memo)

    def _take_back(self, memo: str) -> bool:
        """Take what the call ``memo`` was charged as abandoned (``spent``) back out of
        ``used`` and ``abandoned``, once; True if it took anything back. Not when this
        window's ``abandoned`` holds less than that: the charge was made in a window since
        rolled (the memo outlives it), whose ``used`` keeps it — taking it out of this one
        would take ``used`` below the runs' usage. The call stays charged, once, in the
        window it was charged in."""
        entry = self.runs.get(run_of(memo))
        if entry is None or memo not in entry.spent:
            return False
        tokens, cost = entry.spent[memo]
        if tokens > self.abandoned_tokens or cost > self.abandoned_cost:
            return False
        tokens, cost = entry.spent.pop(memo)
        self.used_tokens -= tokens
        self.used_cost -= cost
        self.credited_tokens += tokens
        self.credited_cost += cost
        self.abandoned_tokens -= tokens
        self.abandoned_cost -= cost
        return True

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
        as far as its delivery knows) and not remembered as charged: a hold that carried it
        was charged by whoever dropped it — at what it had recorded then, so what the call
        used beyond that (output streamed after its slow worker's hold expired, or after it
        was set aside and its turn resolved) is charged now (``_charge_rest``). Returns True if
        it charged.

        The charge is remembered like one the sweep makes (``charge_abandoned``): a delivery
        may leave thinking its turn uncommitted when its commit landed but its answer was lost
        (cancelled while the append was in flight); the turn's event then names it, and
        ``resolve_turn`` by it takes the charge back (``uncharge``): its call is the run's."""
        self.roll(now)
        memo = aside_key(key, owner)
        hold = self.hold(key)
        if hold is not None and hold.owner == owner:
            self.take_hold(key)
        elif (hold := self.take_hold(memo)) is None:
            if self.remembers_charged(memo):
                return self._charge_rest(memo, tokens, cost_usd)
            if not unrecorded:
                return False
        self._charge(memo, tokens, cost_usd, until=now if hold is None else max(now, hold.expires))
        return True

    def _charge_rest(self, memo: str, tokens: int, cost_usd: Decimal) -> bool:
        """The call ``memo`` was charged as abandoned (``spent``) and used ``tokens`` /
        ``cost_usd`` in all: charge what it used beyond that, as abandoned. Nothing when it was
        taken back (``uncharge``: its turn is the run's) or used no more. True if it charged."""
        entry = self.runs.get(run_of(memo))
        if entry is None or memo not in entry.spent:
            return False
        was_tokens, was_cost = entry.spent[memo]
        more_tokens, more_cost = max(tokens - was_tokens, 0), max(cost_usd - was_cost, Decimal(0))
        if not (more_tokens or more_cost):
            return False
        entry.spent[memo] = (was_tokens + more_tokens, was_cost + more_cost)
        self.used_tokens += more_tokens
        self.used_cost += more_cost
        self.abandoned_tokens += more_tokens
        self.abandoned_cost += more_cost
        return True

    # --- waiting calls ----------------------------------------------------------------------------

    def put_waiter(self, key: str, waiter: Waiter) -> None:
        """The call ``key`` waits (or waits on, with ``waiter``'s expiry) for holds to settle:
        recorded in its run's entry, and among the totals' first waiters if it is one of the
        ``FIRST_WAITERS`` oldest (a younger one in them makes room)."""
        self._entry(run_of(key)).waiting[key] = waiter
        first = self.first_waiters
        if key not in first and len(first) >= FIRST_WAITERS:
            youngest = max(first, key=lambda k: (first[k].since, k))
            if (first[youngest].since, youngest) < (waiter.since, key):
                return
            del first[youngest]
        first[key] = waiter

    def stop_waiting(self, key: str) -> bool:
        """The call ``key`` no longer waits (its turn was given up, held or refused); True if
        it did."""
        entry = self.runs.get(run_of(key))
        mine = entry is not None and entry.waiting.pop(key, None) is not None
        return self.first_waiters.pop(key, None) is not None or mine

    def drop_expired_waiters(self, now: float) -> None:
        """Forget the waiters whose call stopped asking (past their expiry at ``now``): among
        the first waiters and in the entries loaded."""
        for key in [k for k, w in self.first_waiters.items() if w.expires <= now]:
            del self.first_waiters[key]
        for entry in self.runs.values():
            if entry.waiting:
                for key in [k for k, w in entry.waiting.items() if w.expires <= now]:
                    del entry.waiting[key]
