"""A call's usage is read in a thread when its prompt's bound passes ``IN_THREAD_TOKENS``
(checking a provider's count against the text's floor may read the whole prompt), and in
place otherwise; both read the same usage."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentrun import kernel
from agentrun.worker import turn

from .loop import config

REPLY: dict[str, Any] = {
    "choices": [{"message": {"role": "assistant", "content": "ok"}}],
    "usage": {"prompt_tokens": 0, "completion_tokens": 1},  # under the prompt's floor
}


@pytest.mark.parametrize("bound", [1_000, turn.IN_THREAD_TOKENS + 1], ids=["small", "large"])
async def test_a_large_prompts_usage_is_read_in_a_thread(
    bound: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[object] = []
    to_thread = asyncio.to_thread

    async def recorded(work: Any, *args: Any, **kwargs: Any) -> Any:
        threads.append(work)
        return await to_thread(work, *args, **kwargs)

    monkeypatch.setattr(turn.asyncio, "to_thread", recorded)
    call = kernel.CallModel(0, ({"role": "user", "content": "word " * 1_000},), bound, 100)
    run = config("http://unused/v1", goal="g", tools=())
    usage = await turn._read_usage(REPLY, config=run, call=call, tools=())
    assert usage.input_tokens == kernel.least_tokens(["word " * 1_000]) == 250
    assert len(threads) == (bound > turn.IN_THREAD_TOKENS)
