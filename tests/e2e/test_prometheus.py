"""The Grafana dashboard and the alert rules, proven against a real Prometheus scraping the
operator and both workers while runs of every kind go through the stack: every panel query and
every operand of every alert condition returns data (an ``absent(x)`` operand returns none,
and ``x`` does), and the operator-only gauges come from the leading operator alone."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_support as promql
import pytest
import yaml

from agentrun_dev import prometheus
from agentrun_dev.kubectl import create_namespace, delete_namespace

from .conftest import E2EStack, http_get, run_manifest

pytestmark = pytest.mark.e2e

CHART = Path(__file__).resolve().parents[2] / "charts" / "agentrun"
DASHBOARD = CHART / "dashboards" / "agentrun.json"
RULES = CHART / "alerts" / "agentrun.rules.yaml"

RUNS: list[tuple[str, str, dict[str, Any]]] = [
    ("ok", "E2E-PARALLEL-ORDER: observed", {}),
    ("stuck", "E2E-STUCK observed", {}),
    ("broken", "E2E-500 observed", {}),
    ("failing-tool", "E2E-BROKEN-TOOL observed", {}),
    ("malformed", "E2E-MALFORMED observed", {}),
]


def instantiated(query: promql.Query) -> str:
    return promql.instantiate(query.expr, rate_interval="1m", interval="15s", time_range="10m")


@pytest.fixture
def queued_tenant(stack_: E2EStack) -> Iterator[str]:
    """A namespace whose AgentTenant allows one run at a time (for a Queued run)."""
    namespace = create_namespace(stack_.kubectl)
    tenant = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentTenant",
        "metadata": {"name": f"one-{namespace}"},
        "spec": {
            "namespaces": [namespace],
            "maxConcurrentRuns": 1,
            "budget": {"tokens": 1_000_000, "costUSD": "10", "wallClockSeconds": 36_000},
        },
    }
    stack_.kubectl("apply", "-f", "-", input=yaml.safe_dump(tenant))
    yield namespace
    stack_.kubectl("delete", "agentruns", "--all", "-n", namespace, "--wait=false")
    stack_.kubectl("delete", "agenttenant", f"one-{namespace}", "--wait=false")
    delete_namespace(stack_.kubectl, namespace)


def test_every_dashboard_and_alert_expression_has_data_from_real_runs(
    stack_: E2EStack,
    test_namespace: str,
    queued_tenant: str,
    prometheus_factory: Any,
    prometheus_binaries: prometheus.PrometheusBinaries,
) -> None:
    ports = {
        "agentrun-operator": [f"127.0.0.1:{stack_.operator.ports['metrics']}"],
        "agentrun-worker": [f"127.0.0.1:{w.ports['metrics']}" for w in stack_.workers],
    }
    server = prometheus_factory(targets=ports, rule_files=[RULES])
    server.wait_for_targets_up(30)
    for name, goal, spec in RUNS:
        stack_.apply(test_namespace, run_manifest(name, goal, **spec))
    stack_.apply(test_namespace, run_manifest("running", "E2E-SLOW-MODEL observed"))
    stack_.apply(
        test_namespace,
        run_manifest("waiting", "E2E-APPROVAL observed", approval={"tools": ["calculate"]}),
    )
    approval = {"tools": ["calculate"]}
    stack_.apply(queued_tenant, run_manifest("holder", "E2E-APPROVAL observed", approval=approval))
    stack_.wait_for(queued_tenant, "holder", lambda s: s.get("phase") == "AwaitingApproval")
    stack_.apply(queued_tenant, run_manifest("queued", "E2E-PARALLEL-ORDER: observed"))
    for name, _, _ in RUNS:
        stack_.wait_terminal(test_namespace, name, timeout=90)
    stack_.wait_for(test_namespace, "waiting", lambda s: s.get("phase") == "AwaitingApproval")
    stack_.wait_for(queued_tenant, "queued", lambda s: s.get("phase") == "Queued")
    # the data arrives with the next scrapes (1 s apart), rule evaluations and a refresh of the
    # operator's phase gauges: poll until every expression has data, with room for a loaded
    # machine, then check everything on that state
    deadline = time.monotonic() + 60
    while (missing := expressions_without_data(server)) and time.monotonic() < deadline:
        time.sleep(1.0)
    assert missing == {}, "expressions without data:\n" + "\n".join(
        f"{k}: {v}" for k, v in missing.items()
    )

    for job, targets in ports.items():  # promtool lints every exposition we serve
        for target in targets:
            clean, output = prometheus.promtool_check_metrics(
                prometheus_binaries.promtool, http_get(f"http://{target}/metrics")
            )
            assert clean, f"{job} {target}: {output}"
    clean, output = prometheus.promtool_check_rules(prometheus_binaries.promtool, RULES)
    assert clean, output
    groups = server.rules()
    assert all(rule.get("health") == "ok" for group in groups for rule in group["rules"])

    assert_operator_only_gauges(server)


def assert_operator_only_gauges(server: prometheus.PrometheusServer) -> None:
    """A worker must report neither an empty queue nor a leader: only the operator exports
    these, and the (only) operator leads."""
    for name, value in (("agentrun_turns_pending", None), ("agentrun_operator_leader", 1.0)):
        exporters = server.query(f"count by (job) ({name})")
        assert [sample["metric"]["job"] for sample in exporters] == ["agentrun-operator"], name
        if value is not None:
            assert [float(s["value"][1]) for s in server.query(name)] == [value], name


def expressions_without_data(server: prometheus.PrometheusServer) -> dict[str, str]:
    """Every panel query, and every operand of every alert condition, that returns nothing
    (what it is → the PromQL asked). ``absent(x)`` must return nothing, and ``x`` data: an
    ``absent(x)`` that returns data is listed too."""
    dashboard = yaml.safe_load(DASHBOARD.read_text())
    missing: dict[str, str] = {}
    for query in promql.dashboard_queries(dashboard):
        expr = instantiated(query)
        if not server.query(expr):
            missing[f"panel {query.title!r} {query.ref_id}"] = expr
    for query in promql.rule_queries(yaml.safe_load(RULES.read_text())):
        for operand in promql.condition_operands(server.parse(instantiated(query))):
            if operand["type"] == "call" and operand["func"]["name"] == "absent":
                if server.query(promql.render(operand)):  # absent(x) has data: x has none
                    missing[f"alert {query.title} (absent)"] = promql.render(operand)
                operand = operand["args"][0]
            text = promql.render(operand)
            if not server.query(text):
                missing[f"alert {query.title}"] = text
    return missing
