"""A model call cut by the run's deadline (before its answer, or mid-response), whose turn then
commits its failure (``deadline_exceeded``), stays charged in the real ledger: the worker
charges it as abandoned, and the commit names no owner (``TurnHold.commit_owner``), so its
settlement does not take the charge back as if the call were in the run's usage — the
record holds none of it. So does a call one attempt of which got no answer before the client's
read timeout, whatever its retry does: fail (the turn commits its failure) or be handed back
by a draining worker — its prompt's bound, once; a retry that answers is charged its usage
only."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from decimal import Decimal

import pytest

from agentrun import kernel
from agentrun.protocol import ModelConfig, RunEvent, TurnRequest
from agentrun_dev import natsserver
from worker.test_duplicate_turns import Stack, handle, stacked

from .test_read_timeouts import ANSWER_USAGE, retrying, scripted

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


PRICING = kernel.Pricing(input_per_million=Decimal(2), output_per_million=Decimal(8))
GOAL = "a long prompt " * 2000


async def admit(stack: Stack, *, timeout: float, base: str | None = None) -> TurnRequest:
    """A run of ``GOAL`` (about 28,000 tokens at its bound: ``prompt_bound``), priced, with a
    deadline ``timeout`` seconds away, on the model at ``base`` (the stack's scripted one
    unless given)."""
    model = ModelConfig("mock", base or stack.mock.base_url, "scripted", PRICING, 32000, 100)
    return await stack.admit(goal=GOAL, tools=(), model=model, deadline=time.time() + timeout)


def prompt_bound() -> int:
    """The prompt's bound (tokens) of such a run's first model call."""
    now = time.time()
    plan = kernel.plan_turn(
        kernel.initial_state(goal=GOAL),
        kernel.Limits(),
        pricing=PRICING,
        offer=kernel.Offer([]),
        clock=kernel.Timing(now=now, deadline=now + 60),
    )
    assert isinstance(plan, kernel.CallModel)
    return plan.prompt_estimate


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


async def handled(stack: Stack, *script: str) -> list[RunEvent]:
    """Turn 0 of a run (``admit``) on a model endpoint answering as ``script`` says
    (``scripted``), handled by a worker whose client retries once, and acked: the run's
    events."""
    stack.model = retrying()
    worker = await stack.worker()
    async with scripted(*script) as endpoint:
        request = await admit(stack, timeout=30.0, base=endpoint.base)
        delivery = await handle(worker, request)
    assert delivery.outcome == ["ack"] and endpoint.attempts == len(script)
    return await stack.events(request)


async def test_a_read_timed_out_call_whose_retry_fails_stays_charged_its_prompt_once(
    slow: Stack,
) -> None:
    """The first attempt gets no answer before the client's read timeout, the retry a 500:
    the turn commits the call's failure, its prompt's bound charged as abandoned."""
    events = await handled(slow, "hold", "500")
    assert [e.kind for e in events] == ["admitted", "turn"]
    assert events[-1].summary.usage.total_tokens == 0  # the record holds none of the call
    book = await slow.book()
    assert (book.used_tokens, book.abandoned_tokens) == (prompt_bound(),) * 2
    assert book.holds == {}


async def test_a_read_timed_out_call_handed_back_in_its_retry_stays_charged_its_prompt_once(
    slow: Stack,
) -> None:
    """A draining worker hands the turn back while the client retries: the read-timed-out
    attempt and the hand-back each would charge the prompt's bound; the call is charged it
    once."""
    slow.model = retrying(retries=2)
    worker = await slow.worker()
    async with scripted("hold", "hold", "hold") as endpoint:
        request = await admit(slow, timeout=30.0, base=endpoint.base)
        await slow.buses[0].publish_turn(request, tenant=slow.tenant)
        consuming = asyncio.create_task(worker.run())
        async with asyncio.timeout(30):
            while endpoint.attempts < 2:
                await asyncio.sleep(0.01)
        worker.stop()
        async with asyncio.timeout(30):
            await consuming
    assert endpoint.attempts == 2
    assert [e.kind for e in await slow.events(request)] == ["admitted"]  # handed back
    book = await slow.book()
    assert (book.used_tokens, book.abandoned_tokens) == (prompt_bound(),) * 2
    assert book.holds == {}


async def test_a_read_timed_out_call_whose_retry_answers_is_charged_the_answer_only(
    slow: Stack,
) -> None:
    events = await handled(slow, "hold", "answer")
    usage = events[-1].summary.usage  # the answer's, as the kernel reads it
    assert usage.output_tokens == ANSWER_USAGE["completion_tokens"]
    assert usage.total_tokens < prompt_bound()
    book = await slow.book()
    assert (book.used_tokens, book.abandoned_tokens) == (usage.total_tokens, 0)
    assert book.holds == {}
