"""A raw OpenAI-compatible endpoint whose every byte the test writes (aiohttp), and a one-turn
driver through the worker's real turn code and the real ``openai`` client."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from decimal import Decimal
from typing import Any

from aiohttp import web
from http_support import serving

from agentrun import kernel
from agentrun.protocol import ModelConfig, RunConfig
from agentrun.tools import Calculate, Catalog
from agentrun.worker.model import ModelClient, RetryPolicy
from agentrun.worker.turn import TurnDeps, execute_turn

from .loop import NoSecrets, config

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@contextlib.asynccontextmanager
async def serve(handler: Handler) -> AsyncIterator[str]:
    """``handler`` answering ``POST /v1/chat/completions`` on a loopback port; yields the base
    URL an OpenAI client is given."""
    async with serving({"/v1/chat/completions": handler}) as url:
        yield f"{url}/v1"


async def sse(
    request: web.Request, chunks: list[dict[str, Any]], *, done: bool = True, delay: float = 0.0
) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for chunk in chunks:
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        if delay:
            await asyncio.sleep(delay)
    if done:
        await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def chunk(
    delta: dict[str, Any] | None = None,
    *,
    finish: str | None = None,
    usage: dict[str, Any] | None = None,
    choices: bool = True,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "model": "m",
        "created": 0,
    }
    out["choices"] = (
        [{"index": 0, "delta": delta or {}, "finish_reason": finish}] if choices else []
    )
    if usage is not None:
        out["usage"] = usage
    return out


PRICING = kernel.Pricing(input_per_million=Decimal(1), output_per_million=Decimal(4))


def run_config(
    url: str,
    *,
    limits: kernel.Limits,
    timeout: float = 30,
    pricing: kernel.Pricing = PRICING,
    tools: tuple[str, ...] = (),
) -> RunConfig:
    """``loop.config`` for model ``url`` with ``pricing`` and an output allowance of 4,096."""
    base = config(url, goal="answer", tools=tools, limits=limits, timeout=timeout)
    model = ModelConfig("mock", url, "scripted", pricing, 32000, 4096)
    return dataclasses.replace(base, model=model)


async def one_turn(
    url: str,
    *,
    limits: kernel.Limits,
    hold: Any = None,
    retries: int = 0,
    timeout: float = 30,
    tools: tuple[str, ...] = (),
    pricing: kernel.Pricing = PRICING,
    request_timeout: float = 120.0,
) -> tuple[kernel.TurnRecord, kernel.RunState]:
    model = ModelClient(RetryPolicy(max_retries=retries, request_timeout=request_timeout))
    try:
        deps = TurnDeps(model=model, catalog=Catalog([Calculate()]), secrets=NoSecrets())
        config = run_config(url, limits=limits, timeout=timeout, tools=tools, pricing=pricing)
        state = kernel.initial_state(goal=config.goal)
        record = await execute_turn(deps, config, state, hold=hold)
        return record, kernel.advance(state, record, config.limits)
    finally:
        await model.close()
