"""A streaming call's progress record (``SpendWatch.progress``) keeps its hold at the call's
worst case: the rest of its allowance may still come, so another run of the tenant cannot
reserve that room meanwhile. (Recorded as an answer, the hold shrank to what was delivered so
far; another run was granted the room, both honest providers used what they were allowed, and
the tenant's used + reserved passed its limit: 12,120 of 10,000.) Real nats-server, real
HTTP, the real ``openai`` client."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal

import nats
import pytest
from aiohttp import web

from agentrun import kernel
from agentrun.ledger import CallNeed, Granted, LedgerStore, QueuedRun, TenantLimits, TurnRef
from agentrun_dev import natsserver

from .rawmodel import chunk, one_turn, serve

LIMIT = 10_000
CENTURY = 100 * 365 * 86_400.0
PRICING = kernel.Pricing()
resume = asyncio.Event()


@pytest.fixture
async def store(nats_server: natsserver.NatsServer) -> AsyncIterator[LedgerStore]:
    client = await nats.connect(**nats_server.client_options())
    try:
        yield await LedgerStore.open(client.jetstream(), bucket="AGENTRUN_LEDGER_PROGRESS")
    finally:
        await client.close()


async def honest_slow_start(request: web.Request) -> web.StreamResponse:
    """Honours ``max_tokens``: exactly that many one-token chunks; 60 of them over 3 s, the
    rest once the test says so; then the usage chunk, honest."""
    body = await request.json()
    allowed = body["max_tokens"]
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)

    async def send(c: dict) -> None:
        import json

        await resp.write(b"data: " + json.dumps(c).encode() + b"\n\n")

    await send(chunk({"role": "assistant"}))
    for i in range(allowed):
        await send(chunk({"content": "tok "}))
        if i < 60:
            await asyncio.sleep(0.05)
        elif i == 60:
            await asyncio.wait_for(resume.wait(), 20)
    await send(chunk(finish="length"))
    await send(
        chunk(
            choices=False,
            usage={"prompt_tokens": 20, "completion_tokens": allowed, "total_tokens": 20 + allowed},
        )
    )
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def test_a_streaming_calls_unused_allowance_stays_held(store: LedgerStore) -> None:
    tenant = f"t-{uuid.uuid4().hex[:10]}"
    limits = TenantLimits(tokens=LIMIT, window_seconds=CENTURY)
    for uid in ("run-a", "run-b"):
        refusal = await store.admit_run(
            tenant, QueuedRun(uid, "ns", uid, time.time()), limits=limits, need=(0, Decimal(0))
        )
        assert refusal is None
    hold_a = store.turn_hold(TurnRef(tenant, "run-a", "ns", "run-a", 0))
    hold_b = store.turn_hold(TurnRef(tenant, "run-b", "ns", "run-b", 0))
    async with serve(honest_slow_start) as url, hold_a:
        task = asyncio.create_task(
            one_turn(
                url, limits=kernel.Limits(max_output_tokens=4000), hold=hold_a, pricing=PRICING
            )
        )
        # wait for A's hold and its first progress record (2 s into its stream)
        deadline = time.time() + 10
        worst_a = None
        while time.time() < deadline:
            book = await store.read(tenant)
            h = book.holds.get("run-a:0") if book else None
            if h is not None and worst_a is None:
                worst_a = h.tokens
            if h is not None and h.recorded:
                break
            await asyncio.sleep(0.1)
        # run B asks for a big call now
        async with hold_b:
            granted = await hold_b.reserve_call(
                CallNeed(
                    prompt_tokens=100, output_tokens=8000, pricing=PRICING, min_output_tokens=128
                )
            )
            resume.set()
            _record, state_a = await task
            assert isinstance(granted, Granted)
            usage_b = kernel.Usage(100, granted.output_tokens)
            await hold_b.spend(usage_b)  # B's honest provider used all it was allowed
            book = await store.read(tenant)
            committed = book.used_tokens + book.reserved_tokens
            assert committed <= LIMIT, (
                f"tenant limit {LIMIT} tokens: A (allowed {worst_a} at its reservation) used"
                f" {state_a.usage.total_tokens}, B was granted {granted.output_tokens}"
                f" output tokens while A streamed, used+reserved now {committed}"
            )
