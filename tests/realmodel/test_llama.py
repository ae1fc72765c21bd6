"""Against a real OpenAI-compatible server: llama-cpp-python's server with SmolLM2-135M-Instruct
(``agentrun_dev.llamaserver``, built once per machine). What real servers send keeps the
worker honest. Seen with llama-cpp-python 0.3.36: a streamed reply arrives one token a chunk
and ends ``length`` at ``max_tokens``, but with no usage chunk (it ignores
``stream_options.include_usage``; its non-streamed answers carry usage) — so the worker's
estimate of a streamed reply without usage is capped at the ``max_tokens`` it sent, or an
honest server's long answer reads as an overrun. The worker's cut closes a real stream
mid-way and the server serves the next request; a run ends capped, within its budget."""

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
from agentrun.worker import delivery, stream
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


def test_a_streamed_reply_honours_max_tokens_and_is_charged_no_less_than_the_server_counts(
    server: llamaserver.LlamaServer,
) -> None:
    answer = asyncio.run(complete(server, 24))
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["choices"][0]["message"]["content"]
    assert delivery.CUT_KEY not in answer  # the server stopped itself: no cut was needed
    assert answer["usage"] is None  # no usage chunk from this server: the worker estimates
    usage = kernel.read_usage(
        answer, pricing=kernel.Pricing(), prompt_estimate=64, max_output_tokens=24
    )
    assert usage.estimated and usage.output_tokens == 24  # capped at max_tokens, not over

    async def whole() -> object:  # the same request not streamed: the server's own counts
        body = request(server, 24).body()
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="-", max_retries=0) as c:
            return await c.post(CHAT_COMPLETIONS, body=body, cast_to=object)

    counted = asyncio.run(whole())
    assert isinstance(counted, dict) and 0 < counted["usage"]["completion_tokens"] <= 24
    assert counted["usage"]["prompt_tokens"] <= 64  # the prompt's bound covers the server


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
    assert 8 < answer[delivery.CUT_KEY] <= 12  # one token a chunk: cut just past 8
    after = asyncio.run(complete(server, 4))  # the server serves the next request
    assert after["choices"][0]["finish_reason"] == "length"


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
    assert state.phase in (Phase.COMPLETED, Phase.TOKEN_BUDGET_EXHAUSTED), state.message
