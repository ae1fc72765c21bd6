"""The response heads a peer sends before its answer, bounded in number.

HTTP/1.1 lets a server send any number of informational (1xx) responses before the final one
(RFC 9110 section 15.2), and ``httpcore2`` reads them one after another for as long as they
come, each under its read timeout: a tenant's model endpoint or tool server answering
``103 Early Hints`` at network speed kept a core of the worker (which every tenant's turns
share) parsing heads until the run's deadline. ``HeadsBackend`` wraps a network backend so
that every connection it opens refuses a response with more than ``MAX_INFORMATIONAL``
informational heads before its final one (real servers send one or two, 100 Continue or
103 Early Hints), raising the error it is given as the request's transport error. The
``http_get`` tool, whose client (aiohttp) reads informational heads without end too, counts
them with ``HeadCount``.

Nor are the heads read a byte at a time without end: the HTTP parser takes a head of up to
100 KiB, so seventeen of them, sent a byte a write, were 1.7 million reads, each about 100 µs
of the event loop's CPU (the read, ``anyio``'s and ``httpcore2``'s own steps): a model call's
heads kept a worker core busy for minutes, bounded only by the run's deadline. Each read of
heads counts ``MIN_READ_BYTES`` at least, and an answer whose heads count more than
``MAX_HEADS_BYTES`` is refused the same way (as a body's parts count ``MIN_PART_BYTES``).

What belongs here: counting the heads read between a request written and its final head
(``HeadCount``, pure) and the backend that applies it to each connection's reads. What does
not: the bounds on a body (``endpoint.BoundedStream``), where a connection may go
(``reach``).
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Callable, Iterable

import httpcore2
from httpcore2 import AsyncNetworkBackend, AsyncNetworkStream

MAX_INFORMATIONAL = 16
"""Most informational (1xx but 101) responses one request's answer may start with."""
HEAD_END = re.compile(rb"\n\r?\n")
"""The blank line that ends a head, as ``h11`` finds it (a bare LF accepted)."""
MAX_HEAD_BYTES = 128 * 1024
"""Bytes of one head kept to find its end at most: past them the parser (``h11``, 100 KiB)
refuses the head itself, so the count stops looking."""
REFUSAL = (
    f"the server sent over {MAX_INFORMATIONAL} informational (1xx) responses before its answer"
)
"""What a refused answer's error says."""
STATUS = re.compile(rb"\s*HTTP/\d\.\d (\d{3})")
"""A head's status line, its code captured."""
MIN_READ_BYTES = 64
"""Bytes each read of an answer's heads counts for at least (``HeadCount.spent``)."""
MAX_HEADS_BYTES = 1024 * 1024
"""Bytes an answer's heads may count (``HeadCount.spent``): real heads are a few hundred bytes
in a read or two; 16,384 reads of a byte each (2 s of CPU measured on a loaded loopback) reach
it."""
DRIBBLED = f"the server sent its heads in reads counting over {MAX_HEADS_BYTES} bytes"
"""What an answer refused for ``MAX_HEADS_BYTES`` says."""


class HeadCount:
    """The informational heads of the answer to the request written last on one connection
    (mutable). ``feed`` the bytes read after a request was written (``start``); it says how
    many informational heads came before the final one, which ends the count (the body that
    follows is not looked at)."""

    def __init__(self) -> None:
        self.informational = 0
        self.spent = 0
        """Bytes this answer's heads count: each read ``MIN_READ_BYTES`` at least."""
        self._head = bytearray()
        self._searched = 0
        """Bytes of ``_head`` from which a head's end was looked for and not found, less the
        two that may begin one (``HEAD_END`` is 3 bytes at most)."""
        self._done = True

    def start(self) -> None:
        """A request was written: its answer's heads are counted from here."""
        self.informational, self._head, self._searched, self._done = 0, bytearray(), 0, False
        self.spent = 0

    def feed(self, data: bytes) -> int:
        """Count the heads ``data`` (bytes read next) completes; the informational heads of
        this answer so far. Each byte is looked at a bounded number of times, however the
        head is split into reads (looking from the head's start at each read took 4.1 s of
        CPU for a 128 KiB head read a byte at a time)."""
        if self._done:
            return self.informational
        self.spent += max(len(data), MIN_READ_BYTES)
        self._head += data
        while not self._done and (end := HEAD_END.search(self._head, self._searched)):
            status = STATUS.match(self._head)
            code = int(status.group(1)) if status is not None else 0
            if 100 <= code < 200 and code != 101:
                self.informational += 1
                del self._head[: end.end()]
                self._searched = 0
            else:
                self._done, self._head = True, bytearray()
        self._searched = max(0, len(self._head) - 2)
        if len(self._head) > MAX_HEAD_BYTES:
            self._done, self._head = True, bytearray()
        return self.informational

    def refusal(self) -> str | None:
        """Why the answer is refused (``REFUSAL``: over ``MAX_INFORMATIONAL`` informational
        heads; ``DRIBBLED``: its heads' reads count over ``MAX_HEADS_BYTES``), or ``None``."""
        if self.informational > MAX_INFORMATIONAL:
            return REFUSAL
        if self.spent > MAX_HEADS_BYTES:
            return DRIBBLED
        return None


class HeadsStream(AsyncNetworkStream):
    """A connection's stream whose reads raise ``error`` once an answer has had more than
    ``MAX_INFORMATIONAL`` informational heads or its heads were read in too many reads
    (``HeadCount.refusal``), and count the bytes they received (``received``: what a body's
    parts cost on the wire, ``endpoint.Metered``)."""

    def __init__(self, inner: AsyncNetworkStream, error: Callable[[str], Exception]) -> None:
        self.inner = inner
        self.error = error
        self.count = HeadCount()
        self.received = 0
        """Bytes read from the connection (after TLS) so far."""

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        data = await self.inner.read(max_bytes, timeout)
        self.received += len(data)
        self.count.feed(data)
        if (why := self.count.refusal()) is not None:
            raise self.error(why)
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.count.start()
        await self.inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> AsyncNetworkStream:
        inner = await self.inner.start_tls(ssl_context, server_hostname, timeout)
        return HeadsStream(inner, self.error)

    def get_extra_info(self, info: str) -> object:
        return self.inner.get_extra_info(info)


class HeadsBackend(AsyncNetworkBackend):
    """``inner`` (a network backend) whose connections are ``HeadsStream``s raising
    ``error``."""

    def __init__(self, inner: AsyncNetworkBackend, error: Callable[[str], Exception]) -> None:
        self.inner = inner
        self.error = error

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> AsyncNetworkStream:
        stream = await self.inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return HeadsStream(stream, self.error)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> AsyncNetworkStream:
        stream = await self.inner.connect_unix_socket(path, timeout, socket_options)
        return HeadsStream(stream, self.error)

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


def bound_heads(pool: object, error: Callable[[str], Exception]) -> None:
    """Make the connections ``pool`` (an ``httpcore2.AsyncConnectionPool``, a proxy's among
    them: an ``httpx2`` transport's ``_pool``) opens from now on bound their answers' heads
    (``HeadsBackend``), raising ``error``. ``httpx2``'s transports take no network backend;
    their pools keep theirs in ``_network_backend``, which every connection is built with."""
    backend = getattr(pool, "_network_backend", None)
    if not isinstance(backend, AsyncNetworkBackend):
        raise TypeError(f"{type(pool).__name__} has no network backend to bound")
    if not isinstance(backend, HeadsBackend):
        pool._network_backend = HeadsBackend(backend, error)  # type: ignore[attr-defined]
