"""Serving a test's own HTTP endpoint (aiohttp) on a loopback port."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
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
