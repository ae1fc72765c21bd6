"""The values a tenant's ledger entry is made of, and the rules that size them: the limits,
a hold, an active run, a refusal, the fixed window and a call's worst case. Pure.

What belongs here: the entry's parts and the arithmetic that needs no whole entry. What does
not: the operations on an entry (``book``), its JSON (``codec``), storage (``store``).
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
CONCURRENCY_LIMIT = "ConcurrencyLimit"
BUDGET_EXHAUSTED = "BudgetExhausted"
TURN_COMMITTED = "TurnCommitted"
"""A call of a turn the ledger has settled already: its delivery is stale (the turn committed
through another delivery) and can never commit, so it makes no call."""
BUDGET_HELD = "BudgetHeld"
"""A run's first call fits what is committed, but not next to the holds of calls in flight
(or an older waiting call): it is admitted once they settle."""
MAX_ACTIVE_RUNS = 500
"""Runs one tenant may have active at once, whatever its ``maxConcurrentRuns``: the entry is
one KV value, rewritten on every change, and must stay far below the server's max payload
(1 MiB by default). An active run costs at most about 680 bytes of it (its slot, one hold with
a recorded spend, one waiter, every name at its longest), so the entry stays under 350 KB;
runs over the cap wait in the queue (``ConcurrencyLimit``)."""
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


def aside_key(key: str, owner: str) -> str:
    """Where the answered hold of delivery ``owner`` of turn ``key`` (``<run-uid>:<turn>``)
    waits while another delivery of the same turn holds ``key``: ``<key>/<owner>``."""
    return f"{key}/{owner}"


def worst_case(*, prompt_tokens: int, output_tokens: int, pricing: Pricing) -> tuple[int, Decimal]:
    """A model call's worst case, what a hold reserves: its estimated prompt plus its whole
    output allowance, priced at the uncached input price (the cache discount is only known
    after the call). Returns (tokens, USD)."""
    cost = pricing.cost(
        input_tokens=prompt_tokens, cached_input_tokens=0, output_tokens=output_tokens
    )
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
    window ``used`` only grows, so an entry below its floor was rolled back by a writer of the
    bucket, not by the ledger's rules."""

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
    """Tokens its model call used, recorded once the call answered (0: not answered yet)."""
    spent_cost: Decimal = Decimal(0)
    """USD its model call used, recorded with ``spent_tokens``."""

    @property
    def answered(self) -> bool:
        """Whether the hold's model call answered (its usage is recorded)."""
        return bool(self.spent_tokens or self.spent_cost)

    def holding(self, tokens: int, cost_usd: Decimal) -> Hold:
        """A copy of this hold that reserves ``tokens`` / ``cost_usd`` instead (built
        directly: ``dataclasses.replace`` cost a sixth of a reservation)."""
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
