"""What a model call cut before its end charges the tenant, whatever the provider.

A call cut after its request went out and before its answer has had its prompt read, and
billed, by the provider. Cut by the tenant — its run cancelled or deleted (the consumer
cancels the turn), its deadline — or by the platform — a draining worker handing the turn back
(``pulling.HANDED_BACK``), to be asked again elsewhere, a second bill — it is charged its
prompt's bound, as a call abandoned mid-response is charged what it delivered. A call that
never connected is charged nothing, nor one the platform handed back between attempts (after
a refusal, waiting to retry: nothing billed). Against a model server that
holds its answer, over real HTTP with the real ``openai`` client, and through a worker's
consumer with its real ledger.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator
from decimal import Decimal

import pytest
from aiohttp import web
from http_support import serving

from agentrun import kernel, pulling
from agentrun.metrics import ModelErrorType
from agentrun.tools import Catalog
from agentrun.worker import budget
from agentrun.worker.delivery import Delivery
from agentrun.worker.model import ChatRequest, ModelClient, ModelError, RetryPolicy
from agentrun.worker.turn import TurnDeps, execute_turn
from agentrun_dev import natsserver

from .loop import NoSecrets, config
from .test_duplicate_turns import Stack, handle, stacked
from .test_streaming import Hold

PRICING = kernel.Pricing(input_per_million=Decimal(2), output_per_million=Decimal(8))
CALL = kernel.CallModel(0, ({"role": "user", "content": "a huge prompt"},), 90_000, 500)
"""A call whose prompt's bound is 90,000 tokens."""
PROMPT_BOUND = kernel.Usage(90_000, 0, 0, Decimal("0.18"), estimated=True)
"""What that call is charged cut before its answer: its prompt's bound, no output."""


@contextlib.asynccontextmanager
async def holding(*, streams: bool, first_chunk: bool = False) -> AsyncIterator[str]:
    """A model endpoint that reads each request and holds its answer until the test ends
    (``first_chunk``: after streaming one chunk); ``streams`` False refuses streamed
    requests, as an endpoint that does not stream does. Yields its base URL."""
    release = asyncio.Event()

    async def answer(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("stream") and not streams:
            error = {"message": "stream is not supported", "param": "stream"}
            return web.json_response({"error": error}, status=400)
        if not first_chunk:
            await release.wait()
            return web.json_response({})
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        chunk = {"id": "c", "choices": [{"index": 0, "delta": {"content": "a" * 40}}]}
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await release.wait()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    async with serving(app) as base:
        try:
            yield f"{base}/v1"
        finally:
            release.set()


def chat(base: str) -> ChatRequest:
    return ChatRequest(base, "", "scripted", CALL.prompt, [], CALL.max_output_tokens)


CUTS = {
    "run-cancelled": (None, [PROMPT_BOUND]),  # the consumer's cancel of a cancelled run
    "handed-back": (pulling.HANDED_BACK, [PROMPT_BOUND]),  # a draining worker's: billed too
}


@pytest.mark.parametrize("streams", [True, False], ids=["streamed", "refuses-streaming"])
@pytest.mark.parametrize(("message", "charged"), CUTS.values(), ids=CUTS.keys())
async def test_a_call_cut_before_its_answer_is_charged_its_prompt_whoever_cut_it(
    streams: bool, message: str | None, charged: list[kernel.Usage]
) -> None:
    """Streamed or, for an endpoint that refuses streaming, sent whole."""
    client = ModelClient(RetryPolicy(max_retries=0))
    hold = Hold()
    watch = budget.SpendWatch(hold, CALL, PRICING)
    async with holding(streams=streams) as base:
        call = asyncio.create_task(
            client.complete(chat(base), deadline=time.time() + 60, watch=watch)
        )
        await asyncio.sleep(0.5)
        call.cancel(msg=message)
        with pytest.raises(asyncio.CancelledError):
            await call
        await client.close()
    assert hold.noted == charged
    assert watch.usage(Delivery()) == PROMPT_BOUND


@pytest.mark.parametrize("streams", [True, False], ids=["streamed", "refuses-streaming"])
async def test_a_call_cut_by_the_runs_deadline_before_its_answer_is_charged_its_prompt(
    streams: bool,
) -> None:
    client = ModelClient(RetryPolicy(max_retries=0))
    hold = Hold()
    watch = budget.SpendWatch(hold, CALL, PRICING)
    async with holding(streams=streams) as base:
        with pytest.raises(ModelError) as raised:
            await client.complete(chat(base), deadline=time.time() + 0.7, watch=watch)
        await client.close()
    assert raised.value.error_type is ModelErrorType.DEADLINE
    assert hold.noted == [PROMPT_BOUND]


@pytest.mark.parametrize(
    ("message", "charged"),
    [(pulling.HANDED_BACK, []), (None, [PROMPT_BOUND])],
    ids=["handed-back", "run-cancelled"],
)
async def test_a_call_cut_while_it_waits_to_retry_a_refusal_is_charged_only_by_the_tenant(
    message: str | None, charged: list[kernel.Usage]
) -> None:
    """Refused (429) and waiting 5 s to ask again, the provider billed nothing: a draining
    worker handing the turn back there charges nothing (asked again elsewhere); a tenant's
    cancel there is charged its prompt's bound (the call cannot see whether a request went
    out: charged once too often rather than a read prompt left uncharged)."""
    asked = 0

    async def refuse(request: web.Request) -> web.StreamResponse:
        nonlocal asked
        asked += 1
        await request.read()
        error = {"message": "rate limited", "type": "rate_limit"}
        return web.json_response({"error": error}, status=429, headers={"retry-after": "5"})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", refuse)
    client = ModelClient(RetryPolicy(max_retries=3))
    hold = Hold()
    watch = budget.SpendWatch(hold, CALL, PRICING)
    async with serving(app) as base:
        call = asyncio.create_task(
            client.complete(chat(f"{base}/v1"), deadline=time.time() + 60, watch=watch)
        )
        await asyncio.sleep(1.0)
        assert asked == 1  # refused, waiting to retry
        call.cancel(msg=message)
        with pytest.raises(asyncio.CancelledError):
            await call
        await client.close()
    assert hold.noted == charged


async def test_a_call_that_never_connected_is_charged_nothing() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens there once closed
    client = ModelClient(RetryPolicy(max_retries=0))
    hold = Hold()
    watch = budget.SpendWatch(hold, CALL, PRICING)
    with pytest.raises(ModelError) as raised:
        await client.complete(
            chat(f"http://127.0.0.1:{port}"), deadline=time.time() + 30, watch=watch
        )
    await client.close()
    assert raised.value.error_type is ModelErrorType.CONNECTION
    assert hold.noted == []


@pytest.mark.parametrize("first_chunk", [False, True], ids=["before-answer", "mid-response"])
async def test_a_turn_whose_call_the_deadline_cut_charges_it_as_abandoned(
    first_chunk: bool,
) -> None:
    """The turn commits its ending (``deadline_exceeded``), whose record holds no usage of the
    cut call: its charge (the prompt's bound, and the output delivered) is made on the hold as
    abandoned before, or the commit's settlement would forget it."""
    hold = Hold()
    async with holding(streams=True, first_chunk=first_chunk) as base:
        deps = TurnDeps(
            model=ModelClient(RetryPolicy(max_retries=0)), catalog=Catalog([]), secrets=NoSecrets()
        )
        run = config(base, goal="answer", tools=(), timeout=1.0)
        record = await execute_turn(deps, run, kernel.initial_state(goal="answer"), hold=hold)
        await deps.model.close()
    assert isinstance(record, kernel.Stopped)
    assert record.ending.phase is kernel.Phase.DEADLINE_EXCEEDED
    assert hold.abandoned == hold.noted and len(hold.noted) == 1
    charged = hold.noted[0]
    assert charged.input_tokens > 0 and (charged.output_tokens > 0) == first_chunk


SLOW = """
scenarios:
  - name: slow
    turns:
      - content: "42"
        latency_ms: 4000
        usage: {prompt_tokens: 100, completion_tokens: 10}
"""


@pytest.fixture
async def slow(own_nats_server: natsserver.NatsServer) -> AsyncIterator[Stack]:
    """Workers and a ledger on a nats-server of this module's own, and a model that answers
    after 4 s."""
    async with stacked(own_nats_server, SLOW) as s:
        yield s


async def test_a_worker_charges_a_cancelled_runs_unanswered_call_its_prompt(slow: Stack) -> None:
    """The cancel broadcast cancels the run's turn in the worker running it while the model
    has not answered: the turn is void (acked), its call charged as abandoned."""
    worker = await slow.worker()
    request = await slow.admit()
    turn = asyncio.create_task(handle(worker, request))
    async with asyncio.timeout(30):
        while slow.model_calls() < 1:
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)
    await worker._on_cancel(request.run_uid)
    assert (await turn).outcome == ["ack"]
    book = await slow.book()
    assert 0 < book.abandoned_tokens == book.used_tokens
    assert book.holds == {}


async def test_a_draining_worker_hands_an_unanswered_call_back_charged_its_prompt(
    slow: Stack,
) -> None:
    """Stopped with no drain time while its model call waits for an answer, a worker cancels
    the turn and naks it for another worker, which asks the model again and is charged for
    that call: the cut one was read and billed by the provider too, and is charged its
    prompt's bound as abandoned, once, its hold given back."""
    worker = await slow.worker()
    request = await slow.admit()
    await slow.buses[0].publish_turn(request, tenant=slow.tenant)
    consuming = asyncio.create_task(worker.run())
    async with asyncio.timeout(30):
        while slow.model_calls() < 1:
            await asyncio.sleep(0.01)
    worker.stop()
    async with asyncio.timeout(30):
        await consuming
    assert slow.model_calls() == 1
    book = await slow.book()
    assert 0 < book.abandoned_tokens == book.used_tokens
    assert book.holds == {}


@pytest.mark.parametrize("streams", [True, False], ids=["streamed", "refuses-streaming"])
async def test_a_call_whose_attempts_time_out_unanswered_is_charged_its_prompt(
    streams: bool,
) -> None:
    """The client's own per-attempt timeout (a provider still reading a huge prompt) ends
    the call with a read timeout after its retries, not a cancellation: the provider read
    the prompt, so it is charged its bound (once)."""
    client = ModelClient(RetryPolicy(max_retries=1, request_timeout=0.5))
    hold = Hold()
    watch = budget.SpendWatch(hold, CALL, PRICING)
    async with holding(streams=streams) as base:
        with pytest.raises(ModelError):
            await client.complete(chat(base), deadline=time.time() + 30, watch=watch)
        await client.close()
    assert watch.noted == [PROMPT_BOUND]
