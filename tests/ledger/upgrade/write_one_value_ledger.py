"""Writes a tenant's ledger with the one-value layout of earlier releases, through that
release's own code, and prints every value it stored as JSON (``one_value_ledger.json`` is its
output; ``test_upgrade.py`` stores those bytes as they are and starts the current code on them).

Run it with the earlier release's ``agentrun`` package first on the path, against any
nats-server with JetStream, e.g.:

    git archive 60a0290 agentrun | tar -x -C /tmp/old
    nats-server -js -p 14444 -sd /tmp/old-store &
    PYTHONPATH=/tmp/old .venv/bin/python tests/ledger/upgrade/write_one_value_ledger.py \\
        nats://127.0.0.1:14444 > tests/ledger/upgrade/one_value_ledger.json

The tenant ``acme`` (24-hour window) ends up with: 40 runs admitted (one admission hold still
held); 30 runs with a committed and settled turn each; 5 runs with a call held, 3 of them
answered with their usage recorded; one run whose turn was taken over by a second delivery
(the first one's answered call set aside), another whose second delivery committed; a waiting
call; one run closed after three turns (its wall-clock time charged); a call abandoned by its
delivery; a call charged as abandoned by the delivery that committed its turn (remembered);
and an admission queue of 12 runs, two of them created in the same millisecond.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import sys
from decimal import Decimal

import nats

from agentrun import kernel
from agentrun.ledger import (
    BudgetWait,
    CallNeed,
    Granted,
    LedgerStore,
    QueuedRun,
    TenantLimits,
    TurnRef,
)

NOW = 1_800_003_600.0
"""One hour into the window that starts at 1 800 000 000 (a 24-hour window: 00:00 UTC)."""
TENANT, BUCKET = "acme", "AGENTRUN_LEDGER"
LIMITS = TenantLimits(tokens=5_000_000, cost_usd=Decimal("50.00"), max_concurrent_runs=100)
PRICING = kernel.Pricing(Decimal("2.50"), Decimal("1.25"), Decimal("10"))


def after(turns: int, tokens: int) -> kernel.RunState:
    usage = kernel.Usage(input_tokens=tokens, cost_usd=Decimal(tokens) / 1_000_000)
    return dataclasses.replace(kernel.initial_state(goal="upgrade"), usage=usage, turn=turns)


async def write(store: LedgerStore) -> None:
    for i in range(40):
        run = QueuedRun(f"run-{i:02d}", "team-a", f"run-{i:02d}", NOW - 600 + i)
        need = (500, Decimal("0.002")) if i == 39 else (0, Decimal(0))
        assert (
            await store.admit_run(TENANT, run, limits=LIMITS, need=need, now=NOW - 600 + i) is None
        )
    for i in range(30):  # one committed, settled turn each
        ref = TurnRef(TENANT, f"run-{i:02d}", "team-a", f"run-{i:02d}", 0)
        hold = store.turn_hold(ref, clock=lambda: NOW - 300)
        assert isinstance(await hold.reserve_call(CallNeed(1_000, 500, PRICING)), Granted)
        await hold.spend(after(1, 1_000 + i).usage)
        await hold.settle(after(1, 1_000 + i))
    for i in range(30, 35):  # a call held; three answered, their usage recorded
        ref = TurnRef(TENANT, f"run-{i:02d}", "team-a", f"run-{i:02d}", 0)
        hold = store.turn_hold(ref, ttl=3_600, clock=lambda: NOW - 60)
        assert isinstance(await hold.reserve_call(CallNeed(2_000, 1_000, PRICING)), Granted)
        if i < 33:
            await hold.spend(after(1, 2_100).usage)
    # a second delivery takes run-32's turn over (the first one's answered call set aside)
    # and commits it: the first one's call is charged as abandoned, and remembered
    ref = TurnRef(TENANT, "run-32", "team-a", "run-32", 0)
    second = store.turn_hold(ref, ttl=3_600, clock=lambda: NOW - 30)
    assert isinstance(await second.reserve_call(CallNeed(2_000, 1_000, PRICING)), Granted)
    await second.spend(after(1, 2_050).usage)
    await second.settle(after(1, 2_050))
    # a second delivery of run-31's turn takes it over: the answered call is set aside
    ref = TurnRef(TENANT, "run-31", "team-a", "run-31", 0)
    third = store.turn_hold(ref, ttl=3_600, clock=lambda: NOW - 25)
    assert isinstance(await third.reserve_call(CallNeed(2_000, 1_000, PRICING)), Granted)
    # a call abandoned by its delivery: charged and remembered
    ref = TurnRef(TENANT, "run-35", "team-a", "run-35", 0)
    async with store.turn_hold(ref, clock=lambda: NOW - 20) as lost:
        assert isinstance(await lost.reserve_call(CallNeed(800, 200, PRICING)), Granted)
        await lost.spend(after(1, 777).usage)
    # a call that waits: the tenant's tokens are nearly held by the others
    big = CallNeed(4_960_000, 1_000, PRICING, min_output_tokens=1_000)
    ref = TurnRef(TENANT, "run-36", "team-a", "run-36", 0)
    waiting = store.turn_hold(ref, clock=lambda: NOW - 5)
    answer = await waiting.reserve_call(big)
    assert isinstance(answer, BudgetWait), answer
    # a run closed after three turns, 400 s after its admission
    summary = after(3, 4_321).summary()
    closed = await store.close_run(TENANT, "run-37", summary, end=NOW - 600 + 37 + 400, now=NOW)
    assert closed
    for i in range(12):  # the admission queue; q-05 and q-06 created in the same millisecond
        at = NOW - 100 + (i if i != 6 else 5)
        await store.enqueue(TENANT, QueuedRun(f"q-{i:02d}", "team-b", f"queued-{i:02d}", at))


async def main(url: str) -> None:
    nc = await nats.connect(url)
    try:
        store = await LedgerStore.open(nc.jetstream(), bucket=BUCKET, clock=lambda: NOW)
        await write(store)
        values = {}
        for key in sorted(await store.kv.keys()):
            entry = await store.kv.get(key)
            values[key] = base64.b64encode(entry.value or b"").decode()
        json.dump({"now": NOW, "tenant": TENANT, "values": values}, sys.stdout, indent=1)
        print()
    finally:
        await nc.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
