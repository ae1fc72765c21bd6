"""The values a tenant's ledger is made of, and the rules that size them: the limits, a hold,
an active run, a waiting call, one run's part of the ledger (``RunEntry``), a refusal, the fixed
window and a call's worst case. Pure.

What belongs here: the ledger's parts and the arithmetic that needs no whole ledger. What does
not: the operations on a tenant's ledger (``book``), its JSON (``codec``), storage (``store``).
"""

from __future__ import annotations

import dataclasses
import math
from decimal import Decimal
from typing import TypeVar

from agentrun.kernel.limits import Pricing

RESOURCES = ("tokens", "costUSD", "wallClockSeconds")
"""The budgeted resources, named as in ``AgentTenant.spec.budget``."""

ADMISSION_HOLD_TTL = 600.0
"""Seconds admission holds a run's first call (until a worker reserves that call itself), so
runs admitted together cannot each be promised the same budget."""
CHARGED_MEMORY = 3_600.0
"""Seconds past its hold's expiry that a call charged as abandoned by another party is
remembered (``Book.charged``): longer than a losing delivery that outlived its hold can take
to leave its turn."""
ENDED_MEMORY = 3_600.0
"""Seconds past its end that a run is remembered as ended (``RunEntry.ended``): longer than an
operator that restarted takes to reach the queue heads it had admitted (they are the first it
admits again), so an admission done again after the run ended takes no slot."""
CONCURRENCY_LIMIT = "ConcurrencyLimit"
BUDGET_EXHAUSTED = "BudgetExhausted"
TURN_COMMITTED = "TurnCommitted"
"""A call of a turn the ledger has settled already: its delivery is stale (the turn committed
through another delivery) and can never commit, so it makes no call."""
BUDGET_HELD = "BudgetHeld"
"""A run's first call fits what is committed, but not next to the holds of calls in flight
(or an older waiting call): it is admitted once they settle."""
FIRST_WAITERS = 8
"""Waiting calls a tenant's totals remember, the oldest first (``BookState.first_waiters``): the
oldest of them is the one a newer call must leave room for. A waiting call younger than all of
them is recorded only in its run's entry until one of them leaves and it asks again (it asks
about twice a second), so the totals stay the same size however many calls wait."""
MAX_ACTIVE_RUNS = 500
"""Runs a tenant whose ledger is one value (``LAYOUTS``: ``single``) may have active at once,
whatever its ``maxConcurrentRuns``: that value is rewritten on every change and must stay far
below the server's max payload (1 MiB by default). An active run costs at most about 760 bytes
of it (its slot, one hold with a recorded spend and its call's prompt bound, one waiter, every
name at its longest: 753 measured; a recorded usage of 0 is 6 bytes more than none, less than
that), so it stays under 400 KB; runs over the cap wait in the queue
(``ConcurrencyLimit``). A ``split`` tenant has no such cap."""
LAYOUTS = ("single", "split")
"""How a tenant's ledger is stored. ``single``: the whole ledger in one value (``book.<tenant>``
in format 2, what every earlier release reads and writes), capped at ``MAX_ACTIVE_RUNS`` active
runs; ``split``: the tenant's totals plus one value per run (format 3, read by this release and
later ones only), with no cap from storage."""
WAITER_TTL = 10.0
"""Seconds a waiting call's place is kept after it last asked (it asks about once a second;
a waiter whose worker died stops holding the others back after this)."""


class LedgerCorrupt(ValueError):
    """A ledger entry that cannot be decoded (written by something else, or damaged)."""


def window_start(now: float, window_seconds: float) -> float:
    """Start (epoch seconds) of the fixed window holding ``now``, aligned to the UNIX epoch.

    A ``24h`` window therefore starts at 00:00 UTC. Raises ``ValueError`` for a window ≤ 0.
    """
    if window_seconds <= 0:
        raise ValueError(f"window must be positive, got {window_seconds}")
    return math.floor(now / window_seconds) * window_seconds


def run_of(key: str) -> str:
    """The run uid a hold, waiter or memo key starts with (``<run-uid>:…``)."""
    return key.partition(":")[0]


NO_CALL_OWNER = "-"
"""The owner a ``turn`` event names when the delivery that committed it holds none of its model
call in the record: its call was charged as abandoned (cut by the deadline, a broken stream;
``TurnHold.commit_owner``). Resolving the turn by it charges the other deliveries' answered
calls as abandoned, as for any committer, and takes no charge back (no hold has this
owner). An empty owner resolves nothing."""


def aside_key(key: str, owner: str) -> str:
    """Where the answered hold of delivery ``owner`` of turn ``key`` (``<run-uid>:<turn>``)
    waits while another delivery of the same turn holds ``key``: ``<key>/<owner>``."""
    return f"{key}/{owner}"


def worst_case(*, prompt_tokens: int, output_tokens: int, pricing: Pricing) -> tuple[int, Decimal]:
    """A model call's worst case, what a hold reserves: its estimated prompt plus its whole
    output allowance, its prompt priced at the uncached input price (the cache discount is
    only known after the call; ``Pricing.most``). Returns (tokens, USD)."""
    cost = pricing.most(input_tokens=prompt_tokens, output_tokens=output_tokens)
    return prompt_tokens + output_tokens, cost


@dataclasses.dataclass(frozen=True, slots=True)
class TenantLimits:
    """An ``AgentTenant``'s limits as the ledger enforces them (``None``: unlimited)."""

    tokens: int | None = None
    """Input + output tokens per window."""
    cost_usd: Decimal | None = None
    """USD per window."""
    wall_seconds: float | None = None
    """Sum of run durations per window, seconds."""
    window_seconds: float = 86_400.0
    """Length of the fixed window, seconds."""
    max_concurrent_runs: int | None = None
    """Runs admitted and not ended at once."""


@dataclasses.dataclass(frozen=True, slots=True)
class UsageFloor:
    """The least a tenant's window has used, as the operator saw it (in the entries it read,
    and in the AgentTenant status it wrote, which no NATS credential can change). Within one
    window ``used`` plus what was taken back out of it (``Book.usage_floor``) only grows, so an
    entry below its floor was rolled back by a writer of the bucket, not by the ledger's
    rules."""

    window: float
    """The window's start, epoch seconds."""
    tokens: int = 0
    cost_usd: Decimal = Decimal(0)
    wall_seconds: float = 0.0
    """Wall-clock seconds of the window's ended runs."""
    end: float = 0.0
    """When the window ends, epoch seconds (0: unknown; then ``window`` plus the entry's
    window length). No rule of the ledger moves it, and the next window begins only then."""

    def raised(
        self, window: float, tokens: int, cost_usd: Decimal, wall: float, *, end: float = 0.0
    ) -> UsageFloor:
        """The floor after seeing an entry of ``window`` (ending at ``end``; 0: unknown) with
        that use: the higher of the two within one window (its end the first known); a later
        window starts its own."""
        if window > self.window:
            return UsageFloor(window, tokens, cost_usd, wall, end)
        if window < self.window:
            return self
        return UsageFloor(
            window,
            max(tokens, self.tokens),
            max(cost_usd, self.cost_usd),
            max(wall, self.wall_seconds),
            self.end or end,
        )


@dataclasses.dataclass(slots=True)
class Hold:
    """A reservation for one model call of one run's turn."""

    run_uid: str
    turn: int
    tokens: int
    """Worst-case tokens of the call: estimated prompt + output allowance."""
    cost_usd: Decimal
    """Their price from the AgentModel."""
    expires: float
    """Epoch seconds; the worker refreshes it while the turn runs. Past it, the operator
    treats the worker as dead and releases the hold."""
    owner: str
    """Who reserved (one id per delivery of the turn); only the owner may release it."""
    namespace: str = ""
    name: str = ""
    spent_tokens: int = 0
    """Tokens its model call used, once recorded (``recorded``; 0 may be a recorded usage)."""
    spent_cost: Decimal = Decimal(0)
    """USD its model call used, recorded with ``spent_tokens``."""
    prompt_tokens: int = 0
    """Its model call's prompt bound, set when the call is held (``reserve.reserve_call``):
    what the call is charged as abandoned if the hold is dropped by anyone but its owner with
    nothing recorded on it (its worker presumed dead after its request most likely went out:
    the provider read, and bills, the prompt). 0: a hold of no model call (the admission's),
    or one written without it (an earlier release, ``Book.reserve``): charged nothing."""
    prompt_cost: Decimal = Decimal(0)
    """That prompt bound's price (at the dearer input price, as the worst case's)."""
    recorded: bool = False
    """Whether a usage of its model call is recorded on it (``spent_tokens`` / ``spent_cost``,
    0 tokens and 0 USD included): the call answered, or its response delivered that much so
    far (``BookState.record_spend``). Not told by the amounts: a provider may answer with a
    usage of 0, and that 0, not the prompt's bound, is what the call is charged. Stored as
    the spend fields of the hold's row (``codec.HoldRow``)."""

    @property
    def dropped_charge(self) -> tuple[int, Decimal]:
        """What its call is charged as abandoned when the hold is dropped uncommitted by
        anyone but its owner: the usage recorded on it (``recorded``: whatever it is, 0
        included), or with none, its prompt's bound (tokens, USD; (0, 0) for a hold of no
        model call)."""
        if self.recorded:
            return self.spent_tokens, self.spent_cost
        return self.prompt_tokens, self.prompt_cost

    @property
    def billable(self) -> bool:
        """Whether its call may have been billed, so that dropping the hold uncommitted
        charges it ``dropped_charge``: a usage is recorded on it (0 included), or it holds a
        model call's prompt bound (``prompt_tokens`` above 0, as ``codec`` stores one). False
        for a hold of no model call (the admission's, or an earlier release's with nothing
        recorded), which is replaced or dropped uncharged."""
        return self.recorded or self.prompt_tokens > 0

    def holding(
        self, tokens: int, cost_usd: Decimal, *, prompt: tuple[int, Decimal] | None = None
    ) -> Hold:
        """A copy of this hold that reserves ``tokens`` / ``cost_usd`` instead, and whose
        call's prompt bound is ``prompt`` (tokens, USD; ``None``: this hold's) (built
        directly: ``dataclasses.replace`` cost a sixth of a reservation)."""
        if prompt is None:
            prompt = self.prompt_tokens, self.prompt_cost
        return Hold(
            self.run_uid,
            self.turn,
            tokens,
            cost_usd,
            self.expires,
            self.owner,
            self.namespace,
            self.name,
            self.spent_tokens,
            self.spent_cost,
            *prompt,
            self.recorded,
        )


@dataclasses.dataclass(slots=True)
class Waiter:
    """A call waiting for other runs' holds to settle (``reserve.reserve_call``)."""

    since: float
    """When it first waited, epoch seconds: the order waiters are served in."""
    tokens: int
    """The least it can start with: its prompt plus the smallest output allowance."""
    cost_usd: Decimal
    """The price of that."""
    expires: float
    """Epoch seconds; pushed out each time the call asks again. Past it, the waiter is gone."""


@dataclasses.dataclass(slots=True)
class Active:
    """An admitted run that has not ended, and what has been charged for it."""

    namespace: str
    name: str
    since: float
    """Epoch seconds its wall-clock charge in this window runs from."""
    turn: int = -1
    """Last turn whose cumulative usage was charged (-1: none)."""
    tokens: int = 0
    """The run's cumulative tokens charged so far (across windows)."""
    cost_usd: Decimal = Decimal(0)
    """The run's cumulative cost charged so far (across windows)."""
    life: int | None = None
    """The life of the run this slot was admitted for (its ``status.reruns``: 0 for a run
    never rerun); ``None``: not known (a slot admitted by an earlier release, or rewritten by
    one), taken for any life. The uid does not tell a run's lives apart: a rerun's slot has
    the same uid and a later life (``BookState.later_life``)."""


@dataclasses.dataclass(slots=True)
class RunEntry:
    """One run's part of its tenant's ledger: its concurrency slot while it is admitted, the
    holds of its model calls, its waiting calls and the calls others charged as abandoned.
    Everything in it is keyed by the run's uid (``<run-uid>:<turn>``, ``<run-uid>:admission``,
    ``<run-uid>:<turn>/<owner>``), so a change of one run touches its entry and the tenant's
    totals only. Empty once the run ended and nothing of it is left to remember."""

    active: Active | None = None
    """Its slot and what has been charged for it (``None``: not admitted, or ended)."""
    holds: dict[str, Hold] = dataclasses.field(default_factory=dict)
    waiting: dict[str, Waiter] = dataclasses.field(default_factory=dict)
    """Its calls waiting for other runs' holds to settle, by hold key."""
    charged: dict[str, float] = dataclasses.field(default_factory=dict)
    """Its calls charged as abandoned by whoever dropped their hold:
    ``<run-uid>:<turn>/<owner>`` → until when it is remembered (epoch seconds)."""
    spent: dict[str, tuple[int, Decimal]] = dataclasses.field(default_factory=dict)
    """What each call in ``charged`` that was its own delivery's was charged (tokens, USD), by
    the same key, while it is remembered: taken back if its turn commits after all (a hold
    dropped as expired whose worker was only slow, ``BookState.uncharge``)."""
    ended: float = 0.0
    """Until when the run is remembered as ended (epoch seconds; 0: it has not ended): its
    admission, done again by an operator that restarted, takes no slot (``ENDED_MEMORY``)."""

    @property
    def only_ended(self) -> bool:
        """Whether all that is left of the run is the memory that it ended (kept apart from
        the totals: it would hold an inline place for ``ENDED_MEMORY``)."""
        return (
            bool(self.ended)
            and self.active is None
            and not (self.holds or self.waiting or self.charged or self.spent)
        )

    @property
    def empty(self) -> bool:
        """Whether nothing of the run is left in the ledger (its entry can go)."""
        return (
            self.active is None
            and not self.ended
            and not (self.holds or self.waiting or self.charged or self.spent)
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Seed:
    """What a ledger book made anew starts with (the bucket or the book was lost): what its
    window used at least, and the runs admitted and not ended, each charged what its status
    showed (``Active.tokens``/``cost_usd``, turn -1: its next settlement charges only what is
    new) and charged wall-clock time live from ``Active.since``."""

    used: UsageFloor
    active: dict[str, Active] = dataclasses.field(default_factory=dict)
    """Run uid → its slot."""


@dataclasses.dataclass(frozen=True, slots=True)
class BudgetRefusal:
    """Why a run may not be admitted or a call may not start."""

    reason: str
    """``ConcurrencyLimit`` or ``BudgetExhausted`` (condition reasons), or ``TurnCommitted``
    (a stale delivery's call: its turn record cannot commit, so no run ends by it)."""
    resource: str | None
    """The exhausted resource (one of ``RESOURCES``) for ``BudgetExhausted``."""
    message: str


Amount = TypeVar("Amount", int, Decimal)
"""An amount of a budget: tokens (``int``) or USD (``Decimal``)."""


def short_of(
    resource: str, *, used: Amount, reserved: Amount, need: Amount, limit: Amount | None
) -> BudgetRefusal | None:
    """Refuse when ``resource`` cannot cover ``need`` (with no need: ``used + reserved`` has
    reached ``limit``); ``None`` when it can or ``limit`` is ``None`` (unlimited)."""
    taken = used + reserved
    if limit is None or (taken + need <= limit if need else taken < limit):
        return None
    return BudgetRefusal(
        BUDGET_EXHAUSTED,
        resource,
        f"{resource}: {used} used and {reserved} reserved of {limit} this window"
        + (f"; a first call needs up to {need}" if need else ""),
    )
