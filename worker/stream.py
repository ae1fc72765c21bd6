"""A streamed chat completion as it arrives: read through the ``openai`` client, folded into
one response (``delivery.Delivery``), cut at the call's allowance, and what it delivered
shown to the call's watch as it streams.

What belongs here: reading one streamed response (``read_stream``: an answer that did not
stream returned as parsed), the watch that sees what it delivered (``StreamWatch``), and
telling a refusal to stream (``refuses_streaming``). What does not: folding and counting the
chunks (``delivery``), the HTTP client's bounds on an answer and its attempts (``answers``),
the request and its errors (``model``), budgets (the kernel's allowance, the ledger's hold).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

import httpx2
import openai

from agentrun.tools.endpoint import is_event_stream

from .answers import AnswerUnparsable, CallWatch, cut_unanswered, parsed, unparsable
from .delivery import Delivery

STREAM_WORD = re.compile(r"\bstream(ing|_options)?\b", re.IGNORECASE)
"""What an error saying the endpoint does not stream names (not "upstream")."""

PROGRESS_SECONDS = 2.0
"""Seconds between two ``StreamWatch.progress`` calls while a response streams."""
PROGRESS_TOKENS = 256
"""Output tokens (``Delivery.delivered_tokens``) delivered between two ``StreamWatch.progress``
calls at most: a provider that sends its whole allowance in a burst is recorded within this
much, so a worker that dies right after leaves at most this much of it uncharged (a short
answer, as most tool-calling turns', takes no record: it is recorded once, answered)."""


class StreamWatch(CallWatch, Protocol):
    """Sees what a model call delivered: the worker records it on its ledger hold, so a call
    abandoned mid-way (cancelled, its worker dead) is charged what it delivered, and one
    cancelled before its first byte is charged its prompt unless the cut was the platform's
    (``SpendWatch``); as a ``CallWatch``, it hears of a call cut or unanswered too."""

    async def progress(self, delivery: Delivery) -> None:
        """Called while the response streams, every ``PROGRESS_SECONDS`` and every
        ``PROGRESS_TOKENS`` of output delivered."""
        ...

    def abandoned(self, delivery: Delivery) -> None:
        """Called once when the response is abandoned before its end, once it began to arrive
        (its headers) (no awaiting: it may be a cancellation)."""
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
    its ``APITimeoutError``, also for a JSON body that broke or timed out, ``_whole_body``, and
    a stream ended unfinished, ``_finish``) and ``AnswerUnparsable`` (``parsed``)."""
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
    delivery, finished = Delivery(), False
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
        _finish(delivery, stream.response.request)
        finished = True
    finally:
        if not finished and watch is not None:
            watch.abandoned(delivery)
        if delivery.cut or not finished:
            await asyncio.shield(stream.close())  # the provider stops generating
    return delivery.completion()


def _finish(delivery: Delivery, request: httpx2.Request) -> None:
    """Raises ``openai.APIConnectionError`` for a stream that ended (not cut) before the model
    finished: no chunk gave its choice a ``finish_reason`` (every provider's last one does).
    Its body ended cleanly — a gateway that gave up on its upstream closes it so — and its
    text is wherever the stream stopped: a broken stream, as a reset one is (``model_error``,
    charged what it delivered), never a final answer."""
    if not delivery.cut and delivery.finish_reason is None:
        raise openai.APIConnectionError(
            message="the stream ended before the model finished (no finish_reason)",
            request=request,
        )


def _json_body(headers: Mapping[str, str]) -> bool:
    """Whether an answer is one JSON body, not an event stream (a provider that does not
    stream; bounded as one message: ``answers.bounded_answer``)."""
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
            raise unparsable(err) from None
        yield chunk


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


def refuses_streaming(body: object) -> bool:
    """Whether the body of an HTTP 400 says the endpoint does not stream: its error's
    ``param`` is ``stream`` or ``stream_options``, or its code or message names streaming."""
    error = body.get("error", body) if isinstance(body, Mapping) else None
    if not isinstance(error, Mapping):
        return False
    param = str(error.get("param") or "")
    text = f"{error.get('code') or ''} {error.get('message') or ''}"
    return param.startswith("stream") or STREAM_WORD.search(text) is not None
