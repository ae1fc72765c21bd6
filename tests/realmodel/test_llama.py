"""Against a real OpenAI-compatible server: llama-cpp-python's server with SmolLM2-135M-Instruct
(``agentrun_dev.llamaserver``, built once per machine). What real servers send keeps the
worker honest: a streamed reply arrives in chunks, its usage comes in the final chunk, the
server honours ``max_tokens``, the worker's cut closes a stream mid-way and the server serves
the next request, and a run through the worker ends with a typed reason and the server's
own counts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from agentrun import kernel
from agentrun.kernel import Phase
from agentrun.protocol import ModelConfig, RunConfig
from agentrun.tools import Catalog
from agentrun.worker import stream
from agentrun.worker.model import CHAT_COMPLETIONS, ChatRequest, ModelClient, RetryPolicy
from agentrun.worker.turn import TurnDeps, execute_turn
from agentrun_dev import llamaserver

pytestmark = pytest.mark.realmodel

PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[llamaserver.LlamaServer]:
    install = llamaserver.ensure_llama_server()
    started = llamaserver.start_llama_server(install, tmp_path_factory.mktemp("llama"))
    try:
        yield started
    finally:
        started.stop()


def request(server: llamaserver.LlamaServer, max_tokens: int) -> ChatRequest:
    return ChatRequest(server.base_url, "", server.model, PROMPT, [], max_tokens)


async def complete(server: llamaserver.LlamaServer, max_tokens: int) -> dict:
    model = ModelClient(RetryPolicy(max_retries=0, request_timeout=120))
    try:
        return await model.complete(request(server, max_tokens), deadline=time.time() + 120)
    finally:
        await model.close()


def test_a_streamed_reply_carries_the_servers_usage_and_honours_max_tokens(
    server: llamaserver.LlamaServer,
) -> None:
    answer = asyncio.run(complete(server, 24))
    usage = answer["usage"]
    assert usage is not None, "the server sent no usage chunk"
    assert 0 < usage["completion_tokens"] <= 24
    assert usage["prompt_tokens"] > 0
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["choices"][0]["message"]["content"]
    assert stream.CUT_KEY not in answer  # the server stopped itself: no cut was needed


def test_the_workers_cut_closes_a_real_stream_and_the_server_goes_on(
    server: llamaserver.LlamaServer,
) -> None:
    async def cut() -> object:
        body = request(server, 200).body()
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="-", max_retries=0) as c:
            # ask for 200 tokens, cut at 8: what a provider ignoring max_tokens meets
            return await stream.read_stream(
                c, CHAT_COMPLETIONS, body, max_output_tokens=8, watch=None
            )

    answer = asyncio.run(cut())
    assert isinstance(answer, dict)
    assert answer["choices"][0]["finish_reason"] == "length" and answer["usage"] is None
    assert 8 < answer[stream.CUT_KEY] <= 12
    after = asyncio.run(complete(server, 4))  # the server serves the next request
    assert after["usage"]["completion_tokens"] <= 4


def test_a_run_through_the_worker_ends_capped_on_the_servers_counts(
    server: llamaserver.LlamaServer, tmp_path: Path
) -> None:
    limits = kernel.Limits(max_tokens=300, max_output_tokens=256)
    config = RunConfig(
        uid="uid-llama",
        namespace="ns",
        name="llama",
        goal="Write a long story about a lighthouse keeper.",
        instructions="",
        tools=(),
        limits=limits,
        model=ModelConfig("smollm2", server.base_url, server.model, kernel.Pricing(), 2048, 256),
        deadline=time.time() + 240,
    )

    class NoSecrets:
        async def api_key(self, ref: object) -> str:
            raise AssertionError("no key")

    async def run() -> kernel.RunState:
        model = ModelClient(RetryPolicy(max_retries=0, request_timeout=120))
        deps = TurnDeps(model=model, catalog=Catalog([]), secrets=NoSecrets())
        state = kernel.initial_state(goal=config.goal)
        while not state.phase.is_terminal:
            state = kernel.advance(state, await execute_turn(deps, config, state), limits)
        await model.close()
        return state

    state = asyncio.run(run())
    assert state.usage.total_tokens <= 300, state.message
    assert not state.usage.estimated  # the server's own counts, from the usage chunk
    assert state.phase in (Phase.COMPLETED, Phase.TOKEN_BUDGET_EXHAUSTED), state.message
