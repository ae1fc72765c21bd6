"""A streamed answer whose body ends cleanly before the model finished — no chunk gives its
choice a ``finish_reason``, no ``data: [DONE]``, as a gateway that gives up on its upstream
ends it — is a broken stream (``model_error``, charged what it delivered), never a final
answer. Before, its text, cut wherever the stream stopped, ended the run ``completed``
(outcome ok)."""

from __future__ import annotations

import time

import pytest
from aiohttp import web
from http_support import serving

from agentrun import kernel
from agentrun.metrics import ModelErrorType
from agentrun.worker.delivery import Delivery
from agentrun.worker.model import ChatRequest, ModelClient, ModelError, RetryPolicy

from .rawmodel import chunk, one_turn, serve, sse

PARTS = ["The migration is safe to run: ", "first back up the database, then"]


async def cut_off(request: web.Request) -> web.StreamResponse:
    await request.json()
    return await sse(request, [chunk({"content": part}) for part in PARTS], done=False)


async def test_a_stream_cut_before_its_finish_is_no_final_answer() -> None:
    limits = kernel.Limits(max_tokens=100_000, max_output_tokens=1000)
    async with serve(cut_off) as url:
        _record, state = await one_turn(url, limits=limits)
    assert state.phase is kernel.Phase.MODEL_ERROR, (state.phase, state.answer)
    assert "ended before the model finished" in state.message


class Watch:
    def __init__(self) -> None:
        self.abandoned_at: Delivery | None = None

    async def progress(self, delivery: Delivery) -> None:
        pass

    def abandoned(self, delivery: Delivery) -> None:
        self.abandoned_at = delivery

    def unanswered(self, cut: BaseException) -> None:
        pass


async def test_the_unfinished_stream_is_abandoned_at_what_it_delivered() -> None:
    watch = Watch()
    model = ModelClient(RetryPolicy(max_retries=0, request_timeout=10))
    async with serving({"/v1/chat/completions": cut_off}) as base:
        request = ChatRequest(f"{base}/v1", "", "m", [{"role": "user", "content": "hi"}], [], 99)
        with pytest.raises(ModelError) as raised:
            await model.complete(request, deadline=time.time() + 20, watch=watch)
        await model.close()
    assert raised.value.error_type is ModelErrorType.CONNECTION
    assert watch.abandoned_at is not None and watch.abandoned_at.content == PARTS
