"""A deadline-cut call's failure commit names ``NO_CALL_OWNER``: its own abandoned charge is not
taken back, and the turn's *other* deliveries' answered holds are still resolved — the run's
close and the sweep's repair charge a dead first delivery's answered call (set aside by the
redelivery) as abandoned, as they would for any committer."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from decimal import Decimal
from typing import Any

import pytest

from agentrun import kernel
from agentrun.ledger import NO_CALL_OWNER, CallNeed, TurnRef
from agentrun.protocol import ModelConfig, RunEvent, TurnRequest
from agentrun_dev import natsserver

from .test_cut_calls_ledger import SLOW
from .test_duplicate_turns import Stack, handle, run_closes, stacked, sweep_repairs

A_SPENT = kernel.Usage(100, 10, 0, Decimal("0.00028"))
PRICING = kernel.Pricing(input_per_million=Decimal(2), output_per_million=Decimal(8))


@pytest.fixture
async def slow(own_nats_server: natsserver.NatsServer) -> AsyncIterator[Stack]:
    async with stacked(own_nats_server, SLOW) as s:
        yield s


RESOLVED_BY = {"the run's close": run_closes, "the sweep": sweep_repairs}


@pytest.mark.parametrize("resolve", RESOLVED_BY.values(), ids=RESOLVED_BY.keys())
async def test_dead_first_delivery_answered_call_is_charged_after_a_deadline_failure_commit(
    slow: Stack, resolve: Callable[[Stack, TurnRequest, RunEvent], Any]
) -> None:
    model = ModelConfig("mock", slow.mock.base_url, "scripted", PRICING, 32000, 100)
    request = await slow.admit(
        goal="a long prompt " * 200, tools=(), model=model, deadline=time.time() + 2.0
    )
    # delivery A (a worker that then dies): reserved, its model call answered, usage recorded
    store = await slow.store()
    ref = TurnRef(slow.tenant, request.run_uid, "ns", request.name, 0)
    a = store.turn_hold(ref, ttl=5.0)
    need = CallNeed(prompt_tokens=1000, output_tokens=100, pricing=PRICING, min_output_tokens=16)
    granted = await a.reserve_call(need)
    assert granted.__class__.__name__ == "Granted"
    await a.spend(A_SPENT)
    assert a.recorded
    # ... and A dies here (no commit, no release): JetStream redelivers the turn to B, whose
    # call the run's deadline cuts; B charges its own call aside and commits the failure
    worker = await slow.worker()
    delivery = await handle(worker, request, again=True)
    assert delivery.outcome == ["ack"]
    events = await slow.events(request)
    assert events[-1].summary.phase is kernel.Phase.DEADLINE_EXCEEDED
    assert events[-1].owner == NO_CALL_OWNER
    after_b = await slow.book()
    spent = after_b.runs[request.run_uid].spent
    a_memo = f"{request.run_uid}:0/{a.owner}"
    # B's settlement charged A's answered call as abandoned beside B's own cut call
    assert spent[a_memo] == (A_SPENT.total_tokens, A_SPENT.cost_usd)
    assert len(spent) == 2 and after_b.used_tokens == after_b.abandoned_tokens
    await resolve(slow, request, events[-1])
    book = await slow.book()
    # both calls went to the provider; the run's usage holds neither: both stay abandoned,
    # charged once (the close or the sweep takes nothing back and charges nothing again)
    assert book.holds == {}
    assert (book.used_tokens, book.abandoned_tokens) == (after_b.used_tokens,) * 2
    assert book.used_tokens == sum(tokens for tokens, _ in spent.values())
