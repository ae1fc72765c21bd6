"""Prometheus for tests: the pinned binaries, started servers, and a metrics endpoint helper.

A pytest plugin module. Wire it from the root ``tests/conftest.py`` with
``pytest_plugins = ["prometheus_support"]`` (``tests/`` is on ``sys.path`` there); until then
``tests/conftest.py`` registers it (``pytest_plugins``). It provides:

- `pytest_collection_finish`: builds or locates prometheus and promtool (once per machine,
  cached; see `agentrun_dev.prometheus`) right after collection when a selected test uses
  one of `PROMETHEUS_FIXTURES`, with progress on the terminal and outside per-test timeouts.
- `prometheus_binaries` (session): ``PrometheusBinaries(prometheus, promtool)``.
- `prometheus_factory` (function): a `PrometheusStarter`,
  ``start(targets, rule_files=(), …) -> PrometheusServer``; every server it started is stopped
  by pid when the test ends.
- `serve_metrics(registry)`: a context manager serving a ``prometheus_client`` registry on
  ``127.0.0.1:<free port>/metrics`` from a thread of the test process.

Processes log to the session's `devenv_launch` directory and die with pytest.
"""

from __future__ import annotations

import contextlib
import socketserver
import threading
import wsgiref.simple_server
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import prometheus_client
import pytest

from agentrun_dev import components, prometheus

PROMETHEUS_FIXTURES = frozenset({"prometheus_binaries", "prometheus_factory"})
"""Fixtures whose use makes `pytest_collection_finish` build the binaries up front."""


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build or locate prometheus and promtool before the first test that needs them."""
    if not any(
        PROMETHEUS_FIXTURES & set(getattr(item, "fixturenames", ())) for item in session.items
    ):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")

    def show(line: str) -> None:
        if reporter is not None:
            reporter.write_line(f"agentrun prometheus: {line}")

    prometheus.ensure_prometheus(log=show)


class PrometheusStarter:
    """Starts Prometheus servers for one fixture scope and stops them all at its end."""

    def __init__(
        self,
        *,
        binaries: prometheus.PrometheusBinaries,
        launch: components.Launch,
        tmp_path_factory: pytest.TempPathFactory,
    ) -> None:
        self._binaries = binaries
        self._launch = launch
        self._tmp = tmp_path_factory
        self.servers: list[prometheus.PrometheusServer] = []
        """Every server started so far, oldest first."""

    def __call__(
        self,
        targets: Mapping[str, Sequence[str]],
        rule_files: Sequence[Path] = (),
        **options: Any,
    ) -> prometheus.PrometheusServer:
        """Start one server; see `agentrun_dev.prometheus.start_prometheus`.

        `targets` is job name → ``["127.0.0.1:port", …]``; `options` are passed on
        (``scrape_interval``, ``evaluation_interval``, ``ready_timeout``). Its workdir is a
        fresh pytest temp dir. Raises like `start_prometheus`.
        """
        server = prometheus.start_prometheus(
            self._tmp.mktemp("prometheus"),
            targets=targets,
            rule_files=rule_files,
            prometheus_binaries=self._binaries,
            launch=self._launch,
            **options,
        )
        self.servers.append(server)
        return server

    def stop_all(self) -> None:
        """Stop every server started, newest first (by pid; already stopped ones are fine)."""
        while self.servers:
            self.servers.pop().stop()


@pytest.fixture(scope="session")
def prometheus_binaries() -> prometheus.PrometheusBinaries:
    """prometheus and promtool (already built or located after collection)."""
    return prometheus.ensure_prometheus(log=print)


@pytest.fixture
def prometheus_factory(
    prometheus_binaries: prometheus.PrometheusBinaries,
    devenv_launch: components.Launch,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PrometheusStarter]:
    """Start Prometheus servers in a test; they are stopped when the test ends."""
    starter = PrometheusStarter(
        binaries=prometheus_binaries, launch=devenv_launch, tmp_path_factory=tmp_path_factory
    )
    try:
        yield starter
    finally:
        starter.stop_all()


class _QuietHandler(wsgiref.simple_server.WSGIRequestHandler):
    """No access log on stderr for every scrape."""

    def log_message(self, format: str, *args: Any) -> None:
        del format, args


@contextlib.contextmanager
def serve_metrics(
    registry: prometheus_client.CollectorRegistry = prometheus_client.REGISTRY,
) -> Iterator[str]:
    """Serve `registry` at ``http://127.0.0.1:<free port>/metrics`` from a daemon thread.

    Yields the scrape address ``"127.0.0.1:<port>"`` (what Prometheus' static targets take);
    the server is shut down and its socket closed on exit.
    """
    app = prometheus_client.make_wsgi_app(registry)
    server = wsgiref.simple_server.make_server(
        "127.0.0.1", 0, app, server_class=_ThreadingWSGIServer, handler_class=_QuietHandler
    )
    thread = threading.Thread(target=server.serve_forever, name="serve-metrics", daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class _ThreadingWSGIServer(socketserver.ThreadingMixIn, wsgiref.simple_server.WSGIServer):
    """One thread per request, so a slow scrape never blocks the next."""

    daemon_threads = True
