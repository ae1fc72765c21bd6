"""Process start-up shared by ``agentrun-operator`` and ``agentrun-worker``.

What belongs here: reading the process's settings from the environment, logging, tracing, the
Prometheus metrics port, and stop signals — the same for both kinds of process. What does not:
what a process then serves (``operator.main``, ``worker.main``).
"""

from __future__ import annotations

import asyncio
import logging
import signal
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
    telemetry.setup_tracing(service)
    if settings.metrics_port:
        start_http_server(settings.metrics_port, addr=settings.metrics_addr)
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
