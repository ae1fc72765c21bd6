"""The operator's HTTP probe endpoints: ``/healthz`` (the process serves) and ``/readyz``.

``/readyz`` answers 200 only once the installed CRDs serve what this operator writes (see
``crdcheck``), 503 with the reason before; a standby that waits for the leader Lease is ready
(it takes over without a restart). The body names the role (``leader`` or ``standby``).

What belongs here: the tiny HTTP/1.1 server and the state it reports. Nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Health:
    """What the probes report; mutated by ``main`` as start-up proceeds."""

    ready: bool = False
    reason: str = "checking the installed CRDs"
    role: str = "standby"

    def set_ready(self, ready: bool) -> None:
        """Record the outcome of the CRD check."""
        self.ready = ready
        self.reason = "" if ready else "the installed CRDs do not serve what this operator writes"

    def answer(self, path: str) -> tuple[int, str]:
        """(HTTP status, body) for a GET of ``path``."""
        if path == "/healthz":
            return 200, f"ok {self.role}\n"
        if path == "/readyz":
            if self.ready:
                return 200, f"ready {self.role}\n"
            return 503, f"not ready: {self.reason}\n"
        return 404, "not found\n"


async def serve(health: Health, *, host: str, port: int) -> asyncio.Server:
    """Serve ``health`` on ``host:port``; raises ``OSError`` if the port cannot be bound."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(5):
                request = await reader.readline()
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
            parts = request.decode("latin-1").split()
            path = parts[1].split("?", 1)[0] if len(parts) >= 2 else ""
            code, body = health.answer(path)
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
