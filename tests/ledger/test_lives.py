"""A run's lives in the ledger, against a real nats-server: a rerun (``status.reruns``) runs
again from turn 0 under the same uid, so its slot names the life it was admitted for
(``Active.life``), and whatever an earlier life still does by the uid — its close retried, its
release, a stale delivery of one of its turns reserving, settling or giving up a wait — leaves
the later life's slot, charges and holds alone. In both layouts (the life is stored with the
slot in each)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from decimal import Decimal

import nats
import pytest

from agentrun import kernel
from agentrun.ledger import Book, Ending, Hold, LedgerStore, QueuedRun, TenantLimits, TurnRef
from agentrun.ledger.entries import TURN_COMMITTED, Waiter
from agentrun_dev import natsserver

from .conftest import NOW, TEST_BUCKET

LIMITS = TenantLimits(tokens=100_000, max_concurrent_runs=4)
UID = "run-uid"
FIRST_USAGE = kernel.Usage(input_tokens=5_000, cost_usd=Decimal(0))
"""What the first life's events show it used through its last turn (turn 3)."""


@pytest.fixture(params=["single", "split"])
async def store(
    nats_server: natsserver.NatsServer, request: pytest.FixtureRequest
) -> AsyncIterator[LedgerStore]:
    client = await nats.connect(**nats_server.client_options())
    try:
        yield await LedgerStore.open(
            client.jetstream(), bucket=TEST_BUCKET, clock=lambda: NOW, layout=request.param
        )
    finally:
        await client.close()


def ref(tenant: str, turn: int, *, life: int) -> TurnRef:
    return TurnRef(tenant, UID, "ns", "r", turn, life=life)


async def rerun(store: LedgerStore, tenant: str) -> None:
    """Life 0 admitted, then rerun: its slot freed (``free_run`` of life 0) and life 1
    admitted, whose turn 0 holds 300 tokens."""
    run = QueuedRun(UID, "ns", "r", NOW - 100)
    need = (0, Decimal(0))
    assert (
        await store.admit_run(tenant, run, limits=LIMITS, need=need, now=NOW - 50, life=0) is None
    )
    assert await store.free_run(tenant, UID, now=NOW - 20, life=0) is True
    assert (
        await store.admit_run(tenant, run, limits=LIMITS, need=need, now=NOW - 10, life=1) is None
    )
    hold = Hold(UID, 0, 300, Decimal(0), NOW + 60, "w-new", "ns", "r")
    assert (
        await store.reserve_turn(ref(tenant, 0, life=1), hold, before=None, prior_owner="", now=NOW)
        is None
    )


async def second_life(store: LedgerStore, tenant: str) -> Book:
    """The ledger as read, checked to still hold life 1's slot as admitted: its start, its
    life, nothing charged, its hold of turn 0."""
    book = await store.read(tenant)
    assert book is not None
    assert book.active[UID].life == 1 and book.slot_since(UID) == NOW - 10
    assert (book.active[UID].turn, book.used_tokens, book.active_runs) == (-1, 0, 1)
    assert book.hold(f"{UID}:0") == Hold(UID, 0, 300, Decimal(0), NOW + 60, "w-new", "ns", "r")
    assert not book.has_ended(UID)
    return book


async def test_a_close_of_an_earlier_life_leaves_a_rerun_s_slot_alone(
    store: LedgerStore, tenant: str
) -> None:
    """The first life's close, retried after the rerun was admitted, neither closes the new
    slot nor charges it the first life's usage or wall-clock time; the new life's own close
    closes it."""
    await rerun(store, tenant)
    last = kernel.RunSummary(kernel.Phase.COMPLETED, turn=4, steps=4, usage=FIRST_USAGE)
    old = Ending("w-old", life=0)
    assert not await store.close_run(tenant, UID, last, end=NOW - 30, now=NOW, ending=old)
    before = await second_life(store, tenant)
    assert before.used_wall == 30.0  # the first life's 30 s, charged by its release only
    mine = kernel.RunSummary(kernel.Phase.COMPLETED, turn=1, steps=1, usage=kernel.Usage(40, 0))
    assert await store.close_run(tenant, UID, mine, end=NOW + 5, now=NOW + 5, ending=Ending(life=1))
    after = await store.read(tenant)
    assert after is not None
    assert UID not in after.active and after.used_tokens == 40 and after.has_ended(UID)


async def test_a_release_of_an_earlier_life_leaves_a_rerun_s_slot_alone(
    store: LedgerStore, tenant: str
) -> None:
    """A release of the first life (a rerun's release done again, a give-up of its
    admission) after the new life was admitted frees nothing; one of the new life does."""
    await rerun(store, tenant)
    assert not await store.free_run(tenant, UID, now=NOW, life=0)
    await second_life(store, tenant)
    assert await store.free_run(tenant, UID, now=NOW, life=1)
    assert UID not in (await store.read(tenant) or Book.new(tenant, LIMITS, now=NOW)).active


async def test_a_stale_delivery_of_an_earlier_life_is_refused_and_settles_nothing(
    store: LedgerStore, tenant: str
) -> None:
    """A delivery of a turn of the first life still running when the rerun was admitted: its
    reservation is refused ``TurnCommitted`` before any model call (no hold, the turn before
    it not settled into the new slot), its settlement charges nothing and resolves none of
    the new life's holds of the same turn number, and its giving up a wait stops none of the
    new life's."""
    await rerun(store, tenant)
    stale = ref(tenant, 0, life=0)
    hold = Hold(UID, 0, 900, Decimal(0), NOW + 60, "w-old", "ns", "r")
    refused = await store.reserve_turn(stale, hold, before=None, prior_owner="", now=NOW)
    assert refused is not None and refused.reason == TURN_COMMITTED
    charged = await store.settle_turn(
        stale, owner="w-old", prior_owner="", after=FIRST_USAGE, now=NOW
    )
    assert charged == (0, Decimal(0))
    await second_life(store, tenant)
    key, waiter = f"{UID}:1", Waiter(NOW, 100, Decimal(0), NOW + 30)
    await store._change(tenant, lambda b: b.put_waiter(key, waiter), runs=(UID,))
    assert not await store.stop_waiting(ref(tenant, 1, life=0))
    book = await store.read(tenant)
    assert book is not None and book.waiter(key) == waiter
    assert await store.stop_waiting(ref(tenant, 1, life=1))


async def test_a_slot_names_its_life_in_both_layouts(store: LedgerStore, tenant: str) -> None:
    """An admission names the slot's life; an admission done again (an operator restarted
    mid-admission) keeps it; one that names none leaves it not known."""
    run = QueuedRun(UID, "ns", "r", NOW - 100)
    need = (0, Decimal(0))
    assert await store.admit_run(tenant, run, limits=LIMITS, need=need, life=2) is None
    assert await store.admit_run(tenant, run, limits=LIMITS, need=need, life=3) is None
    other = QueuedRun(f"other-{uuid.uuid4().hex[:6]}", "ns", "o", NOW - 90)
    assert await store.admit_run(tenant, other, limits=LIMITS, need=need) is None
    book = await store.read(tenant)
    assert book is not None
    assert (book.active[UID].life, book.active[other.uid].life) == (2, None)
