"""An answer of HTTP 200 whose JSON body is an error object and no choices (OpenRouter's
"Provider returned error", LiteLLM and other gateways whose upstream failed) is a server error
of the model endpoint, as the same error streamed (``data: {"error": …}``) is. Before, it was
classified as the model's own reply without choices: a malformed turn, charged an estimate and
fed back to the model as a correction, until the run ended ``invalid_decision``."""

from __future__ import annotations

import time

import pytest
from aiohttp import web
from http_support import serving

from agentrun.metrics import ModelErrorType
from agentrun.worker.model import ChatRequest, ModelClient, ModelError, RetryPolicy

KEY = "sk-tenant-secret-0123456789"
ERRORS = {
    "message": {"error": {"message": f"Provider returned error (key {KEY})", "code": 502}},
    "text": {"error": "upstream overloaded"},
}


@pytest.mark.parametrize("stream", [True, False], ids=["asked-streamed", "sent-whole"])
@pytest.mark.parametrize("error", sorted(ERRORS))
async def test_an_error_body_with_200_is_a_server_error(error: str, stream: bool) -> None:
    async def answer(request: web.Request) -> web.StreamResponse:
        await request.json()
        return web.json_response(ERRORS[error])

    model = ModelClient(RetryPolicy(max_retries=0, request_timeout=10))
    async with serving({"/v1/chat/completions": answer}) as base:
        model._unstreamed = {(f"{base}/v1", "m")} if not stream else set()
        request = ChatRequest(f"{base}/v1", KEY, "m", [{"role": "user", "content": "hi"}], [], 10)
        with pytest.raises(ModelError) as raised:
            await model.complete(request, deadline=time.time() + 20)
        await model.close()
    assert raised.value.error_type is ModelErrorType.SERVER_ERROR
    assert "answered with an error" in str(raised.value)
    assert KEY not in str(raised.value)


async def test_an_answer_with_choices_and_an_error_field_is_an_answer() -> None:
    async def answer(request: web.Request) -> web.StreamResponse:
        await request.json()
        message = {"role": "assistant", "content": "ok"}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return web.json_response({"choices": [choice], "error": None})

    model = ModelClient(RetryPolicy(max_retries=0, request_timeout=10))
    async with serving({"/v1/chat/completions": answer}) as base:
        request = ChatRequest(f"{base}/v1", "", "m", [{"role": "user", "content": "hi"}], [], 10)
        got = await model.complete(request, deadline=time.time() + 20)
        await model.close()
    assert got["choices"][0]["message"]["content"] == "ok"
