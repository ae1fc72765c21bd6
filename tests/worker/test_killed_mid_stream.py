"""A worker SIGKILLed while a fast response streams leaves on its hold what it delivered, but
for the last ``stream.PROGRESS_TOKENS`` at most: the sweep charges that when it drops the
expired hold. (Recorded only every ``PROGRESS_SECONDS``, a provider that sent its whole
allowance in a burst left the hold with nothing spent, dropped uncharged; each redelivery that
died the same way was free as well.)"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path

import nats
import pytest
from aiohttp import web

from agentrun.ledger import LedgerStore, QueuedRun, TenantLimits
from agentrun.worker.stream import PROGRESS_TOKENS
from agentrun_dev import natsserver

from .rawmodel import chunk, serve

BUCKET = "AGENTRUN_LEDGER_KILLED"
CENTURY = 100 * 365 * 86_400.0
CHUNKS = 2500
delivered = asyncio.Event()
killed = asyncio.Event()


@pytest.fixture
async def store(nats_server: natsserver.NatsServer) -> AsyncIterator[LedgerStore]:
    client = await nats.connect(**nats_server.client_options())
    try:
        yield await LedgerStore.open(client.jetstream(), bucket=BUCKET)
    finally:
        await client.close()


async def fast_then_stall(request: web.Request) -> web.StreamResponse:
    import json

    await request.json()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    payload = b"".join(
        b"data: " + json.dumps(chunk({"content": "tok "})).encode() + b"\n\n" for _ in range(CHUNKS)
    )
    await resp.write(payload)  # the allowance's worth, at once
    delivered.set()
    with contextlib.suppress(asyncio.TimeoutError):  # the usage chunk never comes
        await asyncio.wait_for(killed.wait(), 30)
    return resp


async def test_a_worker_killed_mid_stream_leaves_its_delivery_charged(
    store: LedgerStore, nats_server: natsserver.NatsServer
) -> None:
    tenant, uid = f"t-{uuid.uuid4().hex[:10]}", "run-a"
    refusal = await store.admit_run(
        tenant,
        QueuedRun(uid, "ns", uid, time.time()),
        limits=TenantLimits(tokens=100_000, window_seconds=CENTURY),
        need=(0, Decimal(0)),
    )
    assert refusal is None
    auth = nats_server.auth("admin")
    creds = str(auth.creds_file) if auth and auth.creds_file else "-"
    ca = str(auth.ca_file) if auth and auth.ca_file else "-"
    async with serve(fast_then_stall) as url:
        child = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).with_name("killed_worker.py")),
                nats_server.url,
                creds,
                ca,
                BUCKET,
                tenant,
                uid,
                url,
            ]
        )
        try:
            await asyncio.wait_for(delivered.wait(), 30)
            await asyncio.sleep(0.5)  # the worker has read it all (well under 2 s)
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
            killed.set()
    book = await store.read(tenant)
    assert book is not None
    hold = book.holds[f"{uid}:0"]
    assert hold.spent_tokens >= CHUNKS - PROGRESS_TOKENS, (
        f"the provider delivered {CHUNKS} output tokens before the worker was killed; the hold"
        f" the sweep charges on expiry records {hold.spent_tokens} spent"
    )
    assert hold.tokens >= 3000, "the hold keeps the call's worst case while it streams"
