"""Serving a test's own HTTP endpoint (aiohttp) on a loopback port."""

from __future__ import annotations

import contextlib
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
