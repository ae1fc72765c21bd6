"""The queue board: written only by the pump's passes, read through accessors; kicks coalesce."""

from __future__ import annotations

import asyncio

import pytest

from agentrun.operator.admission.queue import QueueBoard
from agentrun.operator.tenants.waits import QueueWait, WaitReason

FULL = QueueWait(WaitReason.CONCURRENCY_LIMIT, "2 of 2 runs")


def test_a_pass_is_read_back_and_the_counts_cannot_be_written_by_readers() -> None:
    board = QueueBoard()
    assert (board.queued("t"), board.blocked("t"), board.tenants()) == (0, None, frozenset())
    board.record_pass("t", waiting=3, blocked=FULL)
    assert (board.queued("t"), board.blocked("t"), board.tenants()) == (3, FULL, {"t"})
    counts = board.queued_counts()
    with pytest.raises(TypeError):
        counts["t"] = 0  # type: ignore[index]
    board.record_pass("t", waiting=0, blocked=None)
    assert counts["t"] == 0 and board.blocked("t") is None  # a live view of the last pass


def test_a_run_counts_as_being_admitted_only_inside_its_block_even_when_it_fails() -> None:
    board = QueueBoard()
    with pytest.raises(RuntimeError), board.admitting("u"):
        assert board.is_admitting("u")
        raise RuntimeError("the admitted event could not be appended")
    assert not board.is_admitting("u")


async def test_kicks_of_a_tenant_coalesce_until_taken() -> None:
    board = QueueBoard()
    for tenant in ("a", "b", "a"):
        board.kick(tenant)
    assert await board.take_kicks() == {"a", "b"}
    waiting = asyncio.create_task(board.take_kicks())
    await asyncio.sleep(0.01)
    assert not waiting.done()
    board.kick("c")
    assert await waiting == {"c"}
