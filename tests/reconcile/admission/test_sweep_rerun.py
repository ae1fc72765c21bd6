"""The ledger sweep and a rerun during its pass: a run's lives share its uid, so the sweep's
repairs (read from the first life's entry and events before the compare-and-set) name the entry
they judged (``Repair.since``). A rerun admitted between the sweep's read and its write (the
first life's close had failed: its slot was still taken) is a new entry; the repair leaves it
alone — neither closed nor charged the first life's usage — and the next sweep judges what it
finds then. Against the real nats-server's ledger."""

from __future__ import annotations

import types
import uuid
from decimal import Decimal
from typing import Any

import pytest
from kube_support import FakeKube
from nats.aio.client import Client as NATS

from agentrun import kernel
from agentrun.ledger import LedgerStore, QueuedRun, TenantLimits, TurnRef
from agentrun.operator.admission.queue import QueueBoard
from agentrun.operator.admission.sweep import STALE_GRACE, LedgerSweep, SweepDeps

NOW = 1_800_000_000.0
"""In the middle of a day's window (a window's roll is not what these tests are about)."""
FIRST = NOW - STALE_GRACE - 100
"""When the first life was admitted."""
LIMITS = TenantLimits(tokens=100_000)


def summary(phase: kernel.Phase, *, turns: int, tokens: int) -> kernel.RunSummary:
    usage = kernel.Usage(input_tokens=tokens, cost_usd=Decimal(0))
    return kernel.RunSummary(phase, turn=turns, steps=turns, usage=usage)


class Events:
    """The first life's last event, as the sweep reads it (``None``: no events)."""

    def __init__(self, uid: str, phase: kernel.Phase | None) -> None:
        self.last = None
        if phase is not None:
            self.last = types.SimpleNamespace(
                run_uid=uid,
                phase=phase,
                summary=summary(phase, turns=2, tokens=700),
                time=FIRST + 50,
                owner="",
            )

    async def last_event(self, namespace: str, name: str) -> Any:
        return self.last


class Untracked:
    """No process follows the run (its first life's close failed)."""

    def is_tracked(self, uid: str) -> bool:
        return False


def sweep_of(store: LedgerStore, events: Events) -> LedgerSweep:
    deps = SweepDeps(
        store=store,
        tenants=None,  # type: ignore[arg-type]
        board=QueueBoard(),
        runs=Untracked(),  # type: ignore[arg-type]
        events=events,
        api=FakeKube(),
        tenant_status=None,  # type: ignore[arg-type]
        clock=lambda: NOW,
    )
    return LedgerSweep(deps)


async def first_life(store: LedgerStore, tenant: str, uid: str, *, dead_hold: bool) -> None:
    """The first life admitted at ``FIRST``, its close failed (its slot still taken); with a
    hold of turn 2 whose worker died (expired long before ``NOW``) if ``dead_hold``."""
    run = QueuedRun(uid, "ns", "r", FIRST)
    assert (
        await store.admit_run(tenant, run, limits=LIMITS, need=(0, Decimal(0)), now=FIRST) is None
    )
    if dead_hold:
        ref = TurnRef(tenant, uid, "ns", "r", 2)
        hold = store.turn_hold(ref, ttl=10, clock=lambda: FIRST + 60)
        await hold.reserve(tokens=900, cost_usd=Decimal(0))


async def rerun(store: LedgerStore, tenant: str, uid: str) -> None:
    """The run is rerun: its slot freed (``free_run``) and admitted again, a new life."""
    assert await store.free_run(tenant, uid, now=NOW - 1) is True
    run = QueuedRun(uid, "ns", "r", NOW - 1)
    refusal = await store.admit_run(tenant, run, limits=LIMITS, need=(0, Decimal(0)), now=NOW - 1)
    assert refusal is None


CASES = {
    "stale-slot-ended": (kernel.Phase.COMPLETED, False),
    "stale-slot-no-events": (None, False),
    "expired-hold-running": (kernel.Phase.RUNNING, True),
    "expired-hold-ended": (kernel.Phase.COMPLETED, True),
}


@pytest.mark.parametrize(("phase", "dead_hold"), CASES.values(), ids=CASES.keys())
async def test_a_rerun_admitted_during_a_sweep_pass_keeps_its_new_entry(
    client: NATS, phase: kernel.Phase | None, dead_hold: bool
) -> None:
    store = await LedgerStore.open(client.jetstream(), clock=lambda: NOW)
    tenant, uid = f"t-{uuid.uuid4().hex[:8]}", f"u-{uuid.uuid4().hex[:8]}"
    await first_life(store, tenant, uid, dead_hold=dead_hold)
    read = await store.read(tenant)
    assert read is not None
    repairs = await sweep_of(store, Events(uid, phase))._find_repairs(read, NOW)
    assert repairs, "the sweep judged the first life's entry stale"
    await rerun(store, tenant, uid)
    before = await store.read(tenant)
    assert before is not None
    await store.repair_entry(tenant, repairs, limits=LIMITS, now=NOW)
    after = await store.read(tenant)
    assert after is not None
    assert set(after.active) == {uid}, "the rerun's new entry was closed"
    assert after.active[uid].since == NOW - 1
    assert (after.used_tokens, after.active[uid].tokens) == (before.used_tokens, 0)
    assert after.used_wall == before.used_wall


async def test_a_stale_entry_still_the_one_judged_is_repaired(client: NATS) -> None:
    """Without a rerun meanwhile, the repair closes the first life as before."""
    store = await LedgerStore.open(client.jetstream(), clock=lambda: NOW)
    tenant, uid = f"t-{uuid.uuid4().hex[:8]}", f"u-{uuid.uuid4().hex[:8]}"
    await first_life(store, tenant, uid, dead_hold=False)
    read = await store.read(tenant)
    assert read is not None
    events = Events(uid, kernel.Phase.COMPLETED)
    repairs = await sweep_of(store, events)._find_repairs(read, NOW)
    await store.repair_entry(tenant, repairs, limits=LIMITS, now=NOW)
    after = await store.read(tenant)
    assert after is not None and after.active == {}
    assert after.used_tokens == 700
