"""Serving a test's own HTTP endpoint (aiohttp) on a loopback port."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web


@contextlib.asynccontextmanager
async def serving(app: web.Application | dict[str, Any]) -> AsyncIterator[str]:
    """``app`` — or routes, path → handler for every method — on a loopback port; yields its
    base URL ``http://127.0.0.1:<port>``."""
    if isinstance(app, dict):
        routes, app = app, web.Application()
        for path, handler in routes.items():
            app.router.add_route("*", path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def loopback_kubeconfig(path: Path, server: str) -> Path:
    """Write to ``path`` a kubeconfig for the plain-HTTP API server at ``server`` (a
    ``serving`` URL) with an empty user; returns ``path``."""
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: t\n"
        f"clusters: [{{name: t, cluster: {{server: '{server}'}}}}]\n"
        "contexts: [{name: t, context: {cluster: t, user: u}}]\n"
        "users: [{name: u, user: {}}]\n"
    )
    return path


EARLY_HINTS = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
"""One informational head (RFC 8297), as a server sends before its answer."""


@contextlib.asynccontextmanager
async def heads_first(
    heads: int | None, final: bytes = b"", forever: bytes = b"", written: list[int] | None = None
) -> AsyncIterator[str]:
    """A raw HTTP/1.1 server on a loopback port answering every request with ``heads``
    informational heads (``EARLY_HINTS``; ``None``: for ever, as fast as they are read), then
    ``final`` (a whole response, its connection closed after), or, with ``forever``, the start
    of one (its head) and then ``forever`` again and again, as fast as it is read (``written``,
    when given, gets the bytes of ``forever`` each connection wrote); yields its base URL
    ``http://127.0.0.1:<port>``."""

    writers: set[asyncio.StreamWriter] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.add(writer)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
            await reader.readexactly(int(length.group(1)) if length else 0)
            sent = 0
            while heads is None or sent < heads:
                writer.write(EARLY_HINTS * 100 if heads is None else EARLY_HINTS)
                await writer.drain()
                sent += 1
            writer.write(final)
            await writer.drain()
            if written is not None and forever:
                written.append(0)
            while forever:
                writer.write(forever)
                await writer.drain()
                if written is not None:
                    written[-1] += len(forever)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for writer in writers:
            writer.transport.abort()
