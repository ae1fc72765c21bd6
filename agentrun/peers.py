"""Which tenant's peer the running code serves, for what the process logs on its behalf.

A library that logs a line per message a peer sends (the MCP SDK) does not say which peer it
was serving. ``serving`` names the peer (a tenant's tool server) for a block of code:
``process.LibraryLogBound`` reads ``current()`` to count such a line against that peer's own
budget and to name the peer in it. The worker names the peer around a tool call, the operator
around a discovery; asyncio copies the context into every task created under it, so the SDK's
own tasks of a session opened there (its stream readers and writers, for the session's life)
serve the same peer.

What belongs here: the context variable and the block that sets it — no I/O, no logging.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

__all__ = ["current", "serving"]

_PEER: contextvars.ContextVar[str | None] = contextvars.ContextVar("agentrun_peer", default=None)


def current() -> str | None:
    """The peer being served, ``<namespace>/<name>`` of its tool server; ``None`` outside any
    ``serving`` block."""
    return _PEER.get()


@contextlib.contextmanager
def serving(namespace: str, name: str) -> Iterator[str]:
    """Serve tool server ``name`` of ``namespace`` inside the block (and in every task created
    in it); yields the peer's label, ``<namespace>/<name>``. Enter and leave it in one task (a
    plain ``with``): leaving it restores the peer served before."""
    peer = f"{namespace}/{name}"
    token = _PEER.set(peer)
    try:
        yield peer
    finally:
        _PEER.reset(token)
