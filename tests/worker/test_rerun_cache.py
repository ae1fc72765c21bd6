"""A rerun on a worker that cached the run before its events were purged: a real worker, a
real nats-server, the scripted model. A rerun keeps the run's uid and starts again at turn 0
on a subject that was purged; the worker must fold the new admission afresh, not on top of
the state it cached (before: it took the new admission for a re-seal of the cached run, saw
the request's turn 0 as stale and acked it unrun, every time it was dispatched, until the run
ended ``checkpoint_failed`` with "turn 0 left the work queue 4 times")."""

from __future__ import annotations

import time
from decimal import Decimal

from agentrun.ledger import QueuedRun, TenantLimits
from agentrun.protocol import TurnRequest

from .test_duplicate_turns import NO_ROLLOVER, TURN_0, Stack, handle
from .test_duplicate_turns import stack as stack  # the same worker's world of its own


async def readmit(stack: Stack, uid: str, name: str) -> None:
    """The operator's part of a rerun in the ledger: the run's slot freed, the run admitted
    again (its turns counted from 0)."""
    store = await stack.store()
    assert await store.free_run(stack.tenant, uid)
    refusal = await store.admit_run(
        stack.tenant,
        QueuedRun(uid, "ns", name, time.time()),
        limits=TenantLimits(tokens=1_000_000, window_seconds=NO_ROLLOVER),
        need=(0, Decimal(0)),
    )
    assert refusal is None


async def test_a_rerun_after_a_purge_runs_turn_0_on_the_worker_that_cached_the_run(
    stack: Stack,
) -> None:
    worker = await stack.worker()
    request = await stack.admit()
    assert (await handle(worker, request)).outcome == ["ack"]
    admitted, turn = await stack.events(request)
    assert (turn.kind, stack.model_calls()) == ("turn", 1)
    assert worker.cache.get(request.run_uid) is not None  # the run after turn 0, at turn.seq

    bus = stack.buses[0]
    await bus.purge_run("ns", request.name)  # its checkpoint lost; the rerun asked for
    again = await bus.append_event("ns", request.name, admitted, expected_seq=0)
    await readmit(stack, request.run_uid, request.name)
    assert again > turn.seq  # stream sequences go on after a purge
    rerun = TurnRequest(request.run_uid, "ns", request.name, 0, again)

    assert (await handle(worker, rerun)).outcome == ["ack"]
    assert stack.model_calls() == 2  # turn 0 ran again, not taken for stale
    events = await stack.events(rerun)
    assert [(e.kind, e.seq > turn.seq) for e in events] == [("admitted", True), ("turn", True)]
    assert events[1].summary.usage.total_tokens == TURN_0
    cached = worker.cache.get(request.run_uid)
    assert cached is not None and (cached.seq, cached.state.turn) == (events[1].seq, 1)


async def test_a_stale_delivery_of_an_earlier_life_makes_no_call_in_the_rerun_s_slot(
    stack: Stack,
) -> None:
    """A delivery of the first life's turn 0 still running when the rerun (life 1) was
    admitted in the ledger: its reservation names the life its events' admission sealed, so
    the rerun's slot refuses it (``TurnCommitted``) — no model call, nothing settled into the
    new life's slot."""
    worker = await stack.worker()
    request = await stack.admit()  # life 0's admission and its turn 0
    store = await stack.store()
    assert await store.free_run(stack.tenant, request.run_uid, life=0)
    refusal = await store.admit_run(
        stack.tenant,
        QueuedRun(request.run_uid, "ns", request.name, time.time()),
        limits=TenantLimits(tokens=1_000_000, window_seconds=NO_ROLLOVER),
        need=(0, Decimal(0)),
        life=1,
    )
    assert refusal is None
    await handle(worker, request)
    assert stack.model_calls() == 0
    book = await store.read(stack.tenant)
    assert book is not None
    assert book.active[request.run_uid].life == 1 and book.used_tokens == 0
    assert book.holds == {}
