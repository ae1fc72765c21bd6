"""A model endpoint's answer sent in parts of one byte (chunks of a chunked body) is bounded by
what the parts cost, not only by the bytes they carry: each part counts
``endpoint.MIN_PART_BYTES`` at least, and what it took on the wire when more (a chunk
extension, which the HTTP parser reads and drops), so an event never ended is refused after
131,072 parts (``MAX_MESSAGE_BYTES`` / 64), or 140 parts behind 60 KB of extension each, the
call ``invalid_response``, charged the prompt the endpoint read, once. Before, the 8,388,608
parts the message's bound took were each parsed and passed on by itself on the worker's event
loop (about 17 µs each, far more behind an extension: minutes of a core), so a call with its
deadline 30 s away ended ``deadline`` there."""

from __future__ import annotations

import pytest
from http_support import heads_first

from agentrun.metrics import ModelErrorType

from .test_cut_calls import PROMPT_BOUND
from .test_read_timeouts import Endpoint, failed_call

CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
"""The head of an event stream whose body is chunked."""


PARTS = {
    "bare": b"1\r\nx\r\n" * 4096,
    "extended": b"1;e=" + b"a" * 60_000 + b"\r\nx\r\n",
}
"""Chunks of one byte: as they are, and each behind a chunk extension of 60 KB."""


@pytest.mark.parametrize("parts", PARTS.values(), ids=PARTS.keys())
async def test_an_event_sent_a_byte_a_chunk_for_ever_is_refused_at_its_bound(parts: bytes) -> None:
    """Each attempt is refused having read less than 32 MiB of the wire (some 9 MiB, and what
    the sockets' buffers held); before, 7.8 GB behind extensions."""
    sent: list[int] = []
    async with heads_first(0, CHUNKED, forever=parts, written=sent) as url:
        noted, error = await failed_call(Endpoint((), base=f"{url}/v1"))
    assert (noted, error) == ([PROMPT_BOUND], ModelErrorType.INVALID_RESPONSE)
    assert sent
    assert max(sent) < 32 * 1024 * 1024, sent
