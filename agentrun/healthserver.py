"""The probes' HTTP endpoint of a process, served by its own asyncio event loop.

Kubernetes' liveness probe must fail when the loop that does the work is stuck (a blocking
call, a busy loop): a server on a thread of its own (``prometheus_client``'s metrics port)
would keep answering. This one is a task of the loop itself, so a probe that gets no answer
within its ``timeoutSeconds`` means the loop is not running.

What belongs here: the tiny HTTP/1.1 server (GET only, one request per connection, a plain text
body). What each path answers is the caller's (``operator.health``, ``worker.main``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

Answer = Callable[[str], tuple[int, str]]
"""``answer(path) -> (HTTP status, body)`` for a GET of ``path`` (query string removed)."""


def probe_answer(*, alive: str, ready: Callable[[], str | None]) -> Answer:
    """The usual answer: ``/healthz`` 200 with ``alive`` (reached at all: the loop runs),
    ``/readyz`` 200 when ``ready()`` returns ``None``, else 503 with what it returned (why not
    ready); any other path 404."""

    def answer(path: str) -> tuple[int, str]:
        if path == "/healthz":
            return 200, f"{alive}\n"
        if path == "/readyz":
            why = ready()
            return (200, "ready\n") if why is None else (503, f"not ready: {why}\n")
        return 404, "not found\n"

    return answer


async def serve(answer: Answer, *, host: str, port: int) -> asyncio.Server:
    """Serve ``answer`` on ``host:port`` from the running loop; close the returned server to
    stop. Raises ``OSError`` if the port cannot be bound."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(5):
                request = await reader.readline()
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
            parts = request.decode("latin-1").split()
            path = parts[1].split("?", 1)[0] if len(parts) >= 2 else ""
            code, body = answer(path)
            payload = body.encode()
            head = (
                f"HTTP/1.1 {code} {'OK' if code == 200 else 'Error'}\r\n"
                "Content-Type: text/plain; charset=utf-8\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + payload)
            await writer.drain()
        except (TimeoutError, ConnectionError, UnicodeDecodeError) as err:
            log.debug("probe request failed: %r", err)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    return await asyncio.start_server(handle, host, port)
