"""Counting the schema checks a test's code runs (``schemas.schema_problem``, the uncached
check every cached one falls back on), as they start and end: what ran before what on the
shared check threads, whatever the machine's load makes of their durations."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from agentrun.kernel import schemas
from agentrun.operator.platform.fairwork import FairWork


def counting_checks(
    monkeypatch: pytest.MonkeyPatch, *, hold_first: threading.Event | None = None
) -> tuple[list[None], list[None]]:
    """Lists that grow as each schema's (uncached) check starts and ends; ``hold_first``: the
    first check, once started, waits for it (10 s at most) before it checks, so a test can
    queue another party's check behind it whatever the machine's load."""
    started: list[None] = []
    done: list[None] = []
    check = schemas.schema_problem

    def counted(schema: Any, **kwargs: Any) -> str | None:
        started.append(None)
        if hold_first is not None and len(started) == 1:
            hold_first.wait(timeout=10)
        try:
            return check(schema, **kwargs)
        finally:
            done.append(None)

    monkeypatch.setattr(schemas, "schema_problem", counted)
    return started, done


async def ended_before_another(
    checks: FairWork, party: str, first: threading.Event, started: list[Any], done: list[Any]
) -> int:
    """Once the first counted check has started (held by ``first``, ``counting_checks``'s
    ``hold_first``), queue a check of ``party`` behind it, let the first go on, and return how
    many counted checks had ended when ``party``'s ran."""
    while not started:
        await asyncio.sleep(0.01)
    other = asyncio.create_task(checks.run(party, lambda: len(done)))
    while checks.waiting < 1:  # the other party's check waits for the thread
        await asyncio.sleep(0.005)
    first.set()
    return await other
