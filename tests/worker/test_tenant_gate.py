"""The tenant gate inside a turn: a model call the tenant's budget cannot cover is never made.

The run's own caps come first (their reasons win); the ledger is a stand-in here (the real one
is tested in test_budget.py and the e2e suites), the model is the scripted server over HTTP.
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal

from agentrun import kernel
from agentrun.kernel import Phase
from agentrun.ledger import BudgetRefusal
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
    """Fits ``calls`` model calls, then refuses; records what each reservation asked."""

    calls: int
    asked: list[tuple[int, Decimal]] = dataclasses.field(default_factory=list)

    def budget_for(self, state: kernel.RunState) -> Tenant.Turn:
        return Tenant.Turn(self)

    @dataclasses.dataclass
    class Turn:
        tenant: Tenant
        spent: kernel.Usage | None = None

        def spend(self, usage: kernel.Usage) -> None:
            self.spent = usage

        async def reserve(
            self, *, tokens: int, cost_usd: Decimal, before: kernel.RunState | None = None
        ) -> BudgetRefusal | None:
            assert before is not None  # the previous turn is settled in the same write
            self.tenant.asked.append((tokens, cost_usd))
            if len(self.tenant.asked) > self.tenant.calls:
                return BudgetRefusal(
                    "BudgetExhausted", "tokens", "tenant 't' tokens: 1 call too many"
                )
            return None


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
