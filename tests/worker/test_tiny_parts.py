"""A model endpoint's answer sent in parts of one byte (chunks of a chunked body, six bytes on
the wire each) is bounded by what the parts cost, not only by the bytes they carry: each part
counts ``endpoint.MIN_PART_BYTES`` at least, so an event never ended is refused after 131,072
parts (``MAX_MESSAGE_BYTES`` / 64), the call ``invalid_response``, charged the prompt the
endpoint read, once. Before, the 8,388,608 parts the message's bound took were each parsed and
passed on by itself on the worker's event loop (about 17 µs each: over two minutes of a core),
so a call with its deadline 30 s away ended ``deadline`` there."""

from __future__ import annotations

from http_support import heads_first

from agentrun.metrics import ModelErrorType

from .test_cut_calls import PROMPT_BOUND
from .test_read_timeouts import Endpoint, failed_call

CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
"""The head of an event stream whose body is chunked."""


async def test_an_event_sent_a_byte_a_chunk_for_ever_is_refused_at_its_bound() -> None:
    async with heads_first(0, CHUNKED, forever=b"1\r\nx\r\n" * 4096) as url:
        noted, error = await failed_call(Endpoint((), base=f"{url}/v1"))
    assert (noted, error) == ([PROMPT_BOUND], ModelErrorType.INVALID_RESPONSE)
