"""`prometheus_query` against the real Prometheus the suite builds: instant and range queries,
series capped and summarised, Prometheus' own errors as the model's, a server that is down."""

from __future__ import annotations

import asyncio
import time

import prometheus_client
import pytest
from prometheus_support import PrometheusStarter, serve_metrics

from agentrun.kernel import ToolFault
from agentrun.tools import PrometheusQuery, ToolContext, ToolError
from agentrun.tools import prometheus_query as pq

CTX = ToolContext(namespace="ns", run_name="run", run_uid="uid", call_id="c1")


def ask(tool: PrometheusQuery, **arguments: str) -> str:
    return asyncio.run(tool.run(arguments, CTX))


def test_instant_and_range_queries_are_summarised_and_capped(
    prometheus_factory: PrometheusStarter,
) -> None:
    registry = prometheus_client.CollectorRegistry()
    queue = prometheus_client.Gauge(
        "demo_queue_depth", "depth", ["shard", "namespace"], registry=registry
    )
    for shard in range(30):
        queue.labels(shard=f"s{shard:02d}", namespace="ns").set(shard)
    with serve_metrics(registry) as address:
        server = prometheus_factory({"demo": [address]}, scrape_interval="1s")
        server.wait_for_targets_up(timeout=30)
        time.sleep(3)  # a few scrapes for the range query
        tool = PrometheusQuery(server.url)
        instant = ask(tool, query='demo_queue_depth{namespace="ns"}')
        total = ask(tool, query='sum(demo_queue_depth{namespace="ns"})')
        ranged = ask(
            tool, query='demo_queue_depth{shard="s07", namespace="ns"}', range="1m", step="1s"
        )
        scalar = ask(tool, query="scalar(vector(2) * 21)")
    lines = instant.splitlines()
    assert lines[0] == f"vector: 30 series, showing {pq.MAX_SERIES}"
    assert lines[1].startswith('demo_queue_depth{instance="') and lines[1].endswith(" 29")
    assert 'shard="s29"' in lines[1]  # largest first
    assert lines[-1] == f"... {30 - pq.MAX_SERIES} more series not shown"
    assert total.splitlines() == ["vector: 1 series", "{} 435"]
    (head, series) = ranged.splitlines()
    assert head == "matrix: 1 series"
    assert "min=7 max=7 avg=7 last=7@" in series and "points=" in series
    assert scalar == "scalar: 42"


def test_invalid_promql_is_the_models_error_with_prometheus_message(
    prometheus_factory: PrometheusStarter,
) -> None:
    server = prometheus_factory({})
    with pytest.raises(ToolError) as caught:  # an experimental function, off by default
        query = 'double_exponential_smoothing(x{namespace="ns"}[5m], 0.5, 0.5)'
        ask(PrometheusQuery(server.url), query=query)
    assert caught.value.fault is ToolFault.DOMAIN
    assert "bad_data" in caught.value.message and "parse error" in caught.value.message
    with pytest.raises(ToolError) as unread:  # what the scope check cannot read is not sent
        ask(PrometheusQuery(server.url), query="sum(rate(x[5m])")
    assert unread.value.fault is ToolFault.DOMAIN
    assert "cannot be checked: unclosed left parenthesis" in unread.value.message


def test_a_prometheus_that_is_down_or_not_configured_is_infrastructure() -> None:
    with pytest.raises(ToolError) as down:
        ask(PrometheusQuery("http://127.0.0.1:1"), query='up{namespace="ns"}')
    assert down.value.fault is ToolFault.CONNECTION
    with pytest.raises(ToolError) as unset:
        ask(PrometheusQuery(None), query="up")
    assert unset.value.fault.infrastructure and "AGENTRUN_PROMETHEUS_URL" in unset.value.message


def test_an_empty_result_says_so() -> None:
    assert pq.summarize({"resultType": "vector", "result": []}) == "vector: no series matched"
