"""Process start-up shared by ``agentrun-operator`` and ``agentrun-worker``.

What belongs here: reading the process's settings from the environment, logging, tracing, the
Prometheus metrics port, and stop signals — the same for both kinds of process. What does not:
what a process then serves (``operator.main``, ``worker.main``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import cachetools
import uvloop
from prometheus_client import start_http_server

from agentrun import collector, display, peers, telemetry
from agentrun.settings import ProcessSettings

S = TypeVar("S", bound=ProcessSettings)
T = TypeVar("T")

QUIET_LOGGERS = ("httpx", "httpx2", "openai", "kopf.objects", "kubernetes_asyncio.client.rest")
"""Libraries that log every request (the clients) or every handler call of every object
(kopf: "Handler 'run_seen' succeeded." per watch event) at INFO, or what they read and sent at
DEBUG (the Kubernetes client every response body, a Secret's base64 ``data`` among them; the
``openai`` client each request's messages): kept at WARNING whatever the process's level, so
their failures and retries still show and no body does."""
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
PEER_DRIVEN_LOGGERS = ("mcp", "client")
"""Loggers (and their children) that log a line for what a tenant's peer sends, one per
message: the MCP SDK warns of each event of an unknown type (naming it), logs each message it
cannot parse or validate with a traceback, and each reconnection of a stream. A tool server
answering one call with 2,000 such events wrote 2,000 lines, 10 MB. The SDK's client session
(``mcp.client.session``: each notification it cannot validate, with a traceback) logs as
``client``, not under ``mcp``."""
LIBRARY_LINES_PER_MINUTE = 60
"""Lines of ``PEER_DRIVEN_LOGGERS`` a process writes a minute at most for one peer (a tenant's
tool server, ``peers.current()``: one flooding server cannot hide another's lines), and at most
for the lines logged serving no peer, all of those together (the next line of the same peer, or
of none, says how many were dropped)."""
LIBRARY_LINES_CEILING = 300
"""Lines of ``PEER_DRIVEN_LOGGERS`` a process writes a minute at most in all, every peer's and
none's together: the last guard of the log's volume (300 lines of ``LIBRARY_LINE_CHARS``: about
300 KB a minute) when many peers flood at once."""
LIBRARY_PEERS = 256
"""Peers whose budgets a process keeps at once: the least recently logging one is forgotten
past it (its next line starts a new budget), so the table's size does not follow the number
of tool servers a tenant declares."""
LIBRARY_LINE_CHARS = 1_000
"""Characters of one such line kept (its exception's type and text in it, not a traceback)."""


@dataclasses.dataclass(slots=True)
class _Budget:
    """Lines of one minute (``minute``: the clock's seconds // 60) passed and dropped."""

    minute: int = -1
    passed: int = 0
    dropped: int = 0
    """Dropped since the last line that passed (said, then reset, by that line)."""

    def spend(self, minute: int, limit: int) -> bool:
        """Whether one more line fits ``limit`` lines a minute in ``minute`` (counted if so)."""
        if minute != self.minute:
            self.minute, self.passed = minute, 0
        if self.passed >= limit:
            return False
        self.passed += 1
        return True


class _Peers(cachetools.LRUCache[str, _Budget]):
    """The budgets of the ``maxsize`` peers that logged last; ``forgotten``: lines dropped of
    peers whose budgets were evicted before a line of theirs said so."""

    def __init__(self, maxsize: int) -> None:
        super().__init__(maxsize)
        self.forgotten = 0

    def popitem(self) -> tuple[str, _Budget]:
        """Evict the least recently used budget, keeping its unsaid drops in ``forgotten``."""
        peer, budget = super().popitem()
        self.forgotten += budget.dropped
        return peer, budget


class LibraryLogBound(logging.Filter):
    """A handler's filter: lines of ``PEER_DRIVEN_LOGGERS`` pass at most ``per_minute`` a
    minute for each peer (``peers.current()``, ``<namespace>/<server>``; the lines logged
    serving no peer share one such budget), at most ``ceiling`` a minute in all, each cut to
    ``chars`` characters with its exception's type and text in place of a traceback and the
    peer named; every other line passes as it is. At most ``max_peers`` peers' budgets are
    kept (least recently used first out). The next line passed for a peer (or for none) says
    how many of its lines were dropped, by its budget or by the ceiling."""

    def __init__(
        self,
        *,
        per_minute: int = LIBRARY_LINES_PER_MINUTE,
        ceiling: int = LIBRARY_LINES_CEILING,
        max_peers: int = LIBRARY_PEERS,
        chars: int = LIBRARY_LINE_CHARS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.per_minute = per_minute
        self.ceiling = ceiling
        self.chars = chars
        self.clock = clock
        self._peers = _Peers(max_peers)
        self._unattributed = _Budget()
        self._all = _Budget()

    @property
    def tracked(self) -> int:
        """Peers whose budgets are kept now (at most ``max_peers``)."""
        return len(self._peers)

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` is written (cut, and its peer named, when it is one of the
        libraries')."""
        if not _peer_driven(record.name):
            return True
        peer = peers.current()
        budget = self._budget_of(peer)
        minute = int(self.clock() // 60)
        if not (budget.spend(minute, self.per_minute) and self._all.spend(minute, self.ceiling)):
            budget.dropped += 1
            return False
        text = self._cut(record) + self._notes(peer, budget)
        record.msg, record.args, record.exc_info, record.exc_text = text, (), None, None
        return True

    def _budget_of(self, peer: str | None) -> _Budget:
        if peer is None:
            return self._unattributed
        budget = self._peers.get(peer)
        if budget is None:
            budget = self._peers[peer] = _Budget()
        return budget

    def _cut(self, record: logging.LogRecord) -> str:
        """The record's line, its exception's type and text in it, on one line (its line
        breaks written ``\\n``: a peer's words never start a line of their own), cut to
        ``chars``."""
        text = record.getMessage()
        error = record.exc_info[1] if record.exc_info else None
        if error is not None:
            text = f"{text} ({type(error).__name__}: {error})"
        # the process's secrets out before the cut: one it split would no longer be found whole
        text = display.KNOWN.redact(text)
        text = "\\n".join(text.splitlines())
        if len(text) > self.chars:
            text = text[: self.chars - 1] + "…"
        return text

    def _notes(self, peer: str | None, budget: _Budget) -> str:
        """What a passed line says after its text: its peer, and the drops not yet said (its
        budget's; a forgotten peer's), which it resets."""
        notes = [] if peer is None else [f"[peer {peer}]"]
        if budget.dropped:
            whose = PEER_DRIVEN_LOGGERS if peer is None else f"peer {peer}"
            notes.append(f"[{budget.dropped} earlier line(s) of {whose} dropped]")
            budget.dropped = 0
        if self._peers.forgotten:
            notes.append(f"[{self._peers.forgotten} line(s) of peers no longer tracked dropped]")
            self._peers.forgotten = 0
        return "".join(f" {note}" for note in notes)


def _peer_driven(logger: str) -> bool:
    """Whether ``logger`` is one of ``PEER_DRIVEN_LOGGERS`` or a child of one."""
    return logger in PEER_DRIVEN_LOGGERS or logger.startswith(_PEER_DRIVEN_PARENTS)


_PEER_DRIVEN_PARENTS = tuple(f"{name}." for name in PEER_DRIVEN_LOGGERS)


class RedactingFilter(logging.Filter):
    """A handler's filter that takes ``display.KNOWN``'s secrets (every Secret value this
    process read out) out of every record it writes: its message and its traceback (an
    exception's text, its causes' included). ``start`` gives it to every handler of every
    process, after ``LibraryLogBound`` (which redacts before it cuts)."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite ``record`` redacted; always keeps it."""
        message = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        record.msg, record.args = display.KNOWN.redact(message), None
        if record.exc_text:
            record.exc_text = display.KNOWN.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = display.KNOWN.redact(record.stack_info)
        record.exc_info = None
        return True


def quiet_libraries() -> None:
    """Keep ``QUIET_LOGGERS`` at WARNING, whatever the process's log level."""
    for noisy in QUIET_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.WARNING)


def bound_library_logs(handler: logging.Handler) -> None:
    """Give ``handler`` the ``LibraryLogBound`` filter, then the ``RedactingFilter`` (what
    ``start`` gives every handler of the root logger)."""
    handler.addFilter(LibraryLogBound())
    handler.addFilter(RedactingFilter())  # every process may read a tenant's Secret


def start(settings_type: type[S], *, service: str) -> S:
    """Read the settings, set up logging, tracing (``service`` names the OpenTelemetry
    resource), the metrics port and the garbage collector (``collector.settle``); returns the
    settings.

    Raises ``pydantic.ValidationError`` when an ``AGENTRUN_*`` variable is malformed, and
    ``OSError`` when the metrics port cannot be bound.
    """
    settings = settings_type()
    logging.basicConfig(
        level=settings.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    quiet_libraries()
    for handler in logging.getLogger().handlers:
        bound_library_logs(handler)
    telemetry.setup_tracing(service)
    if settings.metrics_port:
        start_http_server(settings.metrics_port, addr=settings.metrics_addr)
    collector.settle()
    return settings


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to its end on a new uvloop event loop (libuv's, a drop-in asyncio loop:
    less CPU per socket read, write and callback than the standard one; kopf picks it too when
    it is installed) and return its result; what ``main`` raises propagates."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def stop_on_signals(stop: Callable[[], None]) -> None:
    """Call ``stop`` on SIGTERM or SIGINT (from inside the running event loop)."""
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop)
