"""An install with the one-value ledger of earlier releases upgrades without losing anything of
a tenant's current window.

``upgrade/one_value_ledger.json`` is what the earlier release's own code stored (see
``upgrade/write_one_value_ledger.py``): a tenant's book as one value and its admission queue as
one value. Those bytes go into a real server as they are; then the current code runs on them.
The first change of the tenant — by a worker or by the operator, or by both at once — moves the
book into totals and run entries in one atomic batch, and the operator moves the queue into one
value per run: usage, abandoned charges, wall-clock time, active runs and what each was charged,
holds (answered, set aside, admission), the waiting call, the remembered charge and the queue's
order all carry over, and the turns in flight settle on the new layout.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import pathlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from decimal import Decimal
from typing import Any

import nats
import nats.js.errors
import pytest
from kv_support import live_keys
from nats.aio.client import Client as NATS

from agentrun import kernel
from agentrun.ledger import (
    INLINE_RUNS,
    Book,
    CallNeed,
    Granted,
    Hold,
    LedgerStore,
    TurnRef,
    codec,
)
from agentrun.ledger.store import book_key, legacy_queue_key, queue_key, run_key
from agentrun_dev import natsserver

FIXTURE = json.loads((pathlib.Path(__file__).parent / "upgrade/one_value_ledger.json").read_text())
NOW: float = FIXTURE["now"]
TENANT: str = FIXTURE["tenant"]
VALUES = {key: base64.b64decode(value) for key, value in FIXTURE["values"].items()}

Opener = Callable[..., Awaitable[LedgerStore]]


@pytest.fixture
async def open_store(nats_server: natsserver.NatsServer) -> AsyncIterator[Opener]:
    """``await open_store(**kwargs)``: a store on its own connection, on a bucket holding what
    the earlier release stored, five seconds after it stored it."""
    bucket = f"AGENTRUN_LEDGER_UP_{uuid.uuid4().hex[:8]}"
    clients: list[NATS] = []

    async def opener(**kwargs: Any) -> LedgerStore:
        client = await nats.connect(**nats_server.client_options())
        clients.append(client)
        kwargs.setdefault("clock", lambda: NOW + 5)
        return await LedgerStore.open(client.jetstream(), bucket=bucket, **kwargs)

    first = await opener()
    for key, value in VALUES.items():
        await first.kv.put(key, value)
    yield opener
    await first.kv._js.delete_key_value(bucket)  # type: ignore[attr-defined]
    for client in clients:
        await client.close()


def earlier() -> Book:
    """The book as the earlier release stored it, read whole."""
    return codec.decode_one_value(VALUES[book_key(TENANT)])


def test_the_fixture_is_what_the_earlier_release_wrote() -> None:
    assert VALUES[book_key(TENANT)].startswith(b'{"v":2,')
    book = earlier()
    assert (book.used_tokens, book.used_cost, book.used_wall) == (
        39_683,
        Decimal("0.039683"),
        400.0,
    )
    assert (book.abandoned_tokens, book.active_runs, len(book.holds)) == (2_877, 39, 6)
    assert len(book.waiting) == 1 and len(book.charged) == 1
    assert book.totals_mismatch() == []


def test_an_earlier_book_whose_window_length_was_edited_keeps_its_windows_end() -> None:
    """The releases that edit windows write the current window's ``end`` into the one-value
    book when it differs from ``window`` plus the length: the migrated totals keep it, and
    write it on."""
    raw = json.loads(VALUES[book_key(TENANT)])
    end = raw["window"] + raw["limits"]["windowSeconds"] + 1_800.0
    book = codec.decode_one_value(json.dumps({**raw, "end": end}).encode())
    assert book.end == book.reset_time == end
    again = codec.decode_totals(codec.encode_totals(book, inline=list(book.runs))).book
    assert again.end == end and again.used_tokens == earlier().used_tokens
    assert earlier().end == raw["window"] + raw["limits"]["windowSeconds"]  # none written


def same_window(before: Book, after: Book) -> None:
    """Everything of the window carried over: usage, runs and what each was charged, holds,
    waiting calls and remembered charges."""
    now = NOW + 5
    assert (after.used_tokens, after.used_cost, after.used_wall) == (
        before.used_tokens,
        before.used_cost,
        before.used_wall,
    )
    assert (after.abandoned_tokens, after.abandoned_cost) == (
        before.abandoned_tokens,
        before.abandoned_cost,
    )
    assert after.window == before.window and after.limits == before.limits
    assert after.active == before.active and after.active_runs == before.active_runs
    assert after.wall_used(now) == pytest.approx(before.wall_used(now))
    assert after.holds == before.holds
    assert (after.reserved_tokens, after.reserved_cost) == (
        before.reserved_tokens,
        before.reserved_cost,
    )
    assert after.waiting == before.waiting and after.first_waiters == before.first_waiters
    assert after.charged == before.charged
    assert after.totals_mismatch() == []


async def keys(store: LedgerStore, prefix: str) -> list[str]:
    return [k for k in await live_keys(store.kv) if k.startswith(prefix)]


async def test_the_current_code_reads_the_earlier_book_whole(open_store: Opener) -> None:
    store = await open_store()
    book = await store.read(TENANT)
    assert book is not None
    same_window(earlier(), book)
    assert (await store.kv.get(book_key(TENANT))).value == VALUES[book_key(TENANT)]  # unchanged


NEXT = TurnRef(TENANT, "run-30", "team-a", "run-30", 1)
"""run-30's next turn: its turn 0 committed (by the delivery holding ``run-30:0``, which died
before settling), and a worker of the current release reserves turn 1."""
AFTER_0 = dataclasses.replace(
    kernel.initial_state(goal="upgrade"),
    usage=kernel.Usage(input_tokens=2_100, cost_usd=Decimal("0.0021")),
    turn=1,
)
CALL = CallNeed(1_000, 500, kernel.Pricing(Decimal("2.50"), Decimal("1.25"), Decimal("10")))


def next_hold(owner: str) -> Hold:
    return Hold("run-30", 1, 0, Decimal(0), NOW + 65, owner, "team-a", "run-30")


async def reserve_next_turn(store: LedgerStore, owner: str) -> object:
    """The reservation of run-30's turn 1, which settles turn 0 first (in the same write)."""
    committer = earlier().holds["run-30:0"].owner  # as turn 0's event names it
    return await store.reserve_call(
        NEXT, CALL, next_hold(owner), before=AFTER_0, prior_owner=committer, now=NOW + 5
    )


@pytest.mark.parametrize("layout", ["single", "split"])
@pytest.mark.parametrize("who", ["operator", "worker", "both"])
async def test_the_first_change_keeps_the_book_one_value_or_splits_it_into_run_entries(
    open_store: Opener, who: str, layout: str
) -> None:
    """An operator set to ``layout`` and a worker (whose store keeps what it finds) change the
    earlier release's book: it is split when the operator set to ``split`` writes, and stays
    one value otherwise; either way every total and run is as the whole book in memory says."""
    operator_store = await open_store(layout=layout)
    worker_store = await open_store(create=False)
    before = earlier()
    movers = {"operator": [operator_store], "worker": [worker_store]}.get(
        who, [operator_store, worker_store]
    )
    answers = await asyncio.gather(
        *(reserve_next_turn(store, f"w{i}") for i, store in enumerate(movers))
    )
    assert all(isinstance(answer, Granted) for answer in answers)
    stored = codec.decode_totals((await operator_store.kv.get(book_key(TENANT))).value or b"")
    apart = await keys(operator_store, f"run.{TENANT}.")
    if layout == "split" and who != "worker":
        assert not stored.one_value and len(stored.inline) == INLINE_RUNS
        assert len(apart) == len(before.runs) - INLINE_RUNS  # every other run on its own
        assert set(apart) | {run_key(TENANT, u) for u in stored.inline} == {
            run_key(TENANT, uid) for uid in before.runs
        }
    else:  # as the earlier release reads it
        assert stored.one_value and apart == [] and set(stored.book.runs) == set(before.runs)
    after = await operator_store.read(TENANT)
    assert after is not None
    # turn 0 is charged (its hold dropped, the committer's), turn 1 held; nothing else changed
    assert after.used_tokens == before.used_tokens + 2_100
    assert after.active["run-30"].tokens == 2_100 and "run-30:0" not in after.holds
    committer = before.holds["run-30:0"].owner
    last = after.holds["run-30:1"].owner  # of two, the write that went last holds the key
    owners = sorted((f"w{i}" for i in range(len(movers))), key=lambda owner: owner == last)
    for owner in owners:  # the same on the book read whole, in the order the writes landed
        before.resolve_turn("run-30", 0, committer=committer)
        before.catch_up("run-30", turn=0, tokens=2_100, cost_usd=Decimal("0.0021"), now=NOW + 5)
        before.reserve_call("run-30:1", CALL, next_hold(owner), now=NOW + 5)
    if len(movers) == 2:  # the first's call set aside, holding its prompt's bound, uncharged
        aside = after.holds[f"run-30:1/{owners[0]}"]
        assert (aside.tokens, aside.prompt_tokens, aside.recorded) == (1_000, 1_000, False)
    same_window(before, after)


async def test_the_operator_moves_the_queue_into_one_value_per_run_in_its_order(
    open_store: Opener,
) -> None:
    store = await open_store()
    earlier_queue = codec.LEGACY_QUEUE.validate_json(VALUES[legacy_queue_key(TENANT)])
    queue = await store.queue(TENANT)
    assert [r.uid for r in queue] == [r.uid for r in earlier_queue]
    assert [r.uid for r in queue][5:7] == ["q-05", "q-06"]  # the tie keeps its order
    assert queue[0].at == earlier_queue[0].at and queue[0].namespace == "team-b"
    assert await keys(store, f"queue.{TENANT}") == sorted(
        queue_key(TENANT, r.uid) for r in earlier_queue
    )  # the one value is gone
    again = await open_store()  # the next operator reads the same queue
    assert [r.uid for r in await again.queue(TENANT)] == [r.uid for r in earlier_queue]


@pytest.mark.parametrize("layout", ["single", "split"])
async def test_only_a_store_set_to_split_splits_a_one_value_ledger_at_its_next_change(
    open_store: Opener, layout: str
) -> None:
    """A store set to ``split`` splits the earlier book at its next change (the sweep's too:
    ``splits``); set to ``single`` it keeps it one value (until admissions outgrow it:
    ``test_bounds``)."""
    store = await open_store(layout=layout)
    book = await store.read_totals(TENANT)
    assert book is not None and book.one_value
    assert store.splits(book) is (layout == "split")
