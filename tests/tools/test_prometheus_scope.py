"""`prometheus_query` reads the run's own namespace only, proven against the real Prometheus the
suite builds: queries for another namespace's series are refused before they are sent — plain,
by regex, through vector matching, subqueries, ``or``, ``{__name__=~".+"}``, ``info()`` — and
every query the check lets through reads nothing else, as Prometheus' own parser sees it
(``/api/v1/parse_query``): strings with escapes, raw strings and comments included."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import prometheus_client
import promql_support
import pytest
from prometheus_support import PrometheusStarter, serve_metrics

from agentrun.kernel import ToolFault
from agentrun.tools import PrometheusQuery, ToolContext, ToolError
from agentrun.tools import prometheus_query as pq
from agentrun_dev import components
from agentrun_dev.prometheus import PrometheusBinaries, PrometheusServer

OURS = ToolContext(namespace="team-a", run_name="run", run_uid="uid", call_id="c1")
SCOPED = 'namespace="team-a"'

REFUSED = {
    "no matcher": "app_requests_total",
    "another namespace": 'app_requests_total{namespace="team-b"}',
    "a regex over namespaces": 'app_requests_total{namespace=~"team-.*"}',
    "not-equal": 'app_requests_total{namespace!="team-a"}',
    "every series by name": '{__name__=~".+"}',
    "vector matching to another selector": (
        f"app_requests_total{{{SCOPED}}} / on() group_left() secret_gauge"
    ),
    "set operator": f"app_requests_total{{{SCOPED}}} or secret_gauge",
    "subquery": "max_over_time(secret_gauge[5m:10s])",
    "offset": "count(secret_gauge offset 1m)",
    "label_replace to look like ours": (
        'label_replace(secret_gauge, "namespace", "team-a", "", "")'
    ),
    "or between matchers": 'app_requests_total{namespace="team-a" or namespace="team-b"}',
    "info joins target_info": f"info(app_requests_total{{{SCOPED}}})",
    "absent of another namespace": 'absent(secret_gauge{namespace="team-b"})',
    "aggregation over everything": 'sum by (namespace) ({__name__=~"secret.*"})',
    "not PromQL the parser reads": f"app_requests_total{{{SCOPED}",
    # a raw string has no escapes: a lexer reading \` as one would see a single selector
    "raw strings do not escape": (
        f"app_requests_total{{{SCOPED}, x!=`\\`}} or secret_gauge or {{a=`\\`}}"
    ),
}

ALLOWED = {
    "plain": f"app_requests_total{{{SCOPED}}}",
    "every series of ours": f'{{__name__=~".+", {SCOPED}}}',
    "ours, whatever else matches": f'secret_gauge{{{SCOPED}, namespace=~".*"}}',
    "a rate in a subquery": f"max_over_time(rate(app_requests_total{{{SCOPED}}}[1m])[2m:10s])",
    "vector matching between ours": (
        f"app_requests_total{{{SCOPED}}} / on(namespace) group_left() secret_gauge{{{SCOPED}}}"
    ),
    "no selector at all": "scalar(vector(2) * 20)",
    # lexing traps: each must be one selector to Prometheus too, not a string hiding another
    "escaped quote in a value": (
        f'app_requests_total{{{SCOPED}, x!="\\"}} or secret_gauge or {{a=\\""}}'
    ),
    "unicode-escaped quote": (
        f'app_requests_total{{{SCOPED}, x!="\\u0022}} or secret_gauge or {{a=\\u0022"}}'
    ),
    "single quotes": f"app_requests_total{{{SCOPED}, x!='\\'}} or secret_gauge or {{a=\\''}}",
    "a comment": f"app_requests_total{{{SCOPED}}} # or secret_gauge\n",
}


def ask(tool: PrometheusQuery, query: str) -> str:
    return asyncio.run(tool.run({"query": query}, OURS))


@pytest.fixture(scope="module")
def server(
    prometheus_binaries: PrometheusBinaries,
    devenv_launch: components.Launch,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PrometheusServer]:
    """Prometheus scraping two namespaces' series: ours (team-a) and another's (team-b)."""
    starter = PrometheusStarter(
        binaries=prometheus_binaries, launch=devenv_launch, tmp_path_factory=tmp_path_factory
    )
    registry = prometheus_client.CollectorRegistry()
    requests = prometheus_client.Counter(
        "app_requests", "requests", ["namespace"], registry=registry
    )
    secret = prometheus_client.Gauge("secret_gauge", "theirs", ["namespace"], registry=registry)
    requests.labels(namespace="team-a").inc(3)
    requests.labels(namespace="team-b").inc(5)
    secret.labels(namespace="team-a").set(1)
    secret.labels(namespace="team-b").set(42)
    try:
        with serve_metrics(registry) as address:
            started = starter({"apps": [address]}, scrape_interval="1s")
            started.wait_for_targets_up(timeout=30)
            time.sleep(2)
            yield started
    finally:
        starter.stop_all()


@pytest.mark.parametrize("query", REFUSED.values(), ids=REFUSED.keys())
def test_a_query_reaching_past_the_runs_namespace_is_refused(
    server: PrometheusServer, query: str
) -> None:
    assert server.query('secret_gauge{namespace="team-b"}')  # theirs exists to be read
    with pytest.raises(ToolError) as caught:
        ask(PrometheusQuery(server.url), query)
    assert caught.value.fault is ToolFault.DOMAIN  # the model's to correct
    assert "team-b" not in caught.value.message.replace(query, "") or "team-b" in query
    assert "42" not in caught.value.message


@pytest.mark.parametrize("query", ALLOWED.values(), ids=ALLOWED.keys())
def test_what_the_check_lets_through_reads_the_runs_namespace_only(
    server: PrometheusServer, query: str
) -> None:
    pq.check_scope(query, label="namespace", value="team-a")
    tree = server.parse(query)  # Prometheus' own reading of the very same text
    for selector in promql_support.selectors(tree):
        assert promql_support.Matcher("namespace", "=", "team-a") in selector.matchers, (
            query,
            selector,
        )
    answer = ask(PrometheusQuery(server.url), query)
    assert "team-b" not in answer and " 42" not in answer, answer


def test_the_runs_own_series_are_answered(server: PrometheusServer) -> None:
    answer = ask(PrometheusQuery(server.url), f'{{__name__=~"secret.*", {SCOPED}}}')
    assert answer.splitlines()[0] == "vector: 1 series"
    assert 'namespace="team-a"' in answer


def test_the_scope_label_is_the_platforms_choice(server: PrometheusServer) -> None:
    tool = PrometheusQuery(server.url, scope_label="kubernetes_namespace")
    with pytest.raises(ToolError, match='kubernetes_namespace="team-a"'):
        ask(tool, f"app_requests_total{{{SCOPED}}}")
