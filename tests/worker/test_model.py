"""The model adapter retries as the ``openai`` client does, within the run's deadline.

Against the scripted model server over real HTTP: a 429 with ``Retry-After`` is waited out and
retried, a 400 is never retried, and a model that keeps failing is cut at the run's deadline.
Answers whose status would be retried but must not be (an ``insufficient_quota`` 429, a
``Retry-After`` past the deadline) and a content filter's 400 end the call at once, typed.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from http_support import serving

from agentrun import kernel
from agentrun.metrics import ModelErrorType
from agentrun.testing import mockllm, scenario
from agentrun.worker.model import (
    CAUSE_CHARS,
    ChatRequest,
    ModelClient,
    ModelError,
    RetryPolicy,
    judge_error,
    retry_after_seconds,
)

SCRIPT = """
scenarios:
  - name: rate-limited-once
    match: {goal: "rate limit"}
    turns:
      - content: "after the retry"
        fault: {status: 429, times: 1, retry_after: 0.6}
  - name: always-500
    match: {goal: "server down"}
    turns:
      - fault: {status: 500}
  - name: bad-request
    match: {goal: "bad request"}
    turns:
      - fault: {status: 400}
  - name: azure-content-filter
    match: {goal: "filtered"}
    turns:
      - fault:
          status: 400
          body:
            error:
              code: content_filter
              param: prompt
              message: "The response was filtered due to the prompt triggering Azure OpenAI's
                content management policy."
              innererror:
                code: ResponsibleAIPolicyViolation
                content_filter_result: {jailbreak: {filtered: true, detected: true},
                  hate: {filtered: false, severity: safe}}
  - name: out-of-credit
    match: {goal: "no quota"}
    turns:
      - fault:
          status: 429
          body:
            error: {code: insufficient_quota, type: insufficient_quota,
              message: "You exceeded your current quota, please check your plan."}
  - name: echoes-the-key
    match: {goal: "wrong key"}
    turns:
      - fault:
          status: 401
          body:
            error: {code: invalid_api_key, type: invalid_request_error,
              message: "Incorrect API key provided: sk-test-echo-0123456789abcdef."}
  - name: come-back-later
    match: {goal: "come back later"}
    turns:
      - content: "too late"
        fault: {status: 429, times: 1, retry_after: 30}
"""


@pytest.fixture
async def mock() -> AsyncIterator[mockllm.MockLLM]:
    async with mockllm.MockLLM(scenario.parse_scenarios(SCRIPT)) as server:
        yield server


async def ask(
    mock: mockllm.MockLLM,
    goal: str,
    *,
    seconds_left: float = 30.0,
    retries: int = 4,
    api_key: str = "",
) -> str:
    model = ModelClient(RetryPolicy(max_retries=retries))
    try:
        request = ChatRequest(
            base_url=mock.base_url,
            api_key=api_key,
            model="scripted",
            messages=[{"role": "user", "content": goal}],
            tools=[],
            max_output_tokens=100,
        )
        answer = await model.complete(request, deadline=time.time() + seconds_left)
    finally:
        await model.close()
    content = answer["choices"][0]["message"]["content"]
    assert isinstance(content, str)
    return content


async def test_a_rate_limited_call_waits_its_retry_after_and_gets_through(
    mock: mockllm.MockLLM,
) -> None:
    assert await ask(mock, "rate limit") == "after the retry"
    times = [r.time for r in mock.state.requests]
    assert len(times) == 2 and times[1] - times[0] >= 0.55


async def test_a_bad_request_is_not_retried(mock: mockllm.MockLLM) -> None:
    with pytest.raises(ModelError, match="HTTP 400"):
        await ask(mock, "bad request")
    assert len(mock.state.requests) == 1


async def test_a_model_that_keeps_failing_gives_up_after_its_retries(
    mock: mockllm.MockLLM,
) -> None:
    with pytest.raises(ModelError, match="HTTP 500"):
        await ask(mock, "server down", retries=1)
    assert len(mock.state.requests) == 2


async def test_retries_stop_at_the_runs_deadline(mock: mockllm.MockLLM) -> None:
    started = time.monotonic()
    with pytest.raises(ModelError, match="deadline passed"):
        await ask(mock, "server down", seconds_left=1.2, retries=50)
    assert 1.1 < time.monotonic() - started < 3.0
    assert 1 < len(mock.state.requests) < 50


async def test_no_call_starts_after_the_deadline(mock: mockllm.MockLLM) -> None:
    with pytest.raises(ModelError, match="deadline passed"):
        await ask(mock, "rate limit", seconds_left=-1)
    assert not mock.state.requests


async def test_a_content_filter_400_is_not_retried_and_names_the_filter_and_category(
    mock: mockllm.MockLLM,
) -> None:
    with pytest.raises(ModelError) as caught:
        await ask(mock, "filtered")
    assert caught.value.fault is kernel.ModelFault.FILTERED
    assert str(caught.value) == (
        "the provider's content filter (ResponsibleAIPolicyViolation) rejected the request on "
        "the prompt: jailbreak; it said: The response was filtered due to the prompt triggering "
        "Azure OpenAI's content management policy."
    )
    assert len(mock.state.requests) == 1


async def test_an_insufficient_quota_429_is_not_retried(mock: mockllm.MockLLM) -> None:
    with pytest.raises(ModelError, match="HTTP 429 insufficient_quota") as caught:
        await ask(mock, "no quota", retries=4)
    assert caught.value.fault is kernel.ModelFault.UNAVAILABLE
    assert "exceeded your current quota" in str(caught.value)
    assert len(mock.state.requests) == 1


async def test_a_retry_after_past_the_deadline_ends_at_once_instead_of_waiting(
    mock: mockllm.MockLLM,
) -> None:
    started = time.monotonic()
    with pytest.raises(ModelError, match="retry after 30 s, past the run's deadline") as caught:
        await ask(mock, "come back later", seconds_left=10)
    assert caught.value.fault is kernel.ModelFault.WAIT_BEYOND_DEADLINE
    assert time.monotonic() - started < 5.0  # one call, not the 30 s wait (room for a busy host)
    assert len(mock.state.requests) == 1


RATE_LIMITED = {"error": {"code": "rate_limit_exceeded", "type": "requests", "message": "slow"}}


FILTERS = {
    "openai-invalid-prompt": (
        400,
        {"code": "invalid_prompt", "message": "your prompt was flagged as potentially violating"},
    ),
    "openai-content-policy": (400, {"code": "content_policy_violation"}),
    "gateway-by-message": (
        400,
        {"code": "400", "message": "litellm.ContentPolicyViolationError: the prompt violates it"},
    ),
    "gemini-status": (400, {"status": "SAFETY", "message": "blocked"}),
    "guardrail-403": (403, {"message": "Guardrail intervened: the input was blocked"}),
}
"""Content filters' refusals other than Azure's (the D05 case's own shape is above)."""
NOT_FILTERS = {
    "context-length-400": (
        400,
        {"code": "context_length_exceeded", "message": "maximum context length is 8192 tokens"},
    ),
    "filter-code-on-a-5xx": (500, {"code": "content_filter"}),
}


@pytest.mark.parametrize("shape", [*FILTERS, *NOT_FILTERS])
def test_every_providers_content_filter_is_refused_and_nothing_else(shape: str) -> None:
    """D05's kind: a 400, 403 or 422 whose code, type, status or inner code names a content
    policy, or whose message says so, is ``filtered`` (the run ends ``refused``, not
    retried), with or without the ``{"error": …}`` wrapper; nothing else is."""
    status, error = FILTERS.get(shape) or NOT_FILTERS[shape]
    for body in ({"error": error}, error):
        verdict = judge_error(status, body, retry_after=None, seconds_left=10.0)
        assert (verdict.fault.value if verdict else None) == (
            "filtered" if shape in FILTERS else None
        )


@pytest.mark.parametrize(
    ("status", "body", "retry_after", "fault"),
    [
        pytest.param(400, {"error": {"code": "content_filter"}}, None, "filtered", id="filter"),
        pytest.param(
            400,
            {"error": {"innererror": {"code": "ResponsibleAIPolicyViolation"}}},
            None,
            "filtered",
            id="filter-by-inner-code",
        ),
        pytest.param(400, {"error": {"code": "invalid_value"}}, None, None, id="other-400"),
        pytest.param(
            429, {"error": {"type": "insufficient_quota"}}, None, "unavailable", id="quota"
        ),
        pytest.param(429, RATE_LIMITED, 5.0, None, id="rate-limit-within-deadline"),
        pytest.param(429, RATE_LIMITED, 11.0, "wait_beyond_deadline", id="rate-limit-past"),
        pytest.param(503, "not json", 60.0, "wait_beyond_deadline", id="503-past"),
        pytest.param(503, None, None, None, id="503-no-header"),
        pytest.param(400, None, 60.0, None, id="400-never-retried-anyway"),
        pytest.param(429, [1, 2], None, None, id="body-not-an-object"),
    ],
)
def test_judge_error_rules_only_on_answers_that_must_not_be_retried(
    status: int, body: object, retry_after: float | None, fault: str | None
) -> None:
    verdict = judge_error(status, body, retry_after=retry_after, seconds_left=10.0)
    assert (verdict.fault if verdict else None) == fault


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        pytest.param({"retry-after": "7"}, 7.0, id="seconds"),
        pytest.param({"retry-after-ms": "250", "retry-after": "9"}, 0.25, id="ms-first"),
        pytest.param({"retry-after": "Thu, 01 Jan 1970 00:01:40 GMT"}, 40.0, id="http-date"),
        pytest.param({"retry-after": "soon"}, None, id="unreadable"),
        pytest.param({}, None, id="absent"),
    ],
)
def test_retry_after_reads_seconds_milliseconds_and_dates(
    headers: dict[str, str], seconds: float | None
) -> None:
    assert retry_after_seconds(headers, now=60.0) == seconds


async def test_a_provider_error_echoing_the_key_is_redacted_and_not_chained(
    mock: mockllm.MockLLM,
) -> None:
    key = "sk-test-echo-0123456789abcdef"
    with pytest.raises(ModelError) as caught:
        await ask(mock, "wrong key", api_key=key)
    assert str(caught.value).startswith("HTTP 401: ")
    assert str(caught.value).endswith("Incorrect API key provided: [redacted].")
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert [r.api_key for r in mock.state.requests] == [key]


@pytest.mark.parametrize(
    "key",
    ["sk-first-0123456789\nsk-second-0123456789", "sk-first-0123456789\r\nsk-second-0123456789"],
    ids=["LF", "CRLF"],
)
async def test_a_key_the_http_client_refuses_is_not_quoted_escaped(key: str) -> None:
    """A key the HTTP client will not send (a line break inside the Secret's value: two keys,
    a file written with CRLF) is refused naming the header as ``bytes``, escaped: neither the
    key, nor a part of it, nor its escaped form reaches the error (the run's status, its
    Events)."""

    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "unreachable"}}, status=401)

    async with serving({"/v1/chat/completions": refuse}) as base:
        error = await failed_call(base + "/v1", api_key=key)
    message = str(error)
    assert "Illegal header value" in message and "[redacted]" in message, message
    for shown in (key, *key.split(), repr(key.encode())[2:-1], "0123456789"):
        assert shown not in message, message


@pytest.mark.parametrize(
    ("goal", "options", "error_type"),
    [
        pytest.param("bad request", {}, ModelErrorType.CLIENT_ERROR, id="400"),
        pytest.param("wrong key", {}, ModelErrorType.AUTH, id="401"),
        pytest.param("no quota", {}, ModelErrorType.RATE_LIMITED, id="429-no-quota"),
        pytest.param("server down", {"retries": 1}, ModelErrorType.SERVER_ERROR, id="500"),
        pytest.param("filtered", {}, ModelErrorType.FILTERED, id="content-filter"),
        pytest.param("come back later", {"seconds_left": 5}, ModelErrorType.DEADLINE, id="late"),
        pytest.param("rate limit", {"seconds_left": -1}, ModelErrorType.DEADLINE, id="expired"),
    ],
)
async def test_a_failed_call_says_why_in_a_bounded_error_type(
    mock: mockllm.MockLLM, goal: str, options: dict[str, Any], error_type: ModelErrorType
) -> None:
    # The error_type label of agentrun_model_call_errors_total: one of a closed set.
    with pytest.raises(ModelError) as caught:
        await ask(mock, goal, **options)
    assert caught.value.error_type is error_type


async def failed_call(
    base_url: str, *, request_timeout: float = 120.0, api_key: str = ""
) -> ModelError:
    """The error of one call, retried by no one, to ``base_url``."""
    model = ModelClient(RetryPolicy(max_retries=0, request_timeout=request_timeout))
    request = ChatRequest(
        base_url=base_url,
        api_key=api_key,
        model="scripted",
        messages=[{"role": "user", "content": "hello"}],
        tools=[],
        max_output_tokens=10,
    )
    try:
        with pytest.raises(ModelError) as caught:
            await model.complete(request, deadline=time.time() + 10)
    finally:
        await model.close()
    return caught.value


async def test_an_endpoint_that_refuses_connections_is_a_connection_error() -> None:
    async with mockllm.MockLLM(scenario.parse_scenarios(SCRIPT)) as gone:
        base_url = gone.base_url  # closed when the block ends: nothing listens there
    error = await failed_call(base_url)
    assert error.error_type is ModelErrorType.CONNECTION
    assert "ConnectionRefusedError" in str(error)


SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)
CHUNK = b'data: {"choices": [{"index": 0, "delta": {"content": "hel"}}]}\n\n'


async def closes_before_answering(writer: asyncio.StreamWriter) -> None:
    writer.close()


async def breaks_mid_stream(writer: asyncio.StreamWriter) -> None:
    writer.write(SSE_HEAD + b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK))
    await writer.drain()
    await asyncio.sleep(0.1)
    writer.transport.abort()  # a reset, the chunked body unfinished


async def never_answers(writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(5)
    writer.close()


async def stalls_mid_stream(writer: asyncio.StreamWriter) -> None:
    writer.write(SSE_HEAD + b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK))
    await writer.drain()
    await never_answers(writer)


@pytest.mark.parametrize(
    ("serve", "error_type"),
    [
        pytest.param(closes_before_answering, ModelErrorType.CONNECTION, id="closed"),
        pytest.param(breaks_mid_stream, ModelErrorType.CONNECTION, id="reset-mid-stream"),
        pytest.param(never_answers, ModelErrorType.TIMEOUT, id="silent"),
        pytest.param(stalls_mid_stream, ModelErrorType.TIMEOUT, id="stalled-mid-stream"),
    ],
)
async def test_an_endpoint_failing_at_the_socket_is_a_typed_model_error(
    serve: Callable[[asyncio.StreamWriter], Awaitable[None]], error_type: ModelErrorType
) -> None:
    """Before the answer or while it streams (the client's retries are over then), a broken
    or silent connection is a ``ModelError`` of its type, read from the error's causes."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await serve(writer)

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        error = await failed_call(f"http://127.0.0.1:{port}/v1", request_timeout=0.5)
    finally:
        server.close()
    assert error.error_type is error_type, str(error)
    assert "CancelledError" not in str(error)


async def test_a_cause_quoting_the_endpoint_is_cut_and_never_shows_the_key() -> None:
    """An endpoint answering an illegal header line that echoes the key at length: the error
    names the protocol fault, without the key, within its bound."""
    key = "sk-hostile-echo"

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        line = b"\x00" + key.encode() + b"x" * 5000
        writer.write(b"HTTP/1.1 200 OK\r\n" + line + b"\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        error = await failed_call(f"http://127.0.0.1:{port}/v1", api_key=key)
    finally:
        server.close()
    assert error.error_type is ModelErrorType.CONNECTION
    assert "RemoteProtocolError" in str(error) and key not in str(error)
    assert len(str(error)) <= len("no connection to the model endpoint: ") + CAUSE_CHARS


def chat(base: str, *, api_key: str = "sk-0123456789") -> ChatRequest:
    """A short call to the endpoint at ``base`` (its ``/v1`` path)."""
    return ChatRequest(
        base_url=f"{base}/v1",
        api_key=api_key,
        model="m",
        messages=[{"role": "user", "content": "x" * 2_000}],
        tools=[],
        max_output_tokens=10,
    )


async def test_an_error_event_mid_stream_is_a_server_error_with_the_key_redacted() -> None:
    """OpenAI and OpenAI-compatible gateways report an upstream failure after the 200 as an
    error event in the stream; the client raises its base ``APIError`` for it. It is a
    ``ModelError`` like any other failed call, the key it quotes redacted, nothing chained."""
    key = "sk-tenant-b-0123456789abcdef"

    async def stream_then_error(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        delta = {"role": "assistant", "content": "hi"}
        chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
        chunk["choices"] = [{"index": 0, "delta": delta}]
        error = {"error": {"message": f"upstream refused '{request.headers['Authorization']}'"}}
        for event in (chunk, error):
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", stream_then_error)
    client = ModelClient(RetryPolicy(max_retries=0))
    async with serving(app) as base:
        with pytest.raises(ModelError) as caught:
            await client.complete(chat(base, api_key=key), deadline=time.time() + 30)
        await client.close()
    assert caught.value.error_type is ModelErrorType.SERVER_ERROR
    assert str(caught.value) == (
        "the model endpoint failed mid-response: upstream refused 'Bearer [redacted]'"
    )
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


async def test_a_redirect_from_the_model_endpoint_is_an_error_and_sends_nothing_on() -> None:
    """A 307 would re-send the whole conversation to any address the endpoint names, with no
    address check: it is not followed (an HTTP 307 error), as MCP and ``http_get`` do not."""
    seen: list[str] = []

    async def elsewhere(request: web.Request) -> web.Response:
        seen.append(await request.text())
        return web.json_response({})

    async def moved(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(f"http://127.0.0.1:{request.url.port}/elsewhere")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", moved)
    app.router.add_post("/elsewhere", elsewhere)
    client = ModelClient(RetryPolicy(max_retries=0))
    async with serving(app) as base:
        with pytest.raises(ModelError, match="HTTP 307"):
            await client.complete(chat(base), deadline=time.time() + 30)
        await client.close()
    assert seen == []
