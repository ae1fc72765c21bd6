"""Process start-up shared by ``agentrun-operator`` and ``agentrun-worker``.

What belongs here: reading the process's settings from the environment, logging, tracing, the
Prometheus metrics port, and stop signals — the same for both kinds of process. What does not:
what a process then serves (``operator.main``, ``worker.main``).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import uvloop
from prometheus_client import start_http_server

from agentrun import telemetry
from agentrun.settings import ProcessSettings

S = TypeVar("S", bound=ProcessSettings)
T = TypeVar("T")

QUIET_LOGGERS = ("httpx", "httpx2", "openai", "kopf.objects")
"""Libraries that log every request (the clients) or every handler call of every object
(kopf: "Handler 'run_seen' succeeded." per watch event) at INFO: kept at WARNING, so their
failures and retries still show."""
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
PEER_DRIVEN_LOGGERS = ("mcp",)
"""Libraries (and their child loggers) that log a line for what a tenant's peer sends, one per
message: the MCP SDK warns of each event of an unknown type (naming it), logs each message it
cannot parse or validate with a traceback, and each reconnection of a stream. A tool server
answering one call with 2,000 such events wrote 2,000 lines, 10 MB."""
LIBRARY_LINES_PER_MINUTE = 60
"""Lines of ``PEER_DRIVEN_LOGGERS`` a process writes a minute at most, all of them together
(the next one written says how many were dropped)."""
LIBRARY_LINE_CHARS = 1_000
"""Characters of one such line kept (its exception's type and text in it, not a traceback)."""
YOUNG_COLLECTION_THRESHOLD = 5_000
"""Allocations of container objects (net of those freed) between two collections of the
cyclic garbage collector's youngest generation; CPython's default is 700. Each AgentRun
object, watch event and API answer a process decodes is a few hundred dicts and lists, so at
700 the operator collected about once per run admitted, and every tenth of those collected the
middle generation too (see ``settle_collector``)."""


class LibraryLogBound(logging.Filter):
    """A handler's filter: lines of ``PEER_DRIVEN_LOGGERS`` pass at most ``per_minute`` a
    minute, each cut to ``chars`` characters with its exception's type and text in place of a
    traceback; every other line passes as it is."""

    def __init__(
        self,
        *,
        per_minute: int = LIBRARY_LINES_PER_MINUTE,
        chars: int = LIBRARY_LINE_CHARS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.per_minute = per_minute
        self.chars = chars
        self.clock = clock
        self._minute = -1
        self._passed = 0
        self._dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` is written (cut to ``chars`` when it is one of the libraries')."""
        if not record.name.startswith(PEER_DRIVEN_LOGGERS):
            return True
        minute = int(self.clock() // 60)
        if minute != self._minute:
            self._minute, self._passed = minute, 0
        if self._passed >= self.per_minute:
            self._dropped += 1
            return False
        self._passed += 1
        text = record.getMessage()
        error = record.exc_info[1] if record.exc_info else None
        if error is not None:
            text = f"{text} ({type(error).__name__}: {error})"
        if len(text) > self.chars:
            text = text[: self.chars - 1] + "…"
        if self._dropped:
            text += f" [{self._dropped} earlier line(s) of {PEER_DRIVEN_LOGGERS} dropped]"
            self._dropped = 0
        record.msg, record.args, record.exc_info, record.exc_text = text, (), None, None
        return True


def bound_library_logs(handler: logging.Handler) -> None:
    """Give ``handler`` the ``LibraryLogBound`` filter."""
    handler.addFilter(LibraryLogBound())


def start(settings_type: type[S], *, service: str) -> S:
    """Read the settings, set up logging, tracing (``service`` names the OpenTelemetry
    resource) and the metrics port; returns the settings.

    Raises ``pydantic.ValidationError`` when an ``AGENTRUN_*`` variable is malformed, and
    ``OSError`` when the metrics port cannot be bound.
    """
    settings = settings_type()
    logging.basicConfig(
        level=settings.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in QUIET_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.WARNING)
    for handler in logging.getLogger().handlers:
        bound_library_logs(handler)
    telemetry.setup_tracing(service)
    if settings.metrics_port:
        start_http_server(settings.metrics_port, addr=settings.metrics_addr)
    settle_collector()
    return settings


def settle_collector() -> None:
    """Collect once, then freeze what is left (the imported modules: kopf, the Kubernetes and
    ``openai`` clients' model classes, pydantic's validators; about 130,000 tracked objects
    in the operator, 150,000 in a worker) into the collector's permanent generation, and
    collect the youngest generation every ``YOUNG_COLLECTION_THRESHOLD`` allocations.

    Without it every whole-heap collection walked those objects again, and a young one ran
    about once per run admitted: during a bulk admission the operator spent 0.8 ms of CPU a
    run in the collector, 0.3 ms with it (bench/README.md, "The garbage collector's share").
    Frozen objects are still freed by reference counting; a
    cycle among them would stay, which for module-level objects is what happens anyway.
    ``gc.freeze`` and ``gc.set_threshold`` are CPython's (the ``gc`` module's documentation)."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, middle, oldest)


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
