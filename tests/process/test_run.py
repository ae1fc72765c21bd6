"""``process.run``, the operator's and the worker's entry into their event loop: the main
coroutine runs on uvloop's loop, its result comes back, what it raises propagates, and the
loop is closed afterwards (no loop stays set)."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from agentrun import process


def test_main_runs_on_uvloop_and_returns_its_result() -> None:
    loops: list[asyncio.AbstractEventLoop] = []

    async def main() -> int:
        loops.append(asyncio.get_running_loop())
        await asyncio.sleep(0)
        return 42

    assert process.run(main()) == 42
    assert isinstance(loops[0], uvloop.Loop)
    assert loops[0].is_closed()


def test_what_main_raises_propagates() -> None:
    async def main() -> None:
        raise LookupError("boom")

    with pytest.raises(LookupError, match="boom"):
        process.run(main())
