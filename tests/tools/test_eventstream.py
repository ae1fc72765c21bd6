"""An event stream's events end where the parsers that read it end them, whatever its line ends
and however it is cut into chunks (``eventstream.EventEnds``, the WHATWG rules: a line ends at
CR LF, LF or CR; an empty line ends an event), so every bound ``endpoint.BoundedStream`` keeps
by the message — each one's bytes and JSON values, the messages of an answer in all, an SSE
stream's pace — counts the messages the ``openai`` client and the MCP SDK parse. Before,
only ``\\n\\n``, ``\\r\\n\\r\\n`` and ``\\r\\r`` were counted: a peer ending its events by
``\\n\\r`` had every one of them parsed and none counted.

The references are the parsers themselves: the ``openai`` client's line decoder and event
decoder, and ``httpx2``'s event parser, which the MCP SDK reads through."""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator

import httpx2
import pytest
from httpx2._sse import _SSEParser
from hypothesis import given, settings
from hypothesis import strategies as st
from openai._streaming import SSEDecoder, _SSELineDecoder

from agentrun.tools import endpoint, eventstream

LINE_ENDS = [b"\n", b"\r", b"\r\n"]
EVENT_ENDS = {
    "LF-LF": b"\n\n",
    "CR-CR": b"\r\r",
    "CRLF-CRLF": b"\r\n\r\n",
    "LF-CR": b"\n\r",
    "CRLF-CR": b"\r\n\r",
    "CRLF-LF": b"\r\n\n",
    "LF-CRLF": b"\n\r\n",
    "CR-CRLF": b"\r\r\n",
}
"""Every way two line ends make an empty line (the first ends the event's last line)."""

line_ends = st.sampled_from(LINE_ENDS)
texts = st.sampled_from([b"", b"data: 1", b"id: 7", b": note", b"event: e", b"retry: 5", b"x"])


@st.composite
def streams(draw: st.DrawFn) -> bytes:
    """Lines of any kind, empty ones included, each ended any way, perhaps an unended one."""
    lines = draw(st.lists(st.tuples(texts, line_ends), max_size=40))
    tail = draw(st.sampled_from([b"", b"data: 2"]))
    return b"".join(text + end for text, end in lines) + tail


@st.composite
def event_streams(draw: st.DrawFn) -> tuple[bytes, int]:
    """Events of one to three data or comment lines (one data line at least) each ended any
    way, each event by an empty line ended any way; and how many."""
    events = draw(st.lists(st.lists(line_ends, max_size=2), max_size=30))
    body = b""
    for ends in events:
        lines = [b"data: 1" + draw(line_ends), *(b": c" + end for end in ends)]
        blank = draw(line_ends)
        if lines[-1].endswith(b"\r") and blank == b"\n":  # a CR LF pair: one line end
            blank = b"\r\n"
        body += b"".join(lines) + blank
    return body, len(events)


def cut(data: bytes, points: list[int]) -> list[bytes]:
    """``data`` cut at ``points`` (offsets, any order, repeats and ends allowed)."""
    edges = sorted({0, len(data), *(point % (len(data) + 1) for point in points)})
    return [data[start:end] for start, end in itertools.pairwise(edges)]


cuts = st.lists(st.integers(min_value=0, max_value=10_000), max_size=12)


def empty_lines(chunks: list[bytes]) -> int:
    """The empty lines the ``openai`` client's line decoder finds in ``chunks``."""
    decoder = _SSELineDecoder()
    lines = [line for chunk in chunks for line in decoder.feed(chunk)]
    return [*lines, *decoder.finish()].count(b"")


def openai_events(chunks: list[bytes]) -> int:
    return sum(1 for _ in SSEDecoder().iter_bytes(iter(chunks)))


def mcp_events(chunks: list[bytes]) -> int:
    parser = _SSEParser()
    found = [event for chunk in chunks for event in parser.decode(chunk.decode())]
    return len(found) + sum(1 for _ in parser.flush())


def ended(chunks: list[bytes]) -> list[tuple[int, int, int]]:
    ends = eventstream.EventEnds()
    return [ends.feed(chunk) for chunk in chunks]


def event_ends_by_byte(data: bytes) -> list[int]:
    """Where each event of ``data`` ends (the offset past the byte that ends its empty line),
    read the slow way: byte by byte, from the rule as written."""
    found, before = [], ord("\n")
    for at, byte in enumerate(data):
        if (before, byte) in {(10, 10), (10, 13), (13, 13)}:
            found.append(at + 1)
        before = byte
    return found


@settings(max_examples=400, deadline=None)
@given(streams(), cuts)
def test_events_end_at_each_empty_line_the_parsers_find(data: bytes, points: list[int]) -> None:
    chunks = cut(data, points)
    assert sum(count for count, _, _ in ended(chunks)) == empty_lines(chunks) == empty_lines([data])


@settings(max_examples=400, deadline=None)
@given(event_streams(), cuts)
def test_as_many_events_end_as_the_parsers_dispatch(
    stream: tuple[bytes, int], points: list[int]
) -> None:
    data, events = stream
    chunks = cut(data, points)
    found = sum(count for count, _, _ in ended(chunks))
    assert found == openai_events(chunks) == mcp_events(chunks) == events


@settings(max_examples=400, deadline=None)
@given(streams(), cuts)
def test_each_chunk_names_where_its_first_and_last_events_end(
    data: bytes, points: list[int]
) -> None:
    """So each message's bytes are counted whole, whatever the chunks: the rest of the one
    that ends first, and the start of the next after the last that ends."""
    ends, offset = event_ends_by_byte(data), 0
    chunks = cut(data, points)
    for chunk, found in zip(chunks, ended(chunks), strict=True):
        inside = [end - offset for end in ends if offset < end <= offset + len(chunk)]
        assert found == (len(inside), min(inside, default=0), max(inside, default=0))
        offset += len(chunk)


def test_a_cr_lf_pair_cut_between_chunks_is_one_line_end() -> None:
    assert ended([b"data: 1\r\n\r", b"\ndata: 2\r", b"\n"]) == [(1, 10, 10), (0, 0, 0), (0, 0, 0)]
    assert ended([b"data: 1\r", b"\n\r\n"]) == [(0, 0, 0), (1, 2, 2)]
    assert ended([b"data: 1\n", b"\r"]) == [(0, 0, 0), (1, 1, 1)]


class Chunks(httpx2.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


def body(events: int, event_end: bytes) -> list[bytes]:
    """``events`` events of 20 bytes and their ends, in 1,000s, the last of each 1,000 ended
    by ``\\n\\n`` (as a peer would to keep each "message" under the per-message bound, were
    its other event ends not counted)."""
    one = b'data: {"choices":[]}'
    return [(one + event_end) * 999 + one + b"\n\n"] * (events // 1000)


@pytest.mark.parametrize("event_end", EVENT_ENDS.values(), ids=EVENT_ENDS.keys())
async def test_every_spelling_of_an_event_end_counts_against_the_bound_in_all(
    event_end: bytes,
) -> None:
    """20,000 events through a bound of 256 messages in all (``SERVER_STREAM``'s): refused
    after the 256th, though the parser would take every one."""
    assert openai_events(body(20_000, event_end)) == 20_000
    limits = endpoint.StreamLimits(whole=endpoint.WholeBound(64 * 1024 * 1024, 256))
    bounded = endpoint.BoundedStream(Chunks(body(20_000, event_end)), limits, events=True)
    parsed = 0
    with pytest.raises(endpoint.MessageTooLarge, match="over 256 messages in all"):
        async for _ in SSEDecoder().aiter_bytes(aiter(bounded)):
            parsed += 1
    assert parsed <= 256


@pytest.mark.parametrize("event_end", EVENT_ENDS.values(), ids=EVENT_ENDS.keys())
async def test_events_within_the_bound_pass_whatever_their_ends(event_end: bytes) -> None:
    limits = endpoint.StreamLimits(whole=endpoint.WholeBound(64 * 1024 * 1024, 20_000))
    bounded = endpoint.BoundedStream(Chunks(body(20_000, event_end)), limits, events=True)
    assert sum([1 async for _ in SSEDecoder().aiter_bytes(aiter(bounded))]) == 20_000


@pytest.mark.parametrize("event_end", [b"\n\r", b"\r\n\r"], ids=["LF-CR", "CRLF-CR"])
async def test_each_event_so_ended_is_its_own_message_to_the_values_bound(
    event_end: bytes,
) -> None:
    """The per-message bound counts from each event's end: 2,000 events of 3 values each pass
    a bound of 8 values a message, one event of 9 values after them does not."""
    limits = endpoint.StreamLimits(message_values=8)
    chunks = [b"data: [1,2]" + event_end] * 2_000 + [b"data: [[1,2,3,4,5,6,7,8]]" + event_end]
    bounded = endpoint.BoundedStream(Chunks(chunks), limits, events=True)
    passed = 0
    with pytest.raises(endpoint.MessageTooLarge, match="over 8 JSON values"):
        async for _ in bounded:
            passed += 1
    assert passed == 2_000


async def test_an_sse_stream_is_paced_by_events_however_they_end() -> None:
    """``SSE_PACE`` counts the same messages: 300 events ended by ``\\n\\r`` at 1,000 a second
    past no burst take 0.3 s."""
    pace = endpoint.Pace(bytes_per_second=10**9, messages_per_second=1_000, burst_seconds=0.0)
    chunks = [b"data: 1\n\r" * 30] * 10
    bounded = endpoint.BoundedStream(Chunks(chunks), endpoint.StreamLimits(pace=pace), events=True)
    started = time.monotonic()
    async for _ in bounded:
        pass
    assert time.monotonic() - started >= 0.25


@pytest.mark.parametrize("events", [True, False], ids=["event-stream", "json"])
async def test_parts_of_one_byte_each_count_as_sixty_four(events: bool) -> None:
    """One message sent a byte a part (a chunk of one byte each: six on the wire) passes a
    bound of 64 KiB a message at its 1,025th part, and events sent a part each a bound of
    1 MiB in all at the 16,385th: parsing and passing on each part costs the reader as much as
    a short event would; before, the bounds took 65,537 and 1,048,577 parts."""
    limits = endpoint.StreamLimits(message_bytes=64 * 1024)
    bounded = endpoint.BoundedStream(Chunks([b"x"] * 200_000), limits, events=events)
    passed = 0
    with pytest.raises(endpoint.MessageTooLarge, match="a message over 65536 bytes"):
        async for _ in bounded:
            passed += 1
    assert passed == 1_024
    whole = endpoint.StreamLimits(whole=endpoint.WholeBound(1024 * 1024, 10**6))
    bounded = endpoint.BoundedStream(Chunks([b"\n\n"] * 200_000), whole, events=True)
    passed = 0
    with pytest.raises(endpoint.MessageTooLarge, match="over 1048576 bytes in all"):
        async for _ in bounded:
            passed += 1
    assert passed == 16_384
