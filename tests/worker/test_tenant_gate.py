"""The tenant gate inside a turn: a model call the tenant's budget cannot cover is never made.

The run's own caps come first (their reasons win); the ledger is a stand-in here (the real one
is tested in tests/ledger/test_hold.py and the e2e suites), the model is the scripted server
over HTTP.
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal

from agentrun import kernel
from agentrun.kernel import Phase
from agentrun.ledger import BudgetRefusal, BudgetWait, CallNeed, Granted
from agentrun.tools import Catalog
from agentrun.tools.calculate import Calculate

from .loop import drive

FOREVER = """
scenarios:
  - name: forever
    turns:
      - tool_calls: [{name: calculate, arguments: {expression: "{turn}+1"}}]
        usage: {prompt_tokens: 50, completion_tokens: 10}
    after: repeat_last
"""


@dataclasses.dataclass
class Tenant:
    """Fits ``calls`` model calls, then refuses; records what each reservation asked. The
    first ``waits`` asks are told to wait for other runs' holds; ``allow`` caps the output
    allowance granted (the ledger shrinking a call to what is left)."""

    calls: int
    waits: int = 0
    allow: int | None = None
    asked: list[tuple[int, Decimal]] = dataclasses.field(default_factory=list)
    granted: int = 0
    spent: list[kernel.Usage] = dataclasses.field(default_factory=list)

    def budget_for(self, state: kernel.RunState) -> Tenant.Turn:
        return Tenant.Turn(self)

    @dataclasses.dataclass
    class Turn:
        tenant: Tenant

        async def spend(self, usage: kernel.Usage, *, answered: bool = True) -> None:
            self.tenant.spent.append(usage)

        async def reserve_call(
            self, need: CallNeed, *, before: kernel.RunState | None = None
        ) -> Granted | BudgetWait | BudgetRefusal:
            assert before is not None  # the previous turn is settled in the same write
            tenant = self.tenant
            output = min(need.output_tokens, tenant.allow or need.output_tokens)
            tokens, cost = need.worst(output)
            tenant.asked.append((tokens, cost))
            if tenant.waits > 0:
                tenant.waits -= 1
                return BudgetWait("held by other runs' calls")
            if tenant.granted >= tenant.calls:
                return BudgetRefusal(
                    "BudgetExhausted", "tokens", "tenant 't' tokens: 1 call too many"
                )
            tenant.granted += 1
            return Granted(output, tokens, cost)


async def test_a_call_the_tenant_cannot_cover_is_not_made_and_ends_the_run() -> None:
    tenant = Tenant(calls=2)
    state, records, requests = await drive(
        FOREVER,
        goal="count",
        catalog=Catalog([Calculate()]),
        tools=("calculate",),
        limits=kernel.Limits(max_steps=50),
        budget_for=tenant.budget_for,
    )
    assert state.phase is Phase.TENANT_BUDGET_EXHAUSTED
    assert "1 call too many" in state.message
    assert len(requests) == 2 and len(tenant.asked) == 3
    assert isinstance(records[-1], kernel.Stopped)  # no model call, nothing spent
    tokens, _ = tenant.asked[0]
    assert tokens > 1000  # the worst case: the prompt estimate plus the model's 1000 output


async def test_a_summary_the_tenant_cannot_cover_ends_with_the_runs_own_cap() -> None:
    """max_steps came first: the run ends max_steps (its reason), just without the summary."""
    tenant = Tenant(calls=2)
    state, records, requests = await drive(
        FOREVER,
        goal="count",
        catalog=Catalog([Calculate()]),
        tools=("calculate",),
        limits=kernel.Limits(max_steps=2),  # onExhausted: summarize by default
        budget_for=tenant.budget_for,
    )
    assert state.phase is Phase.MAX_STEPS
    assert state.answer is None and "no summary" in state.message
    last = records[-1]
    assert len(requests) == 2 and isinstance(last, kernel.Summarized) and last.decision is None


async def test_a_call_held_back_by_other_runs_holds_waits_and_is_made_once_they_settle() -> None:
    tenant = Tenant(calls=2, waits=3)
    state, _records, requests = await drive(
        FOREVER,
        goal="count",
        catalog=Catalog([Calculate()]),
        tools=("calculate",),
        limits=kernel.Limits(max_steps=50),
        budget_for=tenant.budget_for,
    )
    assert len(tenant.asked) == 3 + 3  # three waits, two grants, the refusal
    assert len(requests) == 2 and len(tenant.spent) == 2
    assert state.phase is Phase.TENANT_BUDGET_EXHAUSTED


async def test_a_call_still_waiting_at_the_runs_deadline_ends_deadline_exceeded() -> None:
    tenant = Tenant(calls=5, waits=10_000)
    state, _records, requests = await drive(
        FOREVER,
        goal="count",
        catalog=Catalog([Calculate()]),
        tools=("calculate",),
        limits=kernel.Limits(max_steps=50),
        budget_for=tenant.budget_for,
        timeout=1.2,
    )
    assert state.phase is Phase.DEADLINE_EXCEEDED
    assert "held by other runs' calls" in state.message
    assert requests == [] and tenant.spent == []


async def test_a_call_shrunk_to_the_budget_left_asks_the_model_for_no_more() -> None:
    tenant = Tenant(calls=1, allow=300)
    state, _records, requests = await drive(
        FOREVER,
        goal="count",
        catalog=Catalog([Calculate()]),
        tools=("calculate",),
        limits=kernel.Limits(max_steps=50),
        budget_for=tenant.budget_for,
    )
    assert len(requests) == 1
    body = requests[0]["body"] if "body" in requests[0] else requests[0]
    allowed = body.get("max_completion_tokens") or body.get("max_tokens")
    assert allowed == 300
    assert state.phase is Phase.TENANT_BUDGET_EXHAUSTED


async def test_the_reserved_prompt_is_a_byte_bound_not_the_four_characters_estimate() -> None:
    tenant = Tenant(calls=1)
    goal = "数" * 2_000  # 2 000 CJK characters: 6 000 UTF-8 bytes, about 500 by the estimate
    await drive(
        FOREVER,
        goal=goal,
        catalog=Catalog([Calculate()]),
        tools=("calculate",),
        limits=kernel.Limits(max_steps=50),
        budget_for=tenant.budget_for,
    )
    tokens, _ = tenant.asked[0]
    assert tokens >= 6_000 + 1_000  # the goal's bytes plus the model's 1000 output
