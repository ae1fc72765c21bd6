"""An answer of a model endpoint as the worker's HTTP client reads it: bounded, parsed, and
each attempt that got no answer told to the call in flight.

What belongs here: the bounds on one answer (``bounded_answer``: each message as a tool
server's, ``MAX_ANSWER_BYTES`` and ``MAX_ANSWER_MESSAGES`` in all, no content coding;
``AnswerTooLarge``), the parser's refusals (``parsed``, ``AnswerUnparsable``), and telling the
call's watch of a call cut before its answer (``cut_unanswered``), attempt by attempt through
the client's transports (``AttemptTransport``, built by ``AttemptClient``). What does not:
reading a streamed answer and folding it (``stream``, ``delivery``), the request and its
errors (``model``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
from collections.abc import AsyncIterator, Iterator
from typing import Any, Protocol

import httpx2
import openai

from agentrun import pulling
from agentrun.tools import heads
from agentrun.tools.endpoint import (
    MAX_MESSAGE_BYTES,
    BoundedStream,
    StreamLimits,
    WholeBound,
    is_event_stream,
    metered,
)


class CallWatch(Protocol):
    """Hears of a model call cut or unanswered after its request went out
    (``stream.StreamWatch`` is one)."""

    def unanswered(self, cut: BaseException) -> None:
        """Called when the call is cut after its request went out and before its answer
        (``cut``: a cancellation — the run cancelled or deleted, its deadline, a worker
        handing the turn back), and when one of its attempts was sent whole and got no answer
        before the client's read timeout (``cut``: that ``httpx2.ReadTimeout``; the client
        then retries, or raises): the provider has read the prompt. Called again for each
        such attempt and for the cut that may follow: the call is noted once. No awaiting (it
        may be a cancellation)."""
        ...


_CALL_WATCH: contextvars.ContextVar[CallWatch | None] = contextvars.ContextVar(
    "agentrun_call_watch", default=None
)
"""The watch of the call in flight in this task while it awaits its answer (the block of
``cut_unanswered``), for ``AttemptTransport``."""


@dataclasses.dataclass(slots=True)
class _Attempts:
    """Whether the call in flight has an attempt out that was not refused: set as an attempt
    starts (``AttemptTransport``), cleared when it fails or is answered with an error status
    (the client then waits to retry, or raises). Between attempts the provider reads no
    prompt of the call. Shared, not set anew, so a transport run in a copied context tells
    the block of ``cut_unanswered``."""

    out: bool = False


_ATTEMPTS: contextvars.ContextVar[_Attempts | None] = contextvars.ContextVar(
    "agentrun_attempts", default=None
)
"""The attempts of the call in flight in this task (the block of ``cut_unanswered``)."""


@contextlib.contextmanager
def cut_unanswered(watch: CallWatch | None) -> Iterator[None]:
    """Tell ``watch`` (``CallWatch.unanswered``) when the block — sending a request, with the
    client's retries, and awaiting its answer — is cancelled (it goes on), and, through the
    client's transports (``AttemptTransport``), of each attempt in it that got no answer before
    the client's read timeout (a provider still reading a huge prompt), whatever the later
    attempts do, or whose answer was refused unread (``AnswerTooLarge``) or was not JSON: the
    provider read the prompt. An attempt that failed to connect, timed out connecting or
    sending, or was refused is not told. A tenant's cancellation that comes while the client
    still connects, or waits to retry, is told as well: the block cannot see whether the
    request went out, and a tenant's cut is rather charged once too often than a prompt the
    provider read left uncharged. The platform's (``pulling.handed_back``: a draining worker
    handing the turn back, asked again elsewhere) is told only while an attempt is out
    (``_Attempts``): between attempts, after a refusal (``429``) or a failed connection,
    the provider billed nothing."""
    token = _CALL_WATCH.set(watch)
    attempts = _Attempts()
    out = _ATTEMPTS.set(attempts)
    try:
        yield
    except (asyncio.CancelledError, AnswerUnparsable) as cut:  # cut, or answered unusably
        if watch is not None and (attempts.out or not pulling.handed_back(cut)):
            watch.unanswered(cut)
        raise
    finally:
        _ATTEMPTS.reset(out)
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
        raise unparsable(err) from None


def unparsable(err: ValueError | RecursionError) -> AnswerUnparsable:
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
        attempts = _ATTEMPTS.get() or _Attempts()
        attempts.out = True
        try:
            with _told_read_timeouts():
                response = await self.transport.handle_async_request(request)
                if isinstance(response.stream, httpx2.AsyncByteStream):
                    body = await bounded_answer(response)
                    response.stream = _WatchedBody(body) if response.is_success else body
        except Exception:  # failed (a cancellation leaves it out: cut while out)
            attempts.out = False
            raise
        attempts.out = response.is_success
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
        metered(response),
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
        return _attempts(super()._init_transport(*args, **kwargs))

    def _init_proxy_transport(self, *args: Any, **kwargs: Any) -> httpx2.AsyncBaseTransport:
        return _attempts(super()._init_proxy_transport(*args, **kwargs))


def _attempts(transport: httpx2.AsyncBaseTransport) -> AttemptTransport:
    """``transport`` (an ``httpx2.AsyncHTTPTransport``) wrapped in ``AttemptTransport``, its
    connections refusing an answer that opens with more informational heads than
    ``heads.MAX_INFORMATIONAL`` (``AnswerTooLarge``): they would be read until the run's
    deadline."""
    heads.bound_heads(getattr(transport, "_pool", None), AnswerTooLarge)
    return AttemptTransport(transport)
