"""A run its tenant's budget stopped while the AgentTenant shows ``BudgetExhausted=False``
(``WithinBudget``: some budget is left) says why in its own status: its next call's smallest
worst case, which the ledger holds before the call, against what is left of the window. The
ledger's refusal, the kernel's end and the status projection, chained."""

from __future__ import annotations

import time

from agentrun import kernel
from agentrun.ledger import Book, BudgetRefusal, CallNeed, Hold, TenantLimits
from agentrun.operator.runs import status
from agentrun.operator.tenants.status import budget_status, within_message


def test_a_run_ended_tenant_budget_exhausted_says_what_did_not_fit_in_what_was_left() -> None:
    now = time.time()
    book = Book.new("acme", TenantLimits(tokens=1000), now=now)
    book.used_tokens = 900
    need = CallNeed(50, 500, kernel.Pricing(), min_output_tokens=51)
    refusal = book.reserve_call("r1:0", need, Hold("r1", 0, 0, 0, now + 60, "w1"), now=now)
    assert isinstance(refusal, BudgetRefusal) and refusal.resource == "tokens"

    state = kernel.initial_state(goal="g")
    call = kernel.plan_turn(
        state,
        kernel.Limits(),
        pricing=kernel.Pricing(),
        offer=kernel.Offer([]),
        clock=kernel.Timing(now=0.0, deadline=60.0),
    )
    assert isinstance(call, kernel.CallModel)
    record = kernel.refused_by_tenant(call, refusal.message)
    ended = kernel.advance(state, record, kernel.Limits())
    body = status.project(ended.summary(), seq=2, start_time=now, event_time=now, generation=1)
    assert body["terminalReason"] == "tenant_budget_exhausted"
    assert body["message"] == (
        "tenant 'acme' tokens: 900 used + 101 for this call exceeds 1000: 100 left this "
        "window, less than a call holds its worst case (its prompt's bound plus at least 51 "
        "output tokens)"
    )
    tenant_says = within_message(budget_status(book, now))
    assert tenant_says.startswith("left in this window: tokens 100 of 1000; a model call goes")
