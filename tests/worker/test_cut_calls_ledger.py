"""A model call cut by the run's deadline (before its answer, or mid-response), whose turn then
commits its failure (``deadline_exceeded``), stays charged in the real ledger: the worker
charges it as abandoned, and the commit names no owner (``TurnHold.commit_owner``), so its
settlement does not take the charge back as if the call were in the run's usage — the
record holds none of it."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from decimal import Decimal

import pytest

from agentrun import kernel
from agentrun.protocol import ModelConfig, TurnRequest
from agentrun_dev import natsserver
from worker.test_duplicate_turns import Stack, handle, stacked

SLOW = """
scenarios:
  - name: slow
    turns:
      - content: "42"
        latency_ms: 6000
        usage: {prompt_tokens: 100, completion_tokens: 10}
"""


MIDWAY = """
scenarios:
  - name: midway
    turns:
      - content: "%s"
        chunk_ms: 200
        chunk_tokens: 1
        usage: {prompt_tokens: 100, completion_tokens: 400}
""" % ("word " * 400)


@pytest.fixture
async def midway(own_nats_server: natsserver.NatsServer) -> AsyncIterator[Stack]:
    async with stacked(own_nats_server, MIDWAY) as s:
        yield s


@pytest.fixture
async def slow(own_nats_server: natsserver.NatsServer) -> AsyncIterator[Stack]:
    async with stacked(own_nats_server, SLOW) as s:
        yield s


async def admit(stack: Stack, *, timeout: float) -> TurnRequest:
    """A run whose prompt is long (about 28,000 tokens at its bound), priced, with a
    deadline ``timeout`` seconds away."""
    pricing = kernel.Pricing(input_per_million=Decimal(2), output_per_million=Decimal(8))
    model = ModelConfig("mock", stack.mock.base_url, "scripted", pricing, 32000, 100)
    return await stack.admit(
        goal="a long prompt " * 2000, tools=(), model=model, deadline=time.time() + timeout
    )


@pytest.mark.parametrize("cut", ["before-answer", "mid-response"])
async def test_a_deadline_cut_call_stays_charged_after_its_failure_commits(
    cut: str, slow: Stack, midway: Stack
) -> None:
    slow = slow if cut == "before-answer" else midway
    worker = await slow.worker()
    request = await admit(slow, timeout=2.0)
    delivery = await handle(worker, request)
    assert delivery.outcome == ["ack"]
    assert slow.model_calls() == 1  # the request went out: the provider read the prompt
    events = await slow.events(request)
    assert [e.kind for e in events] == ["admitted", "turn"]
    assert events[-1].summary.phase is kernel.Phase.DEADLINE_EXCEEDED
    assert events[-1].summary.usage.total_tokens == 0  # the record holds none of the call
    book = await slow.book()
    assert book.abandoned_tokens > 0, (
        book.used_tokens,
        book.abandoned_tokens,
        book.credited_tokens,
    )
    assert book.used_tokens == book.abandoned_tokens
