"""The worker's pool of reused MCP client sessions (each opened by ``endpoint.open_session``).

Opening an MCP session costs a handshake (``initialize``, or the ``server/discover`` probe of
2026-era servers) and a connection: about 200 ms per call when every call opens its own. A
worker process therefore keeps one session per namespace and server identity — URL,
transport, timeout and a digest of the header values (so headers from a Secret that changed
get a new session; the values themselves are never logged) — in a ``SessionPool``. Runs of
one namespace share it (a stateful server sees their calls in one session); runs of two
namespaces never do.

- Each pooled session is entered and left by one long-lived task of its own (the SDK's
  context managers hold anyio cancel scopes, which must be exited in the task that entered
  them); callers only send requests through it, from their own tasks.
- At most ``PoolSettings.calls_per_session`` calls run on one session at once; further ones
  wait (inside their own timeout).
- A session idle for ``PoolSettings.idle_seconds`` is closed; ``SessionPool.aclose`` closes
  every one at worker shutdown. A namespace keeps at most ``PoolSettings.sessions_per_scope``
  open (its least recently used idle ones are closed first).
- A session that is lost is dropped, and its call is sent once more on a new session when
  that is safe (``Loss``, ``may_resend``): the server answered HTTP 404 for our session id (it
  restarted or expired the session: the request was refused unread) or the connection could
  not be opened — any call may go again; the connection was reset or closed under the call —
  only a ``read`` call goes again. A session whose call timed out is dropped too (a
  black-holed connection must not stay pooled), but the call is not resent. A session whose
  transport failed between calls, or whose server ended its inbound stream (an SSE stream
  closed cleanly by a stopping server included), is dropped as the SDK reads it, so no later
  call is sent on it.

What does not belong here: the mapping of results and faults (``remote``), reading Secrets,
retries with backoff across attempts (the worker's tool runner).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
from typing import TYPE_CHECKING, Any

import httpx2

from .endpoint import CONNECTION_LOST, Endpoint, mcp_error_code, open_session, root_cause

if TYPE_CHECKING:  # loaded on first use (``endpoint.load_sdk``)
    from mcp import Client
    from mcp.types import CallToolResult, RequestParamsMeta

__all__ = ["Loss", "PoolSettings", "SessionLost", "SessionPool", "may_resend"]

log = logging.getLogger(__name__)

_SESSION_HEADER = "mcp-session-id"
_CONNECTION_CLOSED = -32000
"""The SDK's JSON-RPC code for a request whose connection closed before its answer."""
_SESSION_REFUSED = frozenset({-32600, -32001})
"""JSON-RPC codes of the error a request gets with an HTTP 404 for an unknown session id:
invalid request (the Python SDK's servers, and the client's own "Session terminated"), and
-32001 "Session not found" (the TypeScript SDK's servers)."""


class Loss(enum.StrEnum):
    """How a pooled session was lost, which says whether its call may be sent again."""

    REFUSED = "refused"
    """The request was not run: the server answered HTTP 404 for the session id (it restarted
    or expired the session) or the connection could not be opened."""
    BROKEN = "broken"
    """The connection was reset or closed, or the call timed out: the server may have run it."""


def may_resend(loss: Loss, *, effect: str) -> bool:
    """Whether a call whose session was lost so may be sent once more on a new session.

    A ``read`` call always may. An ``idempotent`` or ``write`` call only when the server
    cannot have run it (``Loss.REFUSED``): a write whose outcome is unknown is never resent.
    """
    return effect == "read" or loss is Loss.REFUSED


class SessionLost(Exception):
    """A pooled session broke under a call (``loss`` says whether the call may have run)."""

    def __init__(self, message: str, *, loss: Loss, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.loss = loss
        self.cause = cause


@dataclasses.dataclass(frozen=True, slots=True)
class PoolSettings:
    """Bounds of a ``SessionPool``."""

    calls_per_session: int = 16
    """Calls that may run on one session at once; more wait for a free slot."""
    idle_seconds: float = 120.0
    """A session with no call for this long is closed."""
    close_seconds: float = 5.0
    """Seconds a session's close (the DELETE of its id, the connection's close) may take."""
    sessions_per_scope: int = 32
    """Sessions of one scope (a namespace) kept open at once: opening another first closes
    the scope's least recently used idle ones (sessions with calls running stay). A session's
    identity holds what the tenant chooses (its server's URL, call timeout, header values),
    so runs admitted while it changes one get a session each, which held its connections
    and task for ``idle_seconds``."""


_Key = tuple[str, str, str, float, str, bool, str]
"""A pooled session's key: the scope, then ``Endpoint.identity``."""


class _Session:
    """One pooled session and the task that owns it (enters and leaves its client)."""

    def __init__(self, endpoint: Endpoint, settings: PoolSettings, *, key: _Key) -> None:
        self.endpoint = endpoint
        self.key = key
        self.settings = settings
        self.gate = asyncio.Semaphore(settings.calls_per_session)
        self.in_flight = 0
        self.closing = False
        """No new call may use it (dropped, idle, or shutting down)."""
        self.refused = False
        """The server answered 404 for its session id (to some request)."""
        self.failure: BaseException | None = None
        self.ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        self.ready.add_done_callback(_retrieved)
        self.lost = asyncio.Event()
        self._wake = asyncio.Event()
        self._last_used = asyncio.get_running_loop().time()
        self.owner = asyncio.create_task(self._own(), name=f"mcp-session {endpoint.url}")

    async def _on_response(self, response: httpx2.Response) -> None:
        """HTTP 404 for a request with our session id: the server no longer knows the
        session (it restarted, or expired it); no new call may start on it."""
        if response.status_code == 404 and _SESSION_HEADER in response.request.headers:
            self.refused = True
            self.drop()

    def _on_fault(self, fault: Exception) -> None:
        """The transport failed outside a call, or its inbound stream ended: no new call may
        start on it. (Its own close ends the stream too; that is not logged.)"""
        if self.failure is None:
            self.failure = fault
        if not self.closing:
            log.info("MCP session to %s failed: %r", self.endpoint.url, fault)
        self.drop()

    def drop(self) -> None:
        """Take no new calls; close once the calls running end."""
        self.closing = True
        self._wake.set()

    @property
    def last_used(self) -> float:
        """When (the loop's clock) its last call ended, or it was opened."""
        return self._last_used

    def release(self) -> None:
        """A call ended."""
        self.in_flight -= 1
        self._last_used = asyncio.get_running_loop().time()
        self._wake.set()

    async def _own(self) -> None:
        """Enter the client, hold it until dropped or idle, leave it — all in this task."""
        try:
            async with contextlib.AsyncExitStack() as stack:
                async with asyncio.timeout(self.endpoint.timeout):
                    client = await stack.enter_async_context(
                        open_session(
                            self.endpoint, on_response=self._on_response, on_fault=self._on_fault
                        )
                    )
                self.ready.set_result(client)
                await self._hold()
                self.closing = True
                async with asyncio.timeout(self.settings.close_seconds):
                    await stack.aclose()
        except asyncio.CancelledError:
            raise
        except BaseException as err:  # the transport failed: the session is gone
            self.failure = err
            if not self.ready.done():
                self.ready.set_exception(err)
            elif not isinstance(root_cause(err), TimeoutError):
                log.info("MCP session to %s ended: %r", self.endpoint.url, root_cause(err))
        finally:
            self.closing = True
            if not self.ready.done():
                self.ready.set_exception(
                    SessionLost("the MCP session closed before it opened", loss=Loss.REFUSED)
                )
            self.lost.set()

    @property
    def usable(self) -> bool:
        """Open, and neither lost nor refused by its server."""
        if self.closing or self.lost.is_set() or not self.ready.done():
            return False
        return self.ready.exception() is None

    async def _hold(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            idle = loop.time() - self._last_used
            if self.in_flight == 0 and (self.closing or idle >= self.settings.idle_seconds):
                return
            self._wake.clear()
            wait = self.settings.idle_seconds - idle if self.in_flight == 0 else None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()

    async def call(
        self, tool: str, arguments: dict[str, Any], meta: RequestParamsMeta | None
    ) -> CallToolResult:
        """Send one ``tools/call`` on this session.

        Raises ``SessionLost`` when the session broke under it, else what the SDK raises
        (``MCPError`` for a JSON-RPC error, ``TimeoutError`` from the read timeout).
        """
        client = await asyncio.shield(self.ready)
        async with self.gate:
            sent = asyncio.ensure_future(client.call_tool(tool, arguments, meta=meta))
            watch = asyncio.ensure_future(self.lost.wait())
            try:
                await asyncio.wait({sent, watch}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (sent, watch):
                    task.cancel()
                await asyncio.gather(sent, watch, return_exceptions=True)
            if not sent.cancelled() and sent.exception() is None:
                return sent.result()
            err = None if sent.cancelled() else sent.exception()
            raise (
                self._loss(err)
                or err
                or SessionLost(
                    "the MCP session closed under the call", loss=Loss.BROKEN, cause=self.failure
                )
            )

    def _loss(self, err: BaseException | None) -> SessionLost | None:
        """The loss ``err`` means for this session, or ``None`` when it leaves it usable."""
        cause = root_cause(err) if err is not None else None
        code = mcp_error_code(cause)
        if self.refused and code in _SESSION_REFUSED:
            # this request's own answer: the 404 for the session id, as the SDK surfaces it
            return SessionLost(
                "the server no longer knows this MCP session (HTTP 404)",
                loss=Loss.REFUSED,
                cause=cause,
            )
        if isinstance(cause, httpx2.ConnectError):
            return SessionLost(f"cannot connect: {cause}", loss=Loss.REFUSED, cause=cause)
        if code == _CONNECTION_CLOSED:
            return SessionLost("the MCP connection closed", loss=Loss.BROKEN, cause=cause)
        if isinstance(cause, CONNECTION_LOST):
            return SessionLost(f"{type(cause).__name__}", loss=Loss.BROKEN, cause=cause)
        if err is None:
            return SessionLost("the MCP session ended", loss=Loss.BROKEN, cause=self.failure)
        return None


def _retrieved(future: asyncio.Future[Client]) -> None:
    """Mark a failed opening as seen (its callers get it; no "never retrieved" warning)."""
    if not future.cancelled():
        future.exception()


class SessionPool:
    """The MCP sessions of one worker process, one per scope (the calling run's namespace)
    and server identity (``Endpoint.identity``), reused across calls, runs and turns. Close
    with ``aclose``."""

    def __init__(self, settings: PoolSettings | None = None) -> None:
        self.settings = settings or PoolSettings()
        self._sessions: dict[_Key, _Session] = {}
        self._all: set[_Session] = set()
        self._closed = False
        self.opened = 0
        """Sessions opened so far (for tests and benchmarks)."""

    def __len__(self) -> int:
        """Sessions open or opening now."""
        return sum(1 for s in self._all if not s.owner.done())

    def _checkout(self, endpoint: Endpoint, scope: str) -> _Session:
        """A usable session for ``endpoint`` in ``scope`` (opened if need be), counted as in
        use."""
        if self._closed:
            raise RuntimeError("the MCP session pool is closed")
        key = (scope, *endpoint.identity())
        session = self._sessions.get(key)
        if session is None or session.closing:
            self._make_room(scope)
            session = _Session(endpoint, self.settings, key=key)
            self._sessions[key] = session
            self._all.add(session)
            session.owner.add_done_callback(self._forget)
            self.opened += 1
        session.in_flight += 1
        return session

    def _make_room(self, scope: str) -> None:
        """Drop ``scope``'s least recently used idle sessions until one more fits within
        ``settings.sessions_per_scope`` (or none idle is left)."""
        kept = [s for s in self._all if s.key[0] == scope and not s.closing]
        excess = len(kept) + 1 - self.settings.sessions_per_scope
        idle = sorted((s for s in kept if s.in_flight == 0), key=lambda s: s.last_used)
        for session in idle[: max(excess, 0)]:
            session.drop()

    def _forget(self, owner: asyncio.Task[None]) -> None:
        for session in [s for s in self._all if s.owner is owner]:
            self._all.discard(session)
            if self._sessions.get(session.key) is session:
                del self._sessions[session.key]

    async def call_tool(
        self,
        endpoint: Endpoint,
        tool: str,
        arguments: dict[str, Any],
        *,
        meta: RequestParamsMeta | None = None,
        effect: str = "read",
        scope: str = "",
    ) -> CallToolResult:
        """Call ``tool`` on a pooled session of ``endpoint``, within ``endpoint.timeout``
        seconds in all (opening a session included). Sessions are never shared across
        ``scope``s (the worker passes the run's namespace, so no two tenants share one).

        When the session is lost under the call it is dropped, and the call is sent once
        more on a new session if ``may_resend(loss, effect=effect)``. Raises ``SessionLost``
        (the call was not resent, or its resend was lost too), ``TimeoutError``, or what the
        SDK raises for the call (``MCPError``, ``httpx2`` errors).
        """
        async with asyncio.timeout(endpoint.timeout):
            for attempt in (1, 2):
                session = self._checkout(endpoint, scope)
                try:
                    return await session.call(tool, arguments, meta)
                except SessionLost as lost:
                    session.drop()
                    resend = attempt == 1 and may_resend(lost.loss, effect=effect)
                    log.info(
                        "MCP session to %s lost (%s: %s); %s",
                        endpoint.url,
                        lost.loss,
                        lost,
                        "sending the call again on a new session" if resend else "not resent",
                    )
                    if not resend:
                        raise
                except (TimeoutError, asyncio.CancelledError):
                    session.drop()  # a black-holed connection must not stay pooled
                    raise
                except BaseException:
                    if not session.usable:
                        session.drop()
                    raise
                finally:
                    session.release()
        raise AssertionError("unreachable")  # pragma: no cover

    async def aclose(self) -> None:
        """Close every session (each in its own task), waiting at most
        ``settings.close_seconds`` before cancelling the stragglers. Idempotent."""
        self._closed = True
        owners = [s.owner for s in self._all]
        for session in list(self._all):
            session.drop()
        if not owners:
            return
        _, pending = await asyncio.wait(owners, timeout=self.settings.close_seconds + 1)
        for task in pending:
            task.cancel()
        await asyncio.gather(*owners, return_exceptions=True)
