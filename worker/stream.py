"""A streamed chat completion as it arrives: the chunks folded into one response, and the
output delivered so far counted, so the model adapter can cut it at the call's allowance.

What belongs here: reading one streamed response through the ``openai`` client
(``read_stream``) and its bookkeeping (``Delivery``, pure): folding
``chat.completion.chunk`` objects (OpenAI API reference, "The chat completion chunk object")
into the ``chat.completion`` shape the kernel classifies, and the count of delivered output
the cut compares with the allowance (``delivered_tokens``); and telling the call's watch of a
call cut before its answer (``cut_unanswered``), attempt by attempt through the client's
transports (``AttemptClient``). What does not: the request and its errors (``model``), budgets
(the kernel's allowance, the ledger's hold).

Two counts. A provider that honours ``max_tokens`` stops at the allowance by its own
tokenizer; the cut must not come before that, so it compares a count that does not run ahead
of a real tokenizer's: the content-bearing chunks (streaming servers send at least one token
per chunk; OpenAI's and llama.cpp's send one) or ``kernel.least_tokens``'s rates, sixteen
ASCII characters a token plus eight other characters a token (English runs 4–5 characters a
cl100k token, Russian about 5 an o200k token, CJK one or two), whichever is larger. A
response cut there — its provider ignored ``max_tokens`` — is charged at the usual density
(``charged_tokens``: four ASCII characters or one other character a token, at least the
chunks), which may pass what was held for it: that call's overrun ends the run with its cap's
reason and is counted in ``agentrun_budget_overrun_tokens_total``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import json
import re
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any, Protocol

import httpx2
import openai

from agentrun import kernel
from agentrun.tools.endpoint import (
    MAX_MESSAGE_BYTES,
    BoundedStream,
    StreamLimits,
    WholeBound,
    is_event_stream,
)

STREAM_WORD = re.compile(r"\bstream(ing|_options)?\b", re.IGNORECASE)
"""What an error saying the endpoint does not stream names (not "upstream")."""
CUT_KEY = "x_agentrun_cut"
"""Set on a response the worker cut: the output tokens it is charged (``charged_tokens``).
Not an OpenAI field: nothing but the worker reads it (the kernel classifies the rest)."""
DELIVERED_KEY = "x_agentrun_delivered"
"""Set on every streamed response: the least a provider can have billed for the output it
delivered (``Delivery.least_tokens``, reasoning included), whatever its usage says."""
ESTIMATE_KEY = "x_agentrun_estimate"
"""Set on a streamed response that reported no usage: its output tokens estimated from
everything it delivered (``kernel.output_estimate`` of the message's texts and of those it
does not keep: reasoning, choices not asked for), what ``kernel.read_usage`` charges at
least when it must estimate."""
CUT_FINISH_REASON = "length"
"""The finish reason of a response the worker cut: what a provider says when it stops at
``max_tokens`` (the kernel asks for a shorter reply, or the run ends at its cap)."""


FOLDED_DELTA_KEYS = frozenset({"role", "content", "refusal", "tool_calls"})
"""Delta fields folded into the message (the others are only counted)."""
NOT_OUTPUT_KEYS = frozenset({"role", "id", "type", "index", "format", "signature"})
"""Fields of a delta's other parts that name or sign output rather than carry it."""


def _texts(value: Any) -> list[str]:
    """The non-empty strings in ``value`` (a delta field's JSON) outside ``NOT_OUTPUT_KEYS``:
    output a provider streams in a field of its own — the reasoning of ``reasoning_content``
    (DeepSeek, vLLM, llama.cpp), ``reasoning`` (OpenRouter, Groq, Ollama) or
    ``reasoning_details`` (OpenRouter), a legacy ``function_call``, an audio transcript —
    is output tokens the provider bills, so the cut and an abandoned call's charge count it,
    whatever the field is called. Walked with a stack of its own, in order: a value nested as
    deep as the JSON parser takes would pass the interpreter's recursion limit here."""
    texts: list[str] = []
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if item:
                texts.append(item)
        elif isinstance(item, Mapping):
            pending.extend(reversed([v for k, v in item.items() if k not in NOT_OUTPUT_KEYS]))
        elif isinstance(item, list):
            pending.extend(reversed(item))
    return texts


@dataclasses.dataclass(slots=True)
class _Call:
    id: str = ""
    name: list[str] = dataclasses.field(default_factory=list)
    arguments: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(slots=True)
class Delivery:
    """What one streamed response delivered so far (mutable; one per call)."""

    content: list[str] = dataclasses.field(default_factory=list)
    refusal: list[str] = dataclasses.field(default_factory=list)
    calls: dict[int, _Call] = dataclasses.field(default_factory=dict)
    finish_reason: str | None = None
    usage: Mapping[str, Any] | None = None
    """The provider's ``usage`` (the final chunk's, with ``stream_options.include_usage``)."""
    id: str | None = None
    chunks: int = 0
    """Chunks that carried output (text, a tool call's part, reasoning or any other output
    field: ``_texts``)."""
    ascii_chars: int = 0
    other_chars: int = 0
    cut: bool = False
    """The worker stopped reading before the provider finished (the allowance was reached)."""
    unfolded: list[str] = dataclasses.field(default_factory=list)
    """Output texts the message does not keep (reasoning and other fields: ``_texts``; every
    text of a choice other than the first, which a provider bills though n is 1)."""

    def add(self, chunk: Any) -> None:
        """Fold one ``chat.completion.chunk`` (parsed JSON; anything else is ignored)."""
        if not isinstance(chunk, Mapping):
            return
        if isinstance(chunk.get("id"), str):
            self.id = chunk["id"]
        usage = chunk.get("usage")
        if isinstance(usage, Mapping):
            self.usage = usage
        choices = chunk.get("choices")
        carried = False
        for position, choice in enumerate(choices if isinstance(choices, list) else ()):
            if not isinstance(choice, Mapping):
                continue
            delta = choice.get("delta")
            if choice.get("index", position) != 0:  # a choice not asked for (n is 1): billed
                carried = self._add_unfolded(delta) or carried
                continue
            if isinstance(choice.get("finish_reason"), str):
                self.finish_reason = choice["finish_reason"]
            if isinstance(delta, Mapping):
                carried = self._add_delta(delta) or carried
        if carried:
            self.chunks += 1

    def _add_unfolded(self, value: Any) -> bool:
        """Count the output texts of ``value`` that the message does not keep (``_texts``);
        True if it carried any."""
        texts = _texts(value)
        for text in texts:
            self.unfolded.append(text)
            self._count(text)
        return bool(texts)

    def _add_delta(self, delta: Mapping[str, Any]) -> bool:
        """Fold a delta; True if it carried output."""
        carried = False
        for key, parts in (("content", self.content), ("refusal", self.refusal)):
            text = delta.get(key)
            if isinstance(text, str) and text:
                parts.append(text)
                self._count(text)
                carried = True
        calls = delta.get("tool_calls")
        for part in calls if isinstance(calls, list) else ():
            if isinstance(part, Mapping):
                carried = self._add_call(part) or carried
        for key, value in delta.items():
            if key not in FOLDED_DELTA_KEYS:
                carried = self._add_unfolded(value) or carried
        return carried

    def _add_call(self, part: Mapping[str, Any]) -> bool:
        """Fold one part of a tool call; True if it carried output. At most
        ``kernel.MAX_CALLS_PER_REPLY`` + 1 calls are kept (enough for the classifier to refuse
        the reply: parts of further calls are counted, not kept) and an id at most
        ``kernel.PLACEHOLDER_CHARS`` + 1 characters (a longer one is replaced anyway): an id
        carries no output, so nothing else would bound what a stream of them keeps."""
        index = part.get("index")
        position = index if isinstance(index, int) else len(self.calls)
        call = self.calls.get(position)
        if call is None:
            call = _Call()
            if len(self.calls) <= kernel.MAX_CALLS_PER_REPLY:
                self.calls[position] = call
        if isinstance(part.get("id"), str):
            call.id = part["id"][: kernel.PLACEHOLDER_CHARS + 1]
        function = part.get("function")
        if not isinstance(function, Mapping):
            return False
        carried = False
        for key, parts in (("name", call.name), ("arguments", call.arguments)):
            text = function.get(key)
            if isinstance(text, str) and text:
                parts.append(text)
                self._count(text)
                carried = True
        return carried

    def _count(self, text: str) -> None:
        if text.isascii():  # most chunks: no encoding needed
            self.ascii_chars += len(text)
            return
        ascii_chars = len(text.encode("ascii", "ignore"))
        self.ascii_chars += ascii_chars
        self.other_chars += len(text) - ascii_chars

    @property
    def delivered_tokens(self) -> int:
        """Output tokens delivered, counted so as not to run ahead of a real tokenizer's
        count (what the cut compares with the allowance): the content-bearing chunks, or
        ``kernel.LEAST_ASCII_CHARS`` ASCII characters a token plus ``LEAST_OTHER_CHARS``
        other characters a token (the rates of ``kernel.least_tokens``), whichever is
        larger."""
        ascii_tokens = -(-self.ascii_chars // kernel.LEAST_ASCII_CHARS)
        return max(self.chunks, ascii_tokens + -(-self.other_chars // kernel.LEAST_OTHER_CHARS))

    @property
    def charged_tokens(self) -> int:
        """Output tokens a response cut mid-way (or abandoned) is charged: the content-bearing
        chunks, or four ASCII characters a token plus one per other character, whichever is
        larger — the usual density, never below ``delivered_tokens``."""
        return max(self.chunks, -(-self.ascii_chars // 4) + self.other_chars)

    def message(self) -> dict[str, Any]:
        """The assistant message delivered so far."""
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self.content) if self.content else None,
            "refusal": "".join(self.refusal) if self.refusal else None,
        }
        if self.calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": "".join(call.name), "arguments": "".join(call.arguments)},
                }
                for _, call in sorted(self.calls.items())
            ]
        return message

    def completion(self) -> dict[str, Any]:
        """The response as one ``chat.completion`` object: the usage the provider reported
        (none when it sent none: then ``ESTIMATE_KEY``). A cut response has finish reason
        ``length``, no usage, and ``CUT_KEY`` holding ``charged_tokens`` (what it is charged
        as output). ``DELIVERED_KEY`` holds ``least_tokens``."""
        finish = CUT_FINISH_REASON if self.cut else (self.finish_reason or "stop")
        completion: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion",
            "choices": [{"index": 0, "message": self.message(), "finish_reason": finish}],
            "usage": None if self.cut else self.usage,
        }
        if self.cut:
            completion[CUT_KEY] = self.charged_tokens
        elif self.usage is None:
            texts = kernel.completion_texts(completion["choices"][0]["message"]) + self.unfolded
            completion[ESTIMATE_KEY] = kernel.output_estimate(texts)
        completion[DELIVERED_KEY] = self.least_tokens
        return completion

    @property
    def least_tokens(self) -> int:
        """The fewest output tokens any provider can have billed for what was delivered: each
        chunk that carried output is a token at least, and the texts the message does not keep
        (reasoning) count their ``kernel.least_tokens`` (the message's own texts are counted
        from the message)."""
        return max(self.chunks, kernel.least_tokens(self.unfolded))


PROGRESS_SECONDS = 2.0
"""Seconds between two ``StreamWatch.progress`` calls while a response streams."""
PROGRESS_TOKENS = 256
"""Output tokens (``Delivery.delivered_tokens``) delivered between two ``StreamWatch.progress``
calls at most: a provider that sends its whole allowance in a burst is recorded within this
much, so a worker that dies right after leaves at most this much of it uncharged (a short
answer, as most tool-calling turns', takes no record: it is recorded once, answered)."""


class StreamWatch(Protocol):
    """Sees what a model call delivered: the worker records it on its ledger hold, so a call
    abandoned mid-way (cancelled, its worker dead) is charged what it delivered, and one
    cancelled before its first byte is charged its prompt unless the cut was the platform's
    (``SpendWatch``)."""

    async def progress(self, delivery: Delivery) -> None:
        """Called while the response streams, every ``PROGRESS_SECONDS`` and every
        ``PROGRESS_TOKENS`` of output delivered."""
        ...

    def abandoned(self, delivery: Delivery) -> None:
        """Called once when the response is abandoned before its end, once it began to arrive
        (its headers) (no awaiting: it may be a cancellation)."""
        ...

    def unanswered(self, cut: BaseException) -> None:
        """Called when the call is cut after its request went out and before its answer
        (``cut``: a cancellation — the run cancelled or deleted, its deadline, a worker
        handing the turn back), and when one of its attempts was sent whole and got no answer
        before the client's read timeout (``cut``: that ``httpx2.ReadTimeout``; the client
        then retries, or raises): the provider has read the prompt. Called again for each
        such attempt and for the cut that may follow: the call is noted once. No awaiting, as
        for ``abandoned``."""
        ...


async def read_stream(
    client: openai.AsyncOpenAI,
    path: str,
    body: Mapping[str, Any],
    *,
    max_output_tokens: int,
    watch: StreamWatch | None,
) -> object:
    """POST ``body`` to ``path`` streamed (``stream: true``, ``stream_options.include_usage``)
    and fold the chunks into one completion, cut once ``Delivery.delivered_tokens`` passes
    ``max_output_tokens`` (the connection is closed: the provider stops generating). A JSON
    body instead of an event stream (a provider that does not stream) is returned as parsed.

    Raises what the ``openai`` client raises (``APIStatusError``, ``APIConnectionError`` and
    its ``APITimeoutError``, also for a JSON body that broke or timed out: ``_whole_body``) and
    ``AnswerUnparsable`` for an answer the parser refuses (``parsed``); the caller maps them."""
    stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with cut_unanswered(watch), parsed():
        stream = await client.post(
            path,
            body=stream_body,
            cast_to=object,
            stream=True,
            stream_cls=openai.AsyncStream[object],
        )
        if _json_body(stream.response.headers):
            return await _whole_body(stream.response)
    delivery = Delivery()
    finished = False
    try:
        shown, recorded = time.monotonic(), 0
        async for chunk in _parsed_chunks(stream):
            delivery.add(chunk)
            delivered = delivery.delivered_tokens
            if delivered > max_output_tokens:
                delivery.cut = True
                break
            if watch is not None and (
                delivered - recorded >= PROGRESS_TOKENS
                or time.monotonic() - shown >= PROGRESS_SECONDS
            ):
                await watch.progress(delivery)
                shown, recorded = time.monotonic(), delivered
        finished = True
    finally:
        if not finished and watch is not None:
            watch.abandoned(delivery)
        if delivery.cut or not finished:
            await asyncio.shield(stream.close())  # the provider stops generating
    return delivery.completion()


def _json_body(headers: Mapping[str, str]) -> bool:
    """Whether an answer is one JSON body, not an event stream (a provider that does not
    stream; bounded as one message: ``bounded_answer``)."""
    return not is_event_stream(headers) and "json" in headers.get("content-type", "")


async def _parsed_chunks(stream: openai.AsyncStream[object]) -> AsyncIterator[object]:
    """The chunks of ``stream``, what its parser refuses raised as ``AnswerUnparsable``."""
    chunks = aiter(stream)
    while True:  # no context manager per chunk: this is a turn's hot path
        try:
            chunk = await anext(chunks)
        except StopAsyncIteration:
            return
        except AnswerUnparsable:
            raise
        except (ValueError, RecursionError) as err:
            raise _unparsable(err) from None
        yield chunk


_CALL_WATCH: contextvars.ContextVar[StreamWatch | None] = contextvars.ContextVar(
    "agentrun_call_watch", default=None
)
"""The watch of the call in flight in this task while it awaits its answer (the block of
``cut_unanswered``), for ``AttemptTransport``."""


async def _whole_body(response: httpx2.Response) -> object:
    """The parsed JSON body of an answer that did not stream. Raises ``json.JSONDecodeError``,
    and the transport's errors reading it as the client raises them mid-stream:
    ``openai.APITimeoutError`` for a timeout, ``openai.APIConnectionError`` for another."""
    try:
        body = await response.aread()
    except httpx2.TimeoutException as err:
        raise openai.APITimeoutError(request=response.request) from err
    except httpx2.TransportError as err:
        raise openai.APIConnectionError(request=response.request) from err
    answer: object = json.loads(body)
    return answer


@contextlib.contextmanager
def cut_unanswered(watch: StreamWatch | None) -> Iterator[None]:
    """Tell ``watch`` (``StreamWatch.unanswered``) when the block — sending a request, with the
    client's retries, and awaiting its answer — is cancelled (it goes on), and, through the
    client's transports (``AttemptTransport``), of each attempt in it that got no answer before
    the client's read timeout (a provider still reading a huge prompt), whatever the later
    attempts do, or whose answer was refused unread (``AnswerTooLarge``) or was not JSON: the
    provider read the prompt. An attempt that failed to connect, timed out connecting or
    sending, or was refused is not told. A cancellation that comes while the client still
    connects, or waits to retry, is told as well: the block cannot see whether the request
    went out, and a tenant's cut is rather charged once too often than a prompt the provider
    read left uncharged."""
    token = _CALL_WATCH.set(watch)
    try:
        yield
    except (asyncio.CancelledError, AnswerUnparsable) as cut:  # cut, or answered unusably
        if watch is not None:
            watch.unanswered(cut)
        raise
    finally:
        _CALL_WATCH.reset(token)


MAX_ANSWER_BYTES = 64 * 1024 * 1024
"""The most bytes one answer of a model endpoint may take in all (an event stream, or a JSON
body): a real one of 128,000 output tokens streamed a token a chunk takes about 32 MiB.
Past it the call ends ``invalid_response``, charged what it delivered. Without it, chunks
that carry no output (which the allowance never cuts) were read until the run's deadline,
each parsed on the worker's event loop, which every tenant's turns share."""
MAX_ANSWER_MESSAGES = 262_144
"""The most messages (events, comments and keep-alives included) one answer may hold in all:
twice a 128,000-token answer streamed a token a chunk. Bounds the parsing an answer of tiny
events (``data: {}``, 10 bytes each) costs, which ``MAX_ANSWER_BYTES`` alone would not."""


class AnswerUnparsable(ValueError):
    """The model endpoint's answer could not be parsed: not JSON, an integer of over 4,300
    digits (Python's limit on converting one), or nested past the interpreter's recursion
    limit (``parsed``)."""


@contextlib.contextmanager
def parsed() -> Iterator[None]:
    """Raise what parsing the answer read in the block raised as ``AnswerUnparsable``: the
    parser's ``ValueError`` (``json.JSONDecodeError`` among them) or ``RecursionError`` —
    the block holds the HTTP client's reading and parsing of the answer, which raise no other
    ``ValueError``."""
    try:
        yield
    except AnswerUnparsable:
        raise
    except (ValueError, RecursionError) as err:
        raise _unparsable(err) from None


def _unparsable(err: ValueError | RecursionError) -> AnswerUnparsable:
    """``err`` of the answer's parser as ``AnswerUnparsable`` (its type and 200 characters)."""
    return AnswerUnparsable(f"{type(err).__name__}: {str(err)[:200]}")


class AnswerTooLarge(httpx2.RemoteProtocolError):
    """The model endpoint sent a message over ``endpoint.MAX_MESSAGE_BYTES`` or
    ``endpoint.MAX_MESSAGE_VALUES``, an answer over ``MAX_ANSWER_BYTES`` or
    ``MAX_ANSWER_MESSAGES`` in all, or a compressed body (a transport error: the ``openai``
    client raises it as ``APIConnectionError``)."""


@contextlib.contextmanager
def _told_read_timeouts() -> Iterator[None]:
    """Tell the watch of the call in flight, if it awaits its answer (``cut_unanswered``), of a
    read timeout of one of its attempts (``httpx2.ReadTimeout``) or of an answer refused
    unread (``AnswerTooLarge``), raised on."""
    try:
        yield
    except (httpx2.ReadTimeout, AnswerTooLarge) as timeout:
        watch = _CALL_WATCH.get()
        if watch is not None:
            watch.unanswered(timeout)
        raise


class AttemptTransport(httpx2.AsyncBaseTransport):
    """One of the HTTP client's transports (``AttemptClient``), telling the call in flight of
    each attempt sent whole that got no answer before the client's read timeout
    (``_told_read_timeouts``): awaiting its headers (``httpx2.ReadTimeout`` is raised there
    once the request was written; a stalled connect or write raises ``ConnectTimeout`` or
    ``WriteTimeout``), or reading a success's body inside ``cut_unanswered`` (an answer not
    streamed: the client reads it before it returns, and retries its timeout). A body streamed
    after the block is the stream's (``StreamWatch.abandoned``). Through a tunnelling proxy (an
    ``https`` URL), a proxy that does not answer the tunnel's ``CONNECT`` in time counts the
    same: the transport cannot tell it from the provider's silence."""

    def __init__(self, transport: httpx2.AsyncBaseTransport) -> None:
        self.transport = transport

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        """The wrapped transport's response, its body bounded (``bounded_answer``; a success's
        watched as well), or its error."""
        request.headers["Accept-Encoding"] = "identity"
        with _told_read_timeouts():
            response = await self.transport.handle_async_request(request)
            if isinstance(response.stream, httpx2.AsyncByteStream):
                body = await bounded_answer(response)
                response.stream = _WatchedBody(body) if response.is_success else body
        return response

    async def aclose(self) -> None:
        await self.transport.aclose()


async def bounded_answer(response: httpx2.Response) -> httpx2.AsyncByteStream:
    """``response``'s body, never a message of it (one event of an event stream, or the whole
    of any other body) over the bounds a tool server's messages have
    (``endpoint.BoundedStream``: bytes, and JSON values, counted before anything
    parses them): a provider's answer of 20 MB of ``{}`` would take half a gigabyte of the
    worker's memory; nor the whole body over ``MAX_ANSWER_BYTES`` or ``MAX_ANSWER_MESSAGES``.
    Requests ask for no content coding; a body that has one anyway is refused
    (``AnswerTooLarge``), as it could not be bounded as it arrives."""
    assert isinstance(response.stream, httpx2.AsyncByteStream)
    coding = response.headers.get("content-encoding", "identity").strip().lower()
    if coding not in ("", "identity"):
        await response.aclose()
        raise AnswerTooLarge(f"the model endpoint answered with content coding {coding!r}")
    events = is_event_stream(response.headers)
    whole = WholeBound(MAX_ANSWER_BYTES, MAX_ANSWER_MESSAGES)
    return BoundedStream(
        response.stream,
        StreamLimits(message_bytes=MAX_MESSAGE_BYTES, whole=whole),
        events=events,
        error=AnswerTooLarge,
        source="the model endpoint",
    )


class _WatchedBody(httpx2.AsyncByteStream):
    """A response's body whose read timeout is told to the call in flight."""

    def __init__(self, stream: httpx2.AsyncByteStream) -> None:
        self.stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _told_read_timeouts():
            async for part in self.stream:
                yield part

    async def aclose(self) -> None:
        await self.stream.aclose()


class AttemptClient(openai.DefaultAsyncHttpxClient):
    """The ``openai`` client's HTTP client (its defaults: connection limits, timeout) with
    each transport it builds wrapped in ``AttemptTransport`` — ``httpx2.AsyncClient`` builds
    them all through these two methods: the direct one, and each proxy's (``proxy=``, or
    mounted from ``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY`` with ``trust_env``; a
    ``NO_PROXY`` host goes direct). Only transports given as ``mounts=`` would bypass it, and
    none is."""

    def _init_transport(self, *args: Any, **kwargs: Any) -> httpx2.AsyncBaseTransport:
        return AttemptTransport(super()._init_transport(*args, **kwargs))

    def _init_proxy_transport(self, *args: Any, **kwargs: Any) -> httpx2.AsyncBaseTransport:
        return AttemptTransport(super()._init_proxy_transport(*args, **kwargs))


def refuses_streaming(body: object) -> bool:
    """Whether the body of an HTTP 400 says the endpoint does not stream: its error's
    ``param`` is ``stream`` or ``stream_options``, or its code or message names streaming."""
    error = body.get("error", body) if isinstance(body, Mapping) else None
    if not isinstance(error, Mapping):
        return False
    param = str(error.get("param") or "")
    text = f"{error.get('code') or ''} {error.get('message') or ''}"
    return param.startswith("stream") or STREAM_WORD.search(text) is not None
