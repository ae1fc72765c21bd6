"""A batch's lost compare-and-sets are retried until both its attempts and its patience are
spent (``CasStore``): a leader election answers with conflicts for as long as it lasts, and a
count alone (40 attempts, about 0.4 s of backoff) ran out during one on a loaded machine. No
NATS here: the attempt is a function that loses for a given time."""

from __future__ import annotations

import time
from typing import Any

import pytest

from agentrun.ledger.cas import CasStore, Conflict, LedgerUnavailable


def losing_for(seconds: float) -> tuple[Any, list[int]]:
    """An attempt that loses every compare-and-set for ``seconds``, then applies; the attempt
    numbers it was called with."""
    until = time.monotonic() + seconds
    numbers: list[int] = []

    async def attempt(payloads: list[Any], number: int) -> list[tuple[bool, Any]]:
        numbers.append(number)
        if time.monotonic() < until:
            raise Conflict
        return [(True, p) for p in payloads]

    return attempt, numbers


async def test_conflicts_past_the_attempts_but_within_the_patience_are_retried() -> None:
    store = CasStore(None, attempts=3, patience=2.0)  # type: ignore[arg-type]
    attempt, numbers = losing_for(0.5)
    assert await store._submit("tenant/a", "change", attempt) == "change"
    assert len(numbers) > 3  # the count alone would have failed it
    assert numbers == list(range(len(numbers)))


async def test_a_batch_fails_once_both_the_attempts_and_the_patience_are_spent() -> None:
    store = CasStore(None, attempts=3, patience=0.3)  # type: ignore[arg-type]
    attempt, numbers = losing_for(60)
    started = time.monotonic()
    with pytest.raises(LedgerUnavailable, match=r"compare-and-set attempts lost in 0\.\ds"):
        await store._submit("tenant/a", "change", attempt)
    assert 0.3 <= time.monotonic() - started < 2.0
    assert len(numbers) >= 3


async def test_with_no_patience_the_attempts_alone_bound_it() -> None:
    store = CasStore(None, attempts=2, patience=0)  # type: ignore[arg-type]
    attempt, numbers = losing_for(60)
    with pytest.raises(LedgerUnavailable, match="2 compare-and-set attempts lost"):
        await store._submit("tenant/a", "change", attempt)
    assert numbers == [0, 1]
