"""A model endpoint may send informational (1xx) heads before its answer, but not without end:
past ``heads.MAX_INFORMATIONAL`` of them the call ends ``invalid_response``, charged the
prompt the endpoint read, once. Before, ``httpcore2`` read ``103 Early Hints`` for as long as
they came, each under the read timeout: an endpoint sending them at network speed kept a core
of the worker (shared by every tenant's turns) parsing heads until the run's deadline, which
ended the call ``deadline``. A few, as real servers send, are read past to the answer, directly
and through a proxy from the environment."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from http_support import EARLY_HINTS, heads_first

from agentrun.metrics import ModelErrorType
from agentrun.tools import heads
from agentrun.worker.model import ModelClient, RetryPolicy

from .test_cut_calls import PROMPT_BOUND, chat
from .test_read_timeouts import Endpoint, failed_call


def streamed_answer() -> bytes:
    """A whole HTTP/1.1 response streaming the completion "42" (its end: the connection's)."""
    chunks = [
        {"id": "a", "choices": [{"index": 0, "delta": {"content": "42"}, "finish_reason": "stop"}]},
        {"id": "a", "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 1}},
    ]
    events = b"".join(f"data: {json.dumps(chunk)}\n\n".encode() for chunk in chunks)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    return head + events + b"data: [DONE]\n\n"


async def test_informational_heads_without_end_fail_the_call_charged_its_prompt() -> None:
    """With a deadline 30 s away, the call ends on the bound, not the deadline (``deadline``
    before); each of the two attempts is refused the same way, the prompt noted once."""
    async with heads_first(None) as url:
        noted, error = await failed_call(Endpoint((), base=f"{url}/v1"))
    assert (noted, error) == ([PROMPT_BOUND], ModelErrorType.INVALID_RESPONSE)


@pytest.mark.parametrize("proxied", [False, True], ids=["direct", "proxy"])
async def test_as_many_informational_heads_as_allowed_are_read_past_to_the_answer(
    proxied: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exactly ``MAX_INFORMATIONAL`` heads, then the answer: the completion, as usual. Through
    a proxy from the environment (here the server itself answers the proxied request), one
    more head than that is refused as it is directly."""
    if proxied:
        for name in ("no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY"):
            monkeypatch.delenv(name, raising=False)
    for count, answered in ((heads.MAX_INFORMATIONAL, True), (heads.MAX_INFORMATIONAL + 1, False)):
        async with heads_first(count, streamed_answer()) as url:
            base = f"{url}/v1"
            if proxied:
                monkeypatch.setenv("HTTP_PROXY", url)
                base = "http://model.invalid/v1"
            if not answered:
                noted, error = await failed_call(Endpoint((), base=base))
                assert (noted, error) == ([PROMPT_BOUND], ModelErrorType.INVALID_RESPONSE)
                continue
            client = ModelClient(RetryPolicy(max_retries=0))
            try:
                answer = await client.complete(chat(base), deadline=time.time() + 30)
            finally:
                await client.close()
            assert answer["choices"][0]["message"]["content"] == "42"


def test_a_head_count_reads_heads_split_anywhere_and_stops_at_the_final_one() -> None:
    """Heads cut at every byte, a bare LF line end, ``101`` and a final head ending the count
    (the body after it, heads or not, is not counted), and a new request starting it over."""
    count = heads.HeadCount()
    count.start()
    stream = EARLY_HINTS * 3 + b"HTTP/1.1 100 Continue\n\n" + b"HTTP/1.1 200 OK\r\n\r\n"
    seen = [count.feed(stream[i : i + 1]) for i in range(len(stream))]
    assert seen[-1] == 4
    assert count.feed(EARLY_HINTS * 50) == 4
    count.start()
    assert count.feed(EARLY_HINTS * 2 + b"HTTP/1.1 101 Switching Protocols\r\n\r\n") == 2
    assert count.feed(EARLY_HINTS) == 2


class ScanCounted:
    """``heads.HEAD_END`` counting the bytes each search is given to look through."""

    def __init__(self) -> None:
        self.scanned = 0
        self.real = heads.HEAD_END

    def search(self, data: bytes | bytearray, pos: int = 0) -> object:
        self.scanned += len(data) - pos
        return self.real.search(data, pos)


def test_a_head_read_a_byte_at_a_time_is_looked_through_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An endpoint's or tool server's head sent a byte a read: looking for its end from its
    start at each read was quadratic (4.1 s of CPU, on the event loop, for a 128 KiB head);
    each byte is looked at a bounded number of times now, heads found along the way too."""
    counted = ScanCounted()
    monkeypatch.setattr(heads, "HEAD_END", counted)
    count = heads.HeadCount()
    count.start()
    stream = EARLY_HINTS * 2 + b"HTTP/1.1 200 OK\r\nX: " + b"a" * heads.MAX_HEAD_BYTES
    for i in range(len(stream)):
        count.feed(stream[i : i + 1])
    assert count.informational == 2
    assert counted.scanned < 4 * len(stream)


class Dribbled:
    """A connection's stream (``httpcore2.AsyncNetworkStream``'s reads) giving ``data`` one
    byte a read, for ever: the heads of an answer sent a byte a write."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.reads = 0

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self.reads += 1
        return self.data[(self.reads - 1) % len(self.data) :][:1]

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        return None


DRIBBLES = {
    "5 KB informational heads": b"HTTP/1.1 103 Early Hints\r\nLink: " + b"a" * 5_000 + b"\r\n\r\n",
    "one long head": b"HTTP/1.1 200 OK\r\nX: " + b"a" * 99_000,
}


@pytest.mark.parametrize("data", DRIBBLES.values(), ids=DRIBBLES.keys())
def test_heads_read_a_byte_at_a_time_are_refused_after_a_bounded_number_of_reads(
    data: bytes,
) -> None:
    """Seventeen heads of 100 KiB (what the HTTP parser takes) a byte a read were 1.7 million
    reads, about 100 µs of the event loop each (a 100 KiB head so took 7.7 s of CPU on
    loopback); the answer is refused at the 16,385th read of its heads now, whatever they
    hold."""
    inner = Dribbled(data)
    stream = heads.HeadsStream(inner, RuntimeError)  # type: ignore[arg-type]

    async def read_on() -> str:
        await stream.write(b"GET / HTTP/1.1\r\n\r\n")
        for _ in range(200_000):
            try:
                await stream.read(65_536)
            except RuntimeError as err:
                return str(err)
        return "read on"

    assert asyncio.run(read_on()) == (
        "the server sent its heads in reads counting over 1048576 bytes"
    )
    assert inner.reads == 1024 * 1024 // 64 + 1


def test_heads_in_whole_reads_count_their_bytes() -> None:
    """Sixteen informational heads of 60 KB, each in one read, and the final one: answered
    (960 KB counted, under the bound), as 16 one-byte reads are (1 KiB counted)."""
    count = heads.HeadCount()
    count.start()
    hint = b"HTTP/1.1 103 Early Hints\r\nLink: " + b"a" * 60_000 + b"\r\n\r\n"
    for _ in range(16):
        count.feed(hint)
    count.feed(b"HTTP/1.1 200 OK\r\n\r\n")
    assert (count.informational, count.refusal()) == (16, None)
    assert count.spent == 16 * len(hint) + 64
    count.start()
    for byte in b"HTTP/1.1 200 OK\r\n\r\n"[:16]:
        count.feed(bytes([byte]))
    assert count.spent == 16 * 64
