"""A model call any attempt of which was sent whole and got no answer before the client's read
timeout is charged its prompt's bound, once, whatever the client's later attempts do: the
provider read that prompt, and bills it.

The ``openai`` client retries a read timeout itself (``RetryPolicy.max_retries``): a later
attempt answered with an error, refused, timed out again or cut by a draining worker leaves the
call charged that bound, once; a later attempt that answers is charged what its answer reports,
not the bound besides. A call that never connected, on any attempt, is charged nothing. Against
a model endpoint scripted attempt by attempt, over real HTTP with the real ``openai`` client,
directly or through a proxy taken from the environment; the worker's side through its real
ledger is in ``test_cut_calls_ledger``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gzip
import json
import socket
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from agentrun import kernel, pulling
from agentrun.metrics import ModelErrorType
from agentrun.tools import Catalog
from agentrun.worker import budget
from agentrun.worker.model import ModelClient, ModelError, RetryPolicy
from agentrun.worker.turn import TurnDeps, execute_turn

from .loop import NoSecrets, config
from .test_cut_calls import CALL, PRICING, PROMPT_BOUND, chat
from .test_streaming import Hold

READ_TIMEOUT = 0.5
"""Seconds each attempt waits for an answer (``RetryPolicy.request_timeout``)."""
ANSWER_USAGE = {"prompt_tokens": 1000, "completion_tokens": 20}
"""What the endpoint's answer (``answer``) reports."""


@dataclasses.dataclass
class Endpoint:
    """A model endpoint that meets each attempt of a call as its script says, in turn."""

    script: tuple[str, ...]
    base: str = ""
    """Its base URL (``…/v1``)."""
    attempts: int = 0
    """Attempts it received (a streamed request it refused, ``streams`` False, not counted)."""


@contextlib.asynccontextmanager
async def scripted(*script: str, streams: bool = True) -> AsyncIterator[Endpoint]:
    """An ``Endpoint`` on a loopback port. Each step: ``hold`` reads the request and never
    answers (the client's read timeout); ``refuse`` does the same and stops listening (the
    next attempts are refused); ``stall`` sends a 200's headers, never its body; ``500`` a
    server error; ``answer`` a completion reporting ``ANSWER_USAGE`` (streamed if asked).
    ``streams`` False refuses a streamed request first, as an endpoint that does not stream
    does (the client then sends each call whole)."""
    endpoint, release = Endpoint(script), asyncio.Event()

    async def attempt(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("stream") and not streams:
            error = {"message": "stream is not supported", "param": "stream"}
            return web.json_response({"error": error}, status=400)
        step = endpoint.script[endpoint.attempts]
        endpoint.attempts += 1
        if step == "500":
            return web.json_response({"error": {"message": "upstream failed"}}, status=500)
        if step == "answer":
            return await answer(request, streamed=bool(body.get("stream")))
        if step == "dense":  # a completion with 70,000 {} beside it: 210 KB, 70,000 dicts parsed
            dense = b'{"choices":[],"x":[' + b"{}," * 70_000 + b"{}]}"
            return web.Response(body=dense, content_type="application/json")
        if step == "gzip":  # a coding not asked for (a bomb: 8 MiB of it are gigabytes)
            packed = gzip.compress(b'{"choices":[]}')
            headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
            return web.Response(body=packed, headers=headers)
        if step == "refuse":
            await site.stop()
        response = web.StreamResponse(headers={"content-type": "application/json"})
        if step == "stall":
            response.content_length = 2
            await response.prepare(request)
        await release.wait()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", attempt)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    endpoint.base = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    try:
        yield endpoint
    finally:
        release.set()
        await runner.cleanup()


async def answer(request: web.Request, *, streamed: bool) -> web.StreamResponse:
    """A completion "42" reporting ``ANSWER_USAGE``: one JSON body, or an event stream."""
    message = {"role": "assistant", "content": "42"}
    if not streamed:
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return web.json_response({"id": "a", "choices": [choice], "usage": ANSWER_USAGE})
    response = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await response.prepare(request)
    chunks = [
        {"id": "a", "choices": [{"index": 0, "delta": message, "finish_reason": "stop"}]},
        {"id": "a", "choices": [], "usage": ANSWER_USAGE},
    ]
    for chunk in chunks:
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    return response


def retrying(retries: int = 1) -> ModelClient:
    return ModelClient(RetryPolicy(max_retries=retries, request_timeout=READ_TIMEOUT))


async def failed_call(
    endpoint: Endpoint, *, retries: int = 1
) -> tuple[list[kernel.Usage], ModelErrorType]:
    """Call ``endpoint`` until the client gives up: what the call's watch noted on its hold,
    and the error's type."""
    client, hold = retrying(retries), Hold()
    watch = budget.SpendWatch(hold, CALL, PRICING)
    with pytest.raises(ModelError) as raised:
        await client.complete(chat(endpoint.base), deadline=time.time() + 30, watch=watch)
    await client.close()
    assert watch.noted == hold.noted
    return hold.noted, raised.value.error_type


STREAMS = pytest.mark.parametrize("streams", [True, False], ids=["streamed", "refuses-streaming"])
FAILED_RETRIES = {
    "read-timeout-then-500": (("hold", "500"), 1, ModelErrorType.SERVER_ERROR),
    "read-timeout-then-refused": (("refuse",), 1, ModelErrorType.CONNECTION),
    "read-timeout-twice-then-500": (("hold", "hold", "500"), 2, ModelErrorType.SERVER_ERROR),
}
"""The endpoint's script, the client's retries, what ended the call."""


@STREAMS
@pytest.mark.parametrize(
    ("script", "retries", "error"), FAILED_RETRIES.values(), ids=FAILED_RETRIES.keys()
)
async def test_a_read_timed_out_call_whose_retries_fail_is_charged_its_prompt_once(
    streams: bool, script: tuple[str, ...], retries: int, error: ModelErrorType
) -> None:
    """Once however many attempts timed out reading: the watch notes the bound once."""
    async with scripted(*script, streams=streams) as endpoint:
        assert await failed_call(endpoint, retries=retries) == ([PROMPT_BOUND], error)
    assert endpoint.attempts == len(script)  # "refuse": its retry was refused


async def test_an_answer_whose_body_timed_out_then_a_server_error_charges_the_prompt_once() -> None:
    """Sent whole (not streamed), the client reads a 200's body before it returns and retries
    its read timeout as any other."""
    async with scripted("stall", "500", streams=False) as endpoint:
        assert await failed_call(endpoint) == ([PROMPT_BOUND], ModelErrorType.SERVER_ERROR)
    assert endpoint.attempts == 2


async def test_a_streamed_call_answered_with_a_json_body_that_stalls_is_a_typed_timeout() -> None:
    """An endpoint that answers a streamed request with one JSON body, whose body never comes:
    a ``ModelError`` of type ``timeout`` (not the transport's own error), the prompt noted."""
    async with scripted("stall", "stall") as endpoint:
        assert await failed_call(endpoint) == ([PROMPT_BOUND], ModelErrorType.TIMEOUT)


@pytest.mark.parametrize("step", ["dense", "gzip"])
async def test_an_answer_over_the_bounds_is_refused_unparsed(step: str) -> None:
    """A provider's answer is bounded as a tool server's messages are (bytes, and JSON objects
    and arrays, counted before anything parses it; no content coding): an ``invalid_response``,
    never parsed; the prompt the provider read is charged, once."""
    async with scripted(step, step) as endpoint:
        noted, error = await failed_call(endpoint)
    assert (noted, error) == ([PROMPT_BOUND], ModelErrorType.INVALID_RESPONSE)


async def test_a_proxy_from_the_environment_is_watched_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``HTTP_PROXY`` mounts a proxy transport the client sends every attempt through: its
    read timeout counts as the direct transport's."""
    for name in ("no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    async with scripted("hold", "500") as proxy:
        for name in ("http_proxy", "HTTP_PROXY"):
            monkeypatch.setenv(name, proxy.base.removesuffix("/v1"))
        model = Endpoint((), base="http://model.invalid/v1")  # reached through the proxy only
        assert await failed_call(model) == ([PROMPT_BOUND], ModelErrorType.SERVER_ERROR)
    assert proxy.attempts == 2


@STREAMS
async def test_a_read_timeout_then_an_answer_charges_the_answers_usage_only(
    streams: bool,
) -> None:
    """The turn notes the bound when the first attempt times out (a turn given up then would
    charge it), and the answer's usage replaces it: never both, nothing abandoned."""
    hold = Hold()
    async with scripted("hold", "answer", streams=streams) as endpoint:
        deps = TurnDeps(model=retrying(), catalog=Catalog([]), secrets=NoSecrets())
        run = config(endpoint.base, goal="answer", tools=())
        record = await execute_turn(deps, run, kernel.initial_state(goal="answer"), hold=hold)
        await deps.model.close()
    assert endpoint.attempts == 2
    assert isinstance(record, kernel.Answered)  # the run's usage, charged as it commits
    assert (record.usage.input_tokens, record.usage.output_tokens) == (1000, 20)
    assert len(hold.noted) == 1 and hold.noted[0].output_tokens == 0
    assert hold.spends == [record.usage]
    assert hold.abandoned == []


async def test_a_call_refused_on_every_attempt_is_charged_nothing() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens there once closed
    nowhere = Endpoint((), base=f"http://127.0.0.1:{port}/v1")
    assert await failed_call(nowhere, retries=2) == ([], ModelErrorType.CONNECTION)


async def test_a_drain_hand_back_in_a_read_timeout_backoff_keeps_the_prompt_charged_once() -> None:
    """The hand-back itself charges nothing (another worker asks the model again), but the
    attempt before it was read: its bound stays noted, once, and leaving the turn charges it."""
    client, hold = retrying(), Hold()
    watch = budget.SpendWatch(hold, CALL, PRICING)
    async with scripted("hold", "answer") as endpoint:
        call = asyncio.create_task(
            client.complete(chat(endpoint.base), deadline=time.time() + 30, watch=watch)
        )
        async with asyncio.timeout(10):
            while not watch.noted and not call.done():
                await asyncio.sleep(0.01)
        call.cancel(msg=pulling.HANDED_BACK)  # the client waits to retry
        with pytest.raises(asyncio.CancelledError):
            await call
        await client.close()
    assert endpoint.attempts == 1
    assert hold.noted == [PROMPT_BOUND]
