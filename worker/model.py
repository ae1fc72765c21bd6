"""The model adapter: one chat-completions call through the real ``openai`` client.

What belongs here: building the request, bounding it by the run's deadline, and returning the
raw JSON object for the kernel to classify. What does not: classification
(``agentrun.kernel.decision``) or budgets (the caller passes ``max_output_tokens``).

Retries are the ``openai`` client's own (``max_retries``): it retries 408, 409, 429 and 5xx
answers, timeouts and connection errors, honours ``Retry-After`` / ``retry-after-ms`` (up to
two minutes), and otherwise backs off exponentially with jitter; other 4xx answers are not
retried. The whole call, retries and their waits included, is cut at the run's deadline.

Some error answers must not be retried although their status says so, or mean more than
"no answer" (``judge_error``): a content filter's 400 (Azure OpenAI's shape: ``code:
content_filter``, ``innererror.content_filter_result``) ends the run ``refused`` naming the
filter and its categories; an ``insufficient_quota`` 429 (OpenAI: the account is out of
credit, retrying cannot help) ends it ``model_error`` at once; a ``Retry-After`` reaching past
the run's deadline ends it ``deadline_exceeded`` at once instead of waiting. The client is
told so through its own override: a response hook sets ``x-should-retry: false`` on such an
answer, which the client obeys before its status rules; the raised ``ModelError`` carries the
kernel's ``ModelFault``.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import email.utils
import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import openai

from agentrun import display, kernel
from agentrun.kernel import ModelFault
from agentrun.metrics import ModelErrorType

from .answers import AnswerTooLarge, AnswerUnparsable, AttemptClient, cut_unanswered, parsed
from .stream import StreamWatch, read_stream, refuses_streaming

CHAT_COMPLETIONS = "/chat/completions"
"""Path under the base URL (OpenAI API reference: Create chat completion)."""


class ModelError(Exception):
    """The model could not give a response (permanent error, retries exhausted, or the run's
    deadline passed); ``fault`` says which kind of failure it was (what the run ends as),
    ``error_type`` why it failed (the ``error_type`` label of the model-call error metric)."""

    def __init__(
        self,
        message: str,
        *,
        fault: kernel.ModelFault = kernel.ModelFault.UNAVAILABLE,
        error_type: ModelErrorType = ModelErrorType.CONNECTION,
    ) -> None:
        super().__init__(message)
        self.fault = fault
        self.error_type = error_type


def status_error_type(status: int, *, fault: kernel.ModelFault) -> ModelErrorType:
    """The ``error_type`` of a call the provider answered with HTTP ``status`` (an error)."""
    if fault is ModelFault.FILTERED:
        return ModelErrorType.FILTERED
    if fault is ModelFault.WAIT_BEYOND_DEADLINE:
        return ModelErrorType.DEADLINE
    if status == 429:
        return ModelErrorType.RATE_LIMITED
    if status in (401, 403):
        return ModelErrorType.AUTH
    return ModelErrorType.SERVER_ERROR if status >= 500 else ModelErrorType.CLIENT_ERROR


def _refused(err: openai.APIStatusError, *, api_key: str, deadline: float) -> ModelError:
    """The ``ModelError`` of an error answer the client gave up on (or must not retry): the
    verdict of `judge_error` when it rules, else ``HTTP <status>``; ``api_key`` redacted."""
    verdict = _judge_response(err.response, deadline=deadline)
    if verdict is not None:
        message, fault = verdict.message, verdict.fault
    else:
        message, fault = f"HTTP {err.status_code}: {err.message}", ModelFault.UNAVAILABLE
    return ModelError(
        redact(message, api_key),
        fault=fault,
        error_type=status_error_type(err.status_code, fault=fault),
    )


def _failed_midway(err: openai.APIError, *, api_key: str) -> ModelError:
    """The ``ModelError`` of a response that began (HTTP 200) and then carried an error
    event (``data: {"error": …}``, as OpenAI and OpenAI-compatible gateways send when the
    upstream fails mid-response): a server error, its message cut to ``CAUSE_CHARS`` with
    ``api_key`` redacted (a gateway may quote the credentials it was sent)."""
    why = redact(str(err.message), api_key)[:CAUSE_CHARS]
    return ModelError(
        f"the model endpoint failed mid-response: {why}", error_type=ModelErrorType.SERVER_ERROR
    )


CAUSE_CHARS = 300
"""Most characters of a failed call's innermost cause its message keeps: the cause can quote
what the endpoint sent (an illegal header line), which a run's status and Events show."""


def _unanswered(err: Exception, *, api_key: str) -> ModelError:
    """The ``ModelError`` of a call that got no usable answer: a timeout of the client, no
    connection or one that broke, before the answer or while it streamed (the client's
    ``APIConnectionError``, ``APITimeoutError`` a subclass), the run's deadline
    (``TimeoutError`` of its ``asyncio.timeout``), an answer the parser refuses
    (``answers.AnswerUnparsable``: not JSON, an integer past 4,300 digits, nested too deeply),
    or one over the bounds of an answer (``answers.AnswerTooLarge``, ``invalid_response``).
    The message names the innermost cause (the refused connect,
    the reset, the read that timed out): the client's own says only that it failed. That
    cause is cut to ``CAUSE_CHARS`` and ``api_key`` redacted from it, as it may quote the
    endpoint."""
    if isinstance(err, openai.APIConnectionError):
        causes = _causes(err)
        timed_out = any(isinstance(cause, TimeoutError) for cause in causes) or (
            len(causes) == 1 and isinstance(err, openai.APITimeoutError)
        )
        root = next(c for c in reversed(causes) if not isinstance(c, asyncio.CancelledError))
        why = redact(f"{type(root).__name__}: {root}", api_key)[:CAUSE_CHARS]
        if isinstance(root, AnswerTooLarge):
            message = f"the model endpoint's answer was refused unread: {why}"
            return ModelError(message, error_type=ModelErrorType.INVALID_RESPONSE)
        if timed_out:
            message = f"the model endpoint timed out: {why}"
            return ModelError(message, error_type=ModelErrorType.TIMEOUT)
        message = f"no connection to the model endpoint: {why}"
        return ModelError(message, error_type=ModelErrorType.CONNECTION)
    if isinstance(err, TimeoutError):
        message = "the run's deadline passed while calling the model"
        return ModelError(message, error_type=ModelErrorType.DEADLINE)
    message = f"the model endpoint's answer could not be parsed: {err}"
    return ModelError(message, error_type=ModelErrorType.INVALID_RESPONSE)


def _causes(err: BaseException) -> list[BaseException]:
    """``err`` and the exceptions it was raised from or during, outermost first.

    Whether a call timed out is read from these, not from the client's own class, which
    depends on its HTTP transport: httpx's (the default) chains the ``TimeoutError`` of the
    read that timed out; the aiohttp one the ``openai`` client ships raises its timeout class
    for a refused or reset connection too, chained from the ``OSError``."""
    causes: list[BaseException] = []
    cause: BaseException | None = err
    while cause is not None and cause not in causes:
        causes.append(cause)
        cause = cause.__cause__ or cause.__context__
    return causes


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """What a provider's error answer means, when it must not be retried."""

    fault: kernel.ModelFault
    message: str


NO_RETRY_HEADER = "x-should-retry"
"""The ``openai`` client's own override: ``false`` means "do not retry", checked before the
status (openai-python ``_base_client._should_retry``)."""
RETRYABLE_STATUSES = frozenset({408, 409, 429})
"""Statuses the client retries (and every 5xx)."""
_DEADLINE: contextvars.ContextVar[float] = contextvars.ContextVar("agentrun_model_deadline")
"""The deadline (epoch seconds) of the call in flight in this task, for the response hook."""


REDACTED = "[redacted]"
"""What stands in a message for the API key it would otherwise show."""


def redact(text: str, secret: str) -> str:
    """``text`` without ``secret`` (a provider's error may echo the key it was sent, e.g.
    "Incorrect API key provided: sk-…"), nor its whitespace-separated parts, nor their escaped
    forms (``display.secret_parts``: the HTTP client refusing a key with a line break in it
    quotes the header as ``bytes``); an empty secret changes nothing."""
    if not secret:
        return text
    return display.redact(text, display.by_length({secret} | display.secret_parts(secret)))


def retry_after_seconds(headers: Mapping[str, str], *, now: float) -> float | None:
    """Seconds a provider asks to wait: ``retry-after-ms``, else ``Retry-After`` in seconds or
    as an HTTP date (RFC 9110 section 10.2.3); ``None`` when absent or unreadable."""
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            delay = float(value) / divisor
        except ValueError:
            continue
        return delay if not math.isnan(delay) else None
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return email.utils.parsedate_to_datetime(value).timestamp() - now
    except (TypeError, ValueError, IndexError):
        return None


def _error_object(body: Any) -> Mapping[str, Any]:
    error = body.get("error", body) if isinstance(body, Mapping) else None
    return error if isinstance(error, Mapping) else {}


FILTER_STATUSES = frozenset({400, 403, 422})
"""Statuses a provider refuses a request with when its content policy blocks it."""
FILTER_CODES = frozenset(
    {
        "content_filter",  # Azure OpenAI
        "responsibleaipolicyviolation",  # Azure OpenAI, innererror.code
        "content_policy_violation",  # OpenAI (images, moderation), LiteLLM
        "contentpolicyviolationerror",  # LiteLLM's exception name, as its proxy's code
        "invalid_prompt",  # OpenAI: "your prompt was flagged as potentially violating …"
        "prompt_blocked",
        "safety",  # Gemini's block reason
        "prohibited_content",  # Gemini
        "guardrail_intervened",  # Bedrock guardrails behind OpenAI-compatible gateways
    }
)
"""Error codes (any case) that mean a provider's content policy blocked the request."""
FILTER_WORDS = re.compile(
    r"content[ _-]?(management[ _-]?)?polic|content[ _-]?filter|flagged as potentially "
    r"violating|responsible ?ai|safety (system|filter|settings)|guardrail",
    re.IGNORECASE,
)
"""What a provider's error message says when its content policy blocked the request and its
code does not (a gateway's generic code, a provider of its own words)."""


def _filter_rule(error: Mapping[str, Any]) -> str | None:
    """The code (or ``"message"``) by which ``error`` says a content policy blocked the
    request: its ``innererror.code``, ``code``, ``type`` or ``status`` among
    ``FILTER_CODES``, or its message in ``FILTER_WORDS``; ``None`` otherwise."""
    inner = error.get("innererror")
    codes = [inner.get("code") if isinstance(inner, Mapping) else None]
    codes += [error.get("code"), error.get("type"), error.get("status")]
    for code in codes:
        if isinstance(code, str) and code.lower() in FILTER_CODES:
            return code
    message = error.get("message")
    if isinstance(message, str) and FILTER_WORDS.search(message[:2000]):
        return "message"
    return None


def _filter_categories(error: Mapping[str, Any]) -> list[str]:
    """The categories a content filter flagged (Azure: ``innererror.content_filter_result``,
    each ``{filtered: true}`` or ``{detected: true}``)."""
    inner = error.get("innererror")
    result = inner.get("content_filter_result") if isinstance(inner, Mapping) else None
    if not isinstance(result, Mapping):
        return []
    return sorted(
        str(name)
        for name, verdict in result.items()
        if isinstance(verdict, Mapping) and (verdict.get("filtered") or verdict.get("detected"))
    )


def judge_error(
    status: int, body: Any, *, retry_after: float | None, seconds_left: float
) -> Verdict | None:
    """The verdict on an error answer that must not be retried; ``None`` leaves it to the
    client's own rules.

    ``body`` is the parsed JSON body (any value), ``retry_after`` the seconds the provider asks
    to wait (``retry_after_seconds``), ``seconds_left`` the time to the run's deadline.
    """
    error = _error_object(body)
    code, kind = error.get("code"), error.get("type")
    text = str(error.get("message") or "")[:300]
    if status in FILTER_STATUSES and (rule := _filter_rule(error)) is not None:
        categories = ", ".join(_filter_categories(error)) or "unspecified category"
        where = f" on the {error['param']}" if isinstance(error.get("param"), str) else ""
        message = (
            f"the provider's content filter ({rule}) rejected the request{where}: {categories}"
        )
        if text:
            message += f"; it said: {text}"
        return Verdict(kernel.ModelFault.FILTERED, message)
    if status == 429 and "insufficient_quota" in (code, kind):
        return Verdict(
            kernel.ModelFault.UNAVAILABLE,
            f"HTTP 429 insufficient_quota (not retried: the provider account has no quota "
            f"left): {text}",
        )
    retryable = status in RETRYABLE_STATUSES or status >= 500
    if retryable and retry_after is not None and retry_after >= seconds_left:
        return Verdict(
            kernel.ModelFault.WAIT_BEYOND_DEADLINE,
            f"HTTP {status}: the provider asked to retry after {retry_after:g} s, past the "
            f"run's deadline in {max(seconds_left, 0):.0f} s",
        )
    return None


class _Response(Protocol):
    """The part of the client's HTTP response the hook reads (httpx's ``Response``)."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Any: ...

    async def aread(self) -> bytes: ...


def _judge_response(response: _Response, *, deadline: float) -> Verdict | None:
    """``judge_error`` of a read error response."""
    try:
        body = json.loads(_content(response))
    except ValueError:  # not JSON (or not UTF-8): no error object to read
        body = None
    now = time.time()
    return judge_error(
        response.status_code,
        body,
        retry_after=retry_after_seconds(response.headers, now=now),
        seconds_left=deadline - now,
    )


def _content(response: Any) -> bytes:
    content = response.content
    return content if isinstance(content, bytes) else b""


async def _mark_final(response: _Response) -> None:
    """Response hook: an error answer ``judge_error`` rules on is not retried by the client."""
    deadline = _DEADLINE.get(None)
    if response.status_code < 400 or deadline is None:
        return
    await response.aread()
    if _judge_response(response, deadline=deadline) is not None:
        response.headers[NO_RETRY_HEADER] = "false"


@dataclasses.dataclass(frozen=True, slots=True)
class ChatRequest:
    """One chat-completions request, in wire shape."""

    base_url: str
    """The OpenAI-compatible endpoint (``AgentModel.spec.baseURL``)."""
    api_key: str
    """``""`` when the endpoint needs none."""
    model: str
    messages: Sequence[Mapping[str, Any]]
    tools: Sequence[Mapping[str, Any]]
    """The OpenAI ``tools`` list (empty: none sent)."""
    max_output_tokens: int
    tool_choice: str | None = None
    """Sent when set (``"none"``: the tools go with the request but must not be called)."""

    def body(self) -> dict[str, Any]:
        """The request body in wire shape (not streamed)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": list(self.messages),
            "max_tokens": self.max_output_tokens,
        }
        if self.tools:
            body["tools"] = list(self.tools)
            if self.tool_choice is not None:
                body["tool_choice"] = self.tool_choice
        return body


@dataclasses.dataclass(frozen=True, slots=True)
class RetryPolicy:
    """The ``openai`` client's retry and timeout options."""

    max_retries: int = 4
    """Retries of a transient error after the first attempt."""
    request_timeout: float = 120.0
    """Seconds one HTTP attempt may take."""


class ModelClient:
    """Calls OpenAI-compatible endpoints; one ``AsyncOpenAI`` per (base URL, key), reused."""

    def __init__(self, policy: RetryPolicy | None = None) -> None:
        self.policy = policy or RetryPolicy()
        self._clients: dict[tuple[str, str], openai.AsyncOpenAI] = {}
        self._unstreamed: set[tuple[str, str]] = set()
        """(base URL, model) of endpoints that refused a streamed request."""

    def _client(self, base_url: str, api_key: str) -> openai.AsyncOpenAI:
        key = (base_url, api_key)
        client = self._clients.get(key)
        if client is None:
            client = openai.AsyncOpenAI(
                base_url=base_url,
                api_key=api_key or "unused",
                max_retries=self.policy.max_retries,
                timeout=self.policy.request_timeout,
                http_client=AttemptClient(
                    timeout=self.policy.request_timeout,
                    event_hooks={"response": [_mark_final]},
                    # a redirect would send the conversation to wherever the endpoint says,
                    # unchecked: an error instead (HTTP 3xx), as MCP and http_get do
                    follow_redirects=False,
                ),
            )
            self._clients[key] = client
        return client

    async def close(self) -> None:
        """Close every HTTP client."""
        for client in self._clients.values():
            await client.close()
        self._clients.clear()

    async def complete(
        self, request: ChatRequest, *, deadline: float, watch: StreamWatch | None = None
    ) -> dict[str, Any]:
        """One chat completion as its raw JSON object (``chat.completion`` shape).

        The response is streamed (``stream: true`` with ``stream_options.include_usage``)
        and cut once the output delivered passes ``request.max_output_tokens``
        (``Delivery.delivered_tokens``): the connection is closed, the reply so far is returned
        with ``finish_reason: length`` and no usage (the kernel then charges its upper bound).
        A provider that answers a streamed request with one JSON body is read as such; one
        that refuses streaming (HTTP 400 naming ``stream``) is asked again without, and from
        then on (per base URL and model). ``watch``, when given, sees the delivery if it is
        abandoned (cancelled, the deadline, a broken stream); ``watch.unanswered`` hears of a
        call cut after its request went out and before its answer, of each attempt that got
        no answer before the client's read timeout (``answers.AttemptTransport``), whatever the
        later ones do, and of an answer that is not a JSON object (the prompt was read).

        ``deadline`` is epoch seconds. Raises ``ModelError`` for a permanent error (a 4xx the
        client does not retry, a body that is not a JSON object), when retries run out, or when
        the deadline passes first; its ``fault`` is ``judge_error``'s when that rules on the
        answer. ``asyncio.TimeoutError`` never escapes.
        """
        left = deadline - time.time()
        if left <= 0:
            raise ModelError(
                "the run's deadline passed before the model call",
                error_type=ModelErrorType.DEADLINE,
            )
        client = self._client(request.base_url, request.api_key)
        token = _DEADLINE.set(deadline)
        try:
            async with asyncio.timeout(left):
                answer = await self._send(client, request, watch=watch)
        except openai.APIStatusError as err:
            # ``from None``: the client's error holds the provider's text, which may echo the
            # key; only the redacted message travels on (to status, Events, logs and spans)
            raise _refused(err, api_key=request.api_key, deadline=deadline) from None
        except (openai.APIConnectionError, TimeoutError, AnswerUnparsable) as err:
            # ``from None`` as above: the cause's text is in the message, redacted and cut
            raise _unanswered(err, api_key=request.api_key) from None
        except openai.APIError as err:  # an error event inside the stream, after a 200
            raise _failed_midway(err, api_key=request.api_key) from None
        finally:
            _DEADLINE.reset(token)
        return _json_object(answer, watch=watch, api_key=request.api_key)

    async def _send(
        self, client: openai.AsyncOpenAI, request: ChatRequest, *, watch: StreamWatch | None
    ) -> object:
        """The request, streamed unless its endpoint refused streaming (then, and from then
        on, sent whole); the parsed answer."""
        body = request.body()
        key = (request.base_url, request.model)
        if key not in self._unstreamed:
            try:
                return await read_stream(
                    client,
                    CHAT_COMPLETIONS,
                    body,
                    max_output_tokens=request.max_output_tokens,
                    watch=watch,
                )
            except openai.BadRequestError as err:
                if not refuses_streaming(err.body):
                    raise
                self._unstreamed.add(key)
        # ``post`` rather than ``chat.completions.create``: the body is already in wire
        # shape, and the SDK's typed transform of ``messages`` costs ~0.2 ms per message per
        # call (17 ms at 80 messages) — it dominated a turn.
        with cut_unanswered(watch), parsed():
            answer: object = await client.post(CHAT_COMPLETIONS, body=body, cast_to=object)
        return answer


def _json_object(answer: object, *, watch: StreamWatch | None, api_key: str) -> dict[str, Any]:
    """``answer`` if it is a JSON object of a completion; else raises ``ModelError``, told to
    ``watch`` first as an answer that is not JSON is (the provider read the prompt): an error
    object without choices (``{"error": …}`` with HTTP 200, as gateways such as OpenRouter
    answer when the upstream failed) is a server error, as the same error streamed is
    (``_failed_midway``), not a reply of the model's to correct; anything else that is not a
    JSON object is ``invalid_response``."""
    if isinstance(answer, dict) and not (answer.get("error") and "choices" not in answer):
        return answer
    unusable = ModelError(
        "the model endpoint answered with JSON that is not an object",
        error_type=ModelErrorType.INVALID_RESPONSE,
    )
    if isinstance(answer, dict):
        why = redact(_error_text(answer["error"]), api_key)[:CAUSE_CHARS]
        unusable = ModelError(
            f"the model endpoint answered with an error: {why}",
            error_type=ModelErrorType.SERVER_ERROR,
        )
    if watch is not None:
        watch.unanswered(unusable)
    raise unusable


def _error_text(error: object) -> str:
    """What an error object of an answer says: its ``message`` (or itself as text)."""
    message = error.get("message") if isinstance(error, Mapping) else None
    return str(message if message is not None else error)
