"""The NATS connection every agentrun process makes: reconnecting for ever, also after ``-ERR``.

nats-py treats a server ``-ERR`` (other than a stale connection or a permissions violation) as
final and closes the connection; a runtime process must not stay disconnected, so
``ReconnectingClient`` sends such an error down the reconnect path instead and counts completed
reconnections (``reconnections``), which lets pull consumers bind again. A message over the
server's ``max_payload`` is such an error, so a payload's size is checked before it is sent
(``event_cap``, ``EventTooLarge``).

Who the client is and which server it trusts come from files (``NatsAuth``): a ``.creds`` file
(a user JWT and its NKey seed, see ``agentrun.natsauth``), read again on every connect, so a
rotated file (a Kubernetes Secret volume updates in place) is what the next reconnect presents;
and a CA bundle that the server's certificate must chain to, its name checked against the
URL's host (TLS hostname verification). A user agentrun minted also tells the client its inbox
subtree, the only one its permissions let it subscribe to.
"""

from __future__ import annotations

import dataclasses
import logging
import ssl
from pathlib import Path
from typing import Any

import nats.errors
from nats.aio.client import Client as NATS
from nats.protocol import parser

from agentrun.natsauth import creds

log = logging.getLogger(__name__)

HEADER_ROOM = 4096
"""Bytes of the server's ``max_payload`` left for a message's headers: nats-py checks only the
payload against it, the server the whole message (answering ``-ERR`` over it)."""


class EventTooLarge(Exception):
    """An event's payload is over what one message may hold (``event_cap``); nothing was sent."""

    def __init__(self, size: int, cap: int) -> None:
        super().__init__(f"the event is {size} bytes, over the {cap} bytes a message may hold")
        self.size = size
        """The payload's bytes."""
        self.cap = cap
        """The most bytes the payload could have taken."""


def event_cap(nc: NATS) -> int:
    """The most bytes a payload sent on ``nc`` may take: its server's ``max_payload`` (1 MiB
    unless configured), less ``HEADER_ROOM``."""
    return int(nc.max_payload) - HEADER_ROOM


@dataclasses.dataclass(frozen=True, slots=True)
class NatsAuth:
    """How a client proves who it is and checks whom it talks to; both optional (an open,
    plain-text server needs neither)."""

    creds_file: Path | None = None
    """The user's ``.creds`` file (``AGENTRUN_NATS_CREDS_FILE``), read on every connect."""
    ca_file: Path | None = None
    """PEM bundle of the CA that signed the server's certificate (``AGENTRUN_NATS_CA_FILE``):
    set, the connection is TLS and the certificate must name the URL's host."""


def connect_options(auth: NatsAuth | None) -> dict[str, Any]:
    """The nats-py ``connect`` keyword arguments for ``auth``: ``user_credentials`` (a path,
    so nats-py reads the file at each connect), ``inbox_prefix`` (the user's inbox subtree,
    when agentrun minted it) and ``tls`` (a context verifying the server against
    ``ca_file``, hostname checked).

    Raises ``OSError`` when a file cannot be read, ``natsauth.InvalidCreds`` when the creds
    file is not one, ``ssl.SSLError`` when the CA file holds no certificate.
    """
    if auth is None:
        return {}
    options: dict[str, Any] = {}
    if auth.creds_file is not None:
        user = creds.read(auth.creds_file)  # fail at start-up, naming the file
        options["user_credentials"] = str(auth.creds_file)
        prefix = user.inbox_prefix()
        if prefix is not None:
            options["inbox_prefix"] = prefix
    if auth.ca_file is not None:
        context = ssl.create_default_context(cafile=str(auth.ca_file))
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        options["tls"] = context
    return options


class ReconnectingClient(NATS):
    """A nats-py client that reconnects after *any* server error, not only a stale connection.

    nats-py closes the connection for good when the server sends ``-ERR`` (other than a stale
    connection or a permissions violation), e.g. after the server hit a protocol error on it;
    the server then closes the socket, and a runtime process must not stay disconnected.
    Here such an error goes down the reconnect path instead (``max_reconnect_attempts=-1``:
    for ever). That includes the server closing a user whose credentials were revoked or
    expired: the reconnect reads the creds file again, so a rotated file takes over.
    ``reconnects`` counts completed reconnections, so pull consumers can rebind.
    """

    reconnects = 0
    """Reconnections completed since the first connect."""

    async def _process_err(self, err_msg: str) -> None:
        if self.is_connecting or parser.PERMISSIONS_ERR in err_msg:  # the latter leaves it open
            await super()._process_err(err_msg)
            return
        err = nats.errors.Error(f"nats: {err_msg.strip(chr(39))}")
        log.warning("NATS server error %s; reconnecting", err)
        self._err = err
        await self._process_op_err(err)


DRAIN_SECONDS = 5
"""Most seconds closing a connection waits for its subscriptions to drain (nats-py's default is
30): a pull subscription that once found a late message in its queue never counts as drained
(nats-py takes such a message without marking it done), and a process stopping within its
grace period must not spend it there."""


async def close_nats(nc: NATS) -> None:
    """Close ``nc`` as a stopping process does: drain it (its subscriptions, then what it
    published) within ``DRAIN_SECONDS``, or close it at once while it is reconnecting (nats-py
    refuses to drain then). Raises nothing for a connection already closed."""
    if nc.is_closed:
        return
    try:
        await nc.drain()
    except nats.errors.ConnectionReconnectingError:
        await nc.close()


async def connect_nats(
    url: str, *, name: str, auth: NatsAuth | None = None, fail_fast: bool = False
) -> NATS:
    """A NATS connection as every agentrun process makes it, to one of the servers of `url`
    (``server_urls``: one URL or a comma-separated list): authenticated and verified as
    ``auth`` says (``connect_options``), reconnecting for ever, half a second apart, also after
    a server ``-ERR`` (``ReconnectingClient``).

    ``fail_fast`` (the CLI programs): the first connect gives up after one round (nats-py tries
    a server twice, half a second apart, each within 2 s) without logging each failed try, so
    a server that does not answer costs a few seconds and one error; once connected, the
    connection reconnects for ever as any other.

    Raises ``nats.errors.NoServersError`` when no server answers at first (``fail_fast``: the
    refusal, timeout or ``NoServersError`` of the last try), ``nats.errors.Error`` when the
    server refuses the credentials, and what ``connect_options`` raises.
    """
    nc = ReconnectingClient()
    connected = not fail_fast

    async def reconnected() -> None:
        nc.reconnects += 1
        log.info("NATS connection %s reconnected (%d)", name, nc.reconnects)

    async def disconnected() -> None:
        if not (nc.is_closed or nc.is_draining):
            log.warning("NATS connection %s lost; reconnecting", name)

    async def errored(err: Exception) -> None:
        if connected:  # a fail-fast first connect reports its failure once, by raising
            log.warning("NATS connection %s: %r", name, err)

    options: dict[str, Any] = {  # nats-py types the wait as int; it takes seconds as float
        "name": name,
        "connect_timeout": 2 if fail_fast else 5,
        "max_reconnect_attempts": 1 if fail_fast else -1,
        "reconnect_time_wait": 0.5,
        "drain_timeout": DRAIN_SECONDS,
        "reconnected_cb": reconnected,
        "disconnected_cb": disconnected,
        "error_cb": errored,
        **connect_options(auth),
    }
    await nc.connect(servers=server_urls(url), **options)
    nc.options["max_reconnect_attempts"] = -1  # nats-py reads it at each reconnect
    connected = True
    return nc


def server_urls(url: str) -> list[str]:
    """The server URLs of ``AGENTRUN_NATS_URL``: one URL, or several separated by commas (the
    servers of a JetStream cluster, e.g. ``tls://nats-0:4222,tls://nats-1:4222``), blanks
    around each dropped. A client connects to one and reconnects to another when it goes; it
    also learns the cluster's other servers from the one it reaches, but only a list lets a
    process *start* while the first server is down. Raises ValueError for an empty list."""
    urls = [part.strip() for part in url.split(",") if part.strip()]
    if not urls:
        raise ValueError(f"no NATS server URL in {url!r}")
    return urls


def reconnections(nc: NATS) -> int:
    """How often ``nc`` reconnected (0 for a client not made by ``connect_nats``)."""
    return nc.reconnects if isinstance(nc, ReconnectingClient) else 0
