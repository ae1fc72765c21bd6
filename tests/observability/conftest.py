"""A PromQL parser for the dashboard and rule tests: one real Prometheus per session.

`parse` reads an expression with Prometheus' own parser (``/api/v1/parse_query`` of a server
that scrapes nothing) and returns its syntax tree; an invalid expression raises
``PrometheusAPIError`` with the parser's message, which fails the test that asked.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_support import PrometheusStarter
from promql_support import Parse

from agentrun_dev import components, prometheus


@pytest.fixture(scope="session")
def parser_server(
    prometheus_binaries: prometheus.PrometheusBinaries,
    devenv_launch: components.Launch,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[prometheus.PrometheusServer]:
    """A Prometheus with no targets, only for its parser; stopped at session end."""
    starter = PrometheusStarter(
        binaries=prometheus_binaries, launch=devenv_launch, tmp_path_factory=tmp_path_factory
    )
    try:
        yield starter(targets={})
    finally:
        starter.stop_all()


@pytest.fixture(scope="session")
def parse(parser_server: prometheus.PrometheusServer) -> Parse:
    """``parse(expr) -> tree``: Prometheus' syntax tree of `expr` (cached per expression)."""
    trees: dict[str, dict[str, Any]] = {}

    def parse_once(expr: str) -> dict[str, Any]:
        if expr not in trees:
            trees[expr] = parser_server.parse(expr)
        return trees[expr]

    return parse_once
