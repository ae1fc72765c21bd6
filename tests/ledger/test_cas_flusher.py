"""A group's flusher (``CasStore._submit``) that ends other than by a batch answered — an
attempt whose answer does not match its batch (a bug), the flusher cancelled — leaves no
caller waiting for ever: each hears an error, and changes queued behind a faulty batch are
still written. No NATS here: the attempt is a function."""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

import pytest

from agentrun.ledger.cas import CasStore, LedgerUnavailable

GROUP = "tenant/a"


class Held:
    """An attempt held until released; its first answer drops the last change's result (a
    bug), later ones answer every change."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.calls = 0

    async def __call__(self, payloads: list[Any], number: int) -> list[tuple[bool, Any]]:
        self.calls += 1
        self.entered.set()
        await self.release.wait()
        answers = [(True, p) for p in payloads]
        return answers[:-1] if self.calls == 1 else answers


async def test_a_batch_whose_answer_is_faulty_fails_its_callers_and_the_next_batch_goes_on() -> (
    None
):
    store = CasStore(None)  # type: ignore[arg-type]
    attempt = Held()
    first = asyncio.create_task(store._submit(GROUP, "a", attempt))
    await attempt.entered.wait()
    queued = asyncio.create_task(store._submit(GROUP, "b", attempt))  # waits for the next write
    await asyncio.sleep(0)
    attempt.release.set()
    with pytest.raises(ValueError):
        await asyncio.wait_for(first, timeout=5.0)
    assert await asyncio.wait_for(queued, timeout=5.0) == "b"
    assert not store._flushers


async def test_a_cancelled_flusher_fails_the_changes_it_writes_and_those_queued() -> None:
    store = CasStore(None)  # type: ignore[arg-type]
    attempt = Held()
    writing = asyncio.create_task(store._submit(GROUP, "a", attempt))
    await attempt.entered.wait()
    queued = asyncio.create_task(store._submit(GROUP, "b", attempt))
    await asyncio.sleep(0)
    store._flushers[GROUP].cancel()
    for caller in (writing, queued):
        with pytest.raises(LedgerUnavailable, match="stopped"):
            await asyncio.wait_for(caller, timeout=5.0)
    assert not store._flushers
    assert await asyncio.wait_for(store._submit(GROUP, "c", _answering), timeout=5.0) == "c"


async def _answering(payloads: list[Any], number: int) -> list[tuple[bool, Any]]:
    return [(True, p) for p in payloads]


async def test_a_flusher_ended_by_its_own_error_fails_its_callers_and_logs_it(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nobody awaits a group's flusher: an error of its own (a bug outside any batch) fails
    every change it holds and is logged naming the group, not left to asyncio's "Task
    exception was never retrieved"."""
    store = CasStore(None)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    unretrieved: list[object] = []
    handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: unretrieved.append(context))

    def broken(group: str, batch: list[Any]) -> list[Any]:
        raise RuntimeError("a bug in taking a batch")

    monkeypatch.setattr(store, "_take", broken)
    try:
        with caplog.at_level(logging.INFO, logger="agentrun"):
            with pytest.raises(LedgerUnavailable, match="stopped"):
                await asyncio.wait_for(store._submit(GROUP, "a", Held()), timeout=5.0)
            for _ in range(5):
                await asyncio.sleep(0)
            gc.collect()
    finally:
        loop.set_exception_handler(handler)
    assert not store._flushers
    assert any(
        GROUP in r.getMessage() and "a bug in taking a batch" in r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR
    )
    assert unretrieved == []
