"""The chart's Grafana dashboard and Prometheus alert rules, checked without a cluster.

- The dashboard parses, has the panels platform operators need (budget headroom on used +
  reserved near the top, model-call failures, wait times), a ``${datasource}``, a
  ``namespace`` (install) and a ``tenant`` variable; every target is well formed, filters by
  ``namespace=~"$namespace"``, by ``tenant=~"$tenant"`` where its metric has a tenant label
  and uses ``$__rate_interval`` (``$__range`` for totals); tokens are not stacked on their
  cached part; ``partial`` outcomes are coloured apart from ``ok``.
- Every metric an expression reads is a contract name (this file's tables, the list in
  ``docs/architecture.md``) and is exported by `agentrun.metrics`.
- Every expression, instantiated, is valid PromQL: Prometheus' own parser reads it (the
  ``parse`` fixture: a real server's ``/api/v1/parse_query``), and ``promtool check rules``
  accepts it. What an expression reads (selectors, matchers, ranges, an alert's operands) is
  taken from that parser's syntax tree.
- The rule file: every alert has expr, for, a severity, summary/description and a
  ``runbook_url`` naming its runbook in ``docs/runbooks/``, aggregates by ``namespace``, and
  annotations only use labels its expression keeps; the alerts fire (and do not) on
  synthetic series (``promtool test rules``): ratios, not counts, and absences.
- The helpers of ``promql_support`` that the e2e suite relies on.

Evaluating the expressions against a real Prometheus scraping a real run is the e2e suite's.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import promql_support as promql
import pytest
import yaml

from agentrun_dev.prometheus import PrometheusAPIError

Parse = promql.Parse

REPO = Path(__file__).resolve().parents[2]
DASHBOARD_FILE = REPO / "charts" / "agentrun" / "dashboards" / "agentrun.json"
RULES_FILE = REPO / "charts" / "agentrun" / "alerts" / "agentrun.rules.yaml"

GENAI_TOKEN_USAGE = "gen_ai_client_token_usage"
"""Prometheus name of OTel ``gen_ai.client.token.usage`` (dashboard constant of that name)."""
GENAI_OPERATION_DURATION = "gen_ai_client_operation_duration_seconds"
"""Prometheus name of OTel ``gen_ai.client.operation.duration`` (dashboard constant too)."""

COUNTERS = {
    "agentrun_model_calls_total",
    "agentrun_model_call_errors_total",
    "agentrun_runs_total",
    "agentrun_turns_total",
    "agentrun_tool_calls_total",
    "agentrun_corrections_total",
    "agentrun_tokens_total",
    "agentrun_cost_usd_total",
}
GAUGES = {
    "agentrun_tenant_budget_limit",
    "agentrun_tenant_budget_used",
    "agentrun_tenant_budget_reserved",
    "agentrun_tenant_info",
    "agentrun_operator_leader",
    # Not `agentrun_runs`: prometheus-client cannot export a gauge of that name beside the
    # counter agentrun_runs_total (one metric family in OpenMetrics).
    "agentrun_runs_in_phase",
    "agentrun_turns_pending",
    "agentrun_worker_turns_in_flight",
    "agentrun_worker_concurrency",
    "agentrun_crd_mismatch",
    "agentrun_jetstream_store_limit_bytes",
    "agentrun_jetstream_stream_bytes",
    "agentrun_jetstream_stream_messages",
    "agentrun_jetstream_consumer_pending",
    "agentrun_jetstream_consumer_ack_pending",
    "agentrun_approval_oldest_request_timestamp_seconds",
}
HISTOGRAMS = {
    "agentrun_turn_duration_seconds",
    "agentrun_turn_queue_wait_seconds",
    "agentrun_run_admission_wait_seconds",
    "agentrun_dispatch_latency_seconds",
    GENAI_TOKEN_USAGE,
    GENAI_OPERATION_DURATION,
}
PROMETHEUS_MADE = {"up"}
"""Series Prometheus writes itself (``up`` per scrape target)."""
INSTALL_COUNTERS = {"agentrun_messages_refused_total", "agentrun_turns_undelivered_total"}
"""Counters of the install as a whole (no ``tenant`` label)."""
KNOWN_METRICS = (
    COUNTERS
    | INSTALL_COUNTERS
    | GAUGES
    | PROMETHEUS_MADE
    | {name + suffix for name in HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")}
)
"""Every series name an expression may read."""
TENANT_LABELLED = COUNTERS | {
    "agentrun_tenant_budget_limit",
    "agentrun_tenant_budget_used",
    "agentrun_tenant_budget_reserved",
    "agentrun_tenant_info",
    "agentrun_runs_in_phase",
    "agentrun_run_admission_wait_seconds_bucket",
}
"""Metrics with a ``tenant`` label: dashboard selectors of these must filter by it."""

REQUIRED_PANELS = {
    "Operator leader",
    "Workers up",
    "Tenant budget used + reserved vs limit",
    "Tenant budget left",
    "Tenant budget burn rate per hour",
    "Time to budget exhaustion",
    "Run admission wait (p50 / p99)",
    "TurnRequest queue wait (p50 / p99)",
    "Model call failures by model and error type",
    "Model call failure ratio by model",
    "Cached share of input tokens",
    "Runs ended by terminal reason",
    "Runs by terminal reason and outcome (range)",
    "Runs by phase",
    "Queued runs by tenant",
    "Turns/s by tenant",
    "Tokens/s by tenant",
    "Cost per hour by tenant",
    "Turn latency by phase (p50 / p99)",
    "Tool error rate by tool",
    "Corrections by kind",
    "Queue lag (pending turns)",
    "Worker saturation by instance",
}
"""Panels platform operators need, by title."""
PANEL_TYPES = {"timeseries", "stat", "bargauge"}
UNITS = {"s", "currencyUSD", "short", "percentunit"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

REQUIRED_ALERTS = {
    "AgentrunOperatorAbsent",
    "AgentrunNoOperatorLeader",
    "AgentrunWorkersAbsent",
    "AgentrunTargetsDown",
    "AgentrunTenantBudgetNearlyExhausted",
    "AgentrunRunsEndingNoProgress",
    "AgentrunRunsEndingModelError",
    "AgentrunRunsEndingCheckpointFailed",
    "AgentrunRunsEndingEffectUnknown",
    "AgentrunRunsEndingToolUnavailable",
    "AgentrunNoTurnsCommitted",
    "AgentrunModelCallsFailing",
    "AgentrunQueueLagGrowing",
    "AgentrunTurnsWaitLong",
    "AgentrunJetStreamStoreFilling",
    "AgentrunRunEventsBacklog",
    "AgentrunApprovalsWaitLong",
    "AgentrunCRDMismatch",
    "AgentrunMessagesRefused",
    "AgentrunTurnsUndelivered",
}
RUNBOOKS = REPO / "docs" / "runbooks"
RUNBOOK_URL = "https://agentrun.dev/docs/runbooks/{alert}.md"
"""The rule file's runbook links (the chart swaps the prefix for its runbookBaseURL)."""
SEVERITIES = {"info", "warning", "critical"}
DURATION = re.compile(r"(?:\d+(?:ms|[smhdwy]))+")


def load_dashboard() -> dict[str, Any]:
    """The dashboard JSON."""
    dashboard: dict[str, Any] = json.loads(DASHBOARD_FILE.read_text())
    return dashboard


def load_rules() -> dict[str, Any]:
    """The rule file YAML."""
    rules: dict[str, Any] = yaml.safe_load(RULES_FILE.read_text())
    return rules


def panels(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every panel except rows, nested panels of collapsed rows included."""
    found: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        found.extend((panel.get("panels") or []) if panel["type"] == "row" else [panel])
    return found


def variable(dashboard: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The template variable called ``name``."""
    matches = [v for v in dashboard["templating"]["list"] if v["name"] == name]
    assert len(matches) == 1, f"expected one template variable {name!r}"
    found: dict[str, Any] = matches[0]
    return found


def alerts(rules: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every alerting rule of every group."""
    return [rule for group in rules["groups"] for rule in group["rules"] if "alert" in rule]


DASHBOARD_QUERIES = promql.dashboard_queries(load_dashboard())
RULE_QUERIES = promql.rule_queries(load_rules())


def query_id(query: promql.Query) -> str:
    """A test id: panel title and refId, or the rule's name."""
    return f"{query.title}/{query.ref_id}" if query.ref_id else query.title


def instantiated(query: promql.Query) -> str:
    """The query as a plain Prometheus takes it."""
    return promql.instantiate(query.expr)


# ------------------------------------------------------------------------ dashboard


def test_dashboard_identity() -> None:
    dashboard = load_dashboard()
    assert (dashboard["uid"], dashboard["title"]) == ("agentrun", "agentrun")
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert dashboard["id"] is None, "a provisioned dashboard must not carry a database id"


def test_dashboard_has_a_prometheus_datasource_variable() -> None:
    datasource = variable(load_dashboard(), "datasource")
    assert (datasource["type"], datasource["query"]) == ("datasource", "prometheus")


def test_dashboard_is_templated_by_tenant_from_a_metric_every_tenant_has() -> None:
    # agentrun_tenant_info exists for every AgentTenant the operator knows, from the moment
    # it knows it: a new tenant, or one whose runs all wait Queued, is listed too.
    tenant = variable(load_dashboard(), "tenant")
    assert tenant["type"] == "query"
    assert tenant["datasource"] == DATASOURCE
    assert (
        tenant["definition"]
        == 'label_values(agentrun_tenant_info{namespace=~"$namespace"}, tenant)'
    )
    assert tenant["query"]["query"] == tenant["definition"]
    assert tenant["multi"] and tenant["includeAll"]
    assert tenant["allValue"] == ".*", "instantiate's default tenant regex is Grafana's All"


def test_dashboard_is_templated_by_install_namespace() -> None:
    # Two installs scraped by one Prometheus differ by their targets' namespace label.
    dashboard = load_dashboard()
    namespace = variable(dashboard, "namespace")
    assert namespace["type"] == "query" and namespace["datasource"] == DATASOURCE
    assert namespace["definition"] == "label_values(agentrun_operator_leader, namespace)"
    assert namespace["query"]["query"] == namespace["definition"]
    assert namespace["allValue"] == ".*"
    names = [v["name"] for v in dashboard["templating"]["list"]]
    assert names.index("namespace") < names.index("tenant"), "tenant depends on namespace"


def test_a_known_tenant_is_in_the_tenant_variable_s_metric() -> None:
    from prometheus_client import REGISTRY

    from agentrun import metrics

    metrics.know_tenant("listed-before-any-run")
    value = REGISTRY.get_sample_value("agentrun_tenant_info", {"tenant": "listed-before-any-run"})
    assert value == 1.0


def test_tentative_genai_metric_names_are_dashboard_constants() -> None:
    # The two OTel-derived names are written once in the dashboard, as hidden constants.
    dashboard = load_dashboard()
    assert promql.dashboard_constants(dashboard) == {
        "genai_token_usage": GENAI_TOKEN_USAGE,
        "genai_operation_duration": GENAI_OPERATION_DURATION,
    }
    raw = json.dumps([q.raw_expr for q in DASHBOARD_QUERIES])
    assert GENAI_TOKEN_USAGE not in raw and GENAI_OPERATION_DURATION not in raw


def test_dashboard_has_the_required_panels() -> None:
    titles = [panel["title"] for panel in panels(load_dashboard())]
    assert sorted(REQUIRED_PANELS - set(titles)) == []
    assert len(titles) == len(set(titles)), "panel titles must be unique"


def test_panels_have_a_known_type_unit_and_the_datasource_variable() -> None:
    for panel in panels(load_dashboard()):
        title = panel["title"]
        assert panel["type"] in PANEL_TYPES, title
        assert panel["fieldConfig"]["defaults"]["unit"] in UNITS, title
        assert panel["datasource"] == DATASOURCE, title
        assert panel.get("description"), f"{title}: say what the panel shows"


def test_panel_ids_are_unique_and_the_grid_does_not_overlap() -> None:
    everything = load_dashboard()["panels"]
    everything += [p for row in everything for p in row.get("panels") or []]
    ids = [panel["id"] for panel in everything]
    assert len(ids) == len(set(ids))
    taken: dict[tuple[int, int], str] = {}
    for panel in everything:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in taken, f"{panel['title']} overlaps {taken[(x, y)]}"
                taken[(x, y)] = panel["title"]


@pytest.mark.parametrize("panel", panels(load_dashboard()), ids=lambda panel: panel["title"])
def test_targets_have_datasource_expr_and_unique_ref_ids(panel: dict[str, Any]) -> None:
    targets = panel["targets"]
    assert targets, "a panel without a query shows nothing"
    for target in targets:
        assert target["datasource"] == DATASOURCE
        assert isinstance(target["expr"], str) and target["expr"].strip()
        assert re.fullmatch(r"[A-Z]", target["refId"])
    ref_ids = [target["refId"] for target in targets]
    assert len(ref_ids) == len(set(ref_ids))


def test_every_target_is_extracted() -> None:
    targets = sum(len(panel["targets"]) for panel in panels(load_dashboard()))
    assert len(DASHBOARD_QUERIES) == targets


def panel(title: str) -> dict[str, Any]:
    """The panel called ``title``."""
    (found,) = [p for p in panels(load_dashboard()) if p["title"] == title]
    return found


def test_budget_headroom_is_the_row_after_the_overview() -> None:
    rows = [p for p in load_dashboard()["panels"] if p["type"] == "row"]
    assert [row["title"] for row in rows[:2]] == ["Overview", "Budget headroom"]
    top = {
        p["title"] for p in panels(load_dashboard()) if p["gridPos"]["y"] < rows[2]["gridPos"]["y"]
    }
    assert {
        "Tenant budget used + reserved vs limit",
        "Tenant budget left",
        "Tenant budget burn rate per hour",
        "Time to budget exhaustion",
        "Operator leader",
        "Workers up",
    } <= top


def test_budget_headroom_is_what_the_ledger_refuses_on(parse: Parse) -> None:
    # The ledger refuses a call once used + reserved + the call's need exceeds the limit.
    (share,) = panel("Tenant budget used + reserved vs limit")["targets"]
    tree = parse(promql.instantiate(share["expr"]))
    assert (tree["type"], tree["op"]) == ("binaryExpr", "/")
    numerator = tree["lhs"]["expr"]
    assert (numerator["type"], numerator["op"]) == ("binaryExpr", "+")
    assert promql.metric_names(numerator) == {
        "agentrun_tenant_budget_used",
        "agentrun_tenant_budget_reserved",
    }
    assert promql.metric_names(tree["rhs"]) == {"agentrun_tenant_budget_limit"}
    for title in ("Tenant budget left", "Time to budget exhaustion"):
        (left,) = panel(title)["targets"]
        assert promql.metric_names(parse(promql.instantiate(left["expr"]))) == {
            "agentrun_tenant_budget_limit",
            "agentrun_tenant_budget_used",
            "agentrun_tenant_budget_reserved",
        }, title


def test_tokens_are_not_stacked_on_their_cached_part(parse: Parse) -> None:
    # cached_input is part of input (and reasoning part of output): stacking double counts.
    tokens = panel("Tokens/s by tenant")
    assert tokens["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "none"
    (target,) = tokens["targets"]
    (selector,) = promql.selectors(parse(promql.instantiate(target["expr"])))
    assert selector.matcher("type") == promql.Matcher("type", "=~", "input|output")
    (share,) = panel("Cached share of input tokens")["targets"]
    types = [s.matcher("type") for s in promql.selectors(parse(promql.instantiate(share["expr"])))]
    assert [m.value if m else None for m in types] == ["cached_input", "input"]


def test_tool_failures_show_model_errors_and_infrastructure_faults(parse: Parse) -> None:
    """``result="error"`` counts only what the model caused; ``fault`` is the platform's."""
    failures = panel("Tool error rate by tool")
    shown = {}
    for target in failures["targets"]:
        first = promql.selectors(parse(promql.instantiate(target["expr"])))[0]
        matcher = first.matcher("result")
        assert matcher is not None and matcher.op == "="
        shown[matcher.value] = target["legendFormat"]
    assert shown == {"error": "{{tool}} error", "fault": "{{tool}} fault"}
    described = panel("Tool calls by result")["description"]
    for result in ["ok", "error", "fault", "denied", "not_run"]:
        assert re.search(rf"\b{result}\b", described), result


def outcome_colour(panel_: dict[str, Any], name: str) -> str | None:
    """The fixed colour the panel's overrides give a series displayed as ``name``."""
    colour = None
    for override in panel_["fieldConfig"]["overrides"]:
        matcher = override["matcher"]
        if matcher["id"] == "byRegexp" and re.fullmatch(matcher["options"], name):
            for prop in override["properties"]:
                if prop["id"] == "color":
                    colour = prop["value"]["fixedColor"]
    return colour


@pytest.mark.parametrize(
    ("title", "shown"),
    [
        ("Runs ended in range", "{}"),
        ("Runs ended by terminal reason", "max_steps ({})"),
        ("Runs by terminal reason and outcome (range)", "completed ({})"),
    ],
)
def test_outcomes_have_their_own_colours(title: str, shown: str) -> None:
    found = panel(title)
    assert all("{{outcome}}" in t["legendFormat"] for t in found["targets"])
    colours = {o: outcome_colour(found, shown.format(o)) for o in ("ok", "partial", "none")}
    assert None not in colours.values() and len(set(colours.values())) == 3, colours


TENANT_SENTINEL = "tenant-under-test"
"""The tenant regex the selector checks instantiate with, to find ``$tenant`` in the tree."""
NAMESPACE_SENTINEL = "install-under-test"
"""Likewise for ``$namespace``."""
RATE_INTERVAL, TIME_RANGE = "1m7s", "2h3m"
"""Distinct durations for ``$__rate_interval`` and ``$__range``, found back in the tree."""


@pytest.mark.parametrize("query", DASHBOARD_QUERIES, ids=query_id)
def test_dashboard_query_filters_by_tenant_and_uses_grafana_intervals(
    query: promql.Query, parse: Parse
) -> None:
    tree = parse(
        promql.instantiate(
            query.expr,
            tenant_regex=TENANT_SENTINEL,
            namespace_regex=NAMESPACE_SENTINEL,
            rate_interval=RATE_INTERVAL,
            time_range=TIME_RANGE,
        )
    )
    for selector in promql.selectors(tree):
        assert selector.metric in KNOWN_METRICS, selector.metric
        if selector.metric in TENANT_LABELLED:
            assert promql.Matcher("tenant", "=~", TENANT_SENTINEL) in selector.matchers, selector
        assert promql.Matcher("namespace", "=~", NAMESPACE_SENTINEL) in selector.matchers, selector
        assert selector.matcher("job") is None, "scrape job names belong to the deployment"
    expected = TIME_RANGE if query.instant else RATE_INTERVAL
    assert {promql.duration(ms) for ms in promql.ranges_ms(tree)} <= {expected}
    if promql.calls(tree) & {"rate", "irate", "increase"}:
        assert promql.ranges_ms(tree), "rate() needs a range"


@pytest.mark.parametrize("query", DASHBOARD_QUERIES + RULE_QUERIES, ids=query_id)
def test_query_reads_only_contract_metrics_and_parses(query: promql.Query, parse: Parse) -> None:
    names = promql.metric_names(parse(instantiated(query)))
    assert names, "every expression reads at least one metric"
    assert sorted(names - KNOWN_METRICS) == []


def exported_series_names() -> set[str]:
    """The series names of every metric object defined in `agentrun.metrics`."""
    from prometheus_client.metrics import MetricWrapperBase

    from agentrun import metrics

    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}
    return {
        family.name + suffix
        for value in vars(metrics).values()
        if isinstance(value, MetricWrapperBase)
        for family in value.describe()
        for suffix in suffixes.get(family.type, [""])
    }


def test_every_metric_read_is_exported_by_agentrun_metrics(parse: Parse) -> None:
    trees = [parse(instantiated(q)) for q in DASHBOARD_QUERIES + RULE_QUERIES]
    used = set().union(*(promql.metric_names(tree) for tree in trees))
    assert sorted(used - exported_series_names() - PROMETHEUS_MADE) == []


# ---------------------------------------------------------------------------- rules


def test_rule_file_has_the_required_alerts() -> None:
    names = [rule["alert"] for rule in alerts(load_rules())]
    assert sorted(REQUIRED_ALERTS - set(names)) == []
    assert len(names) == len(set(names))


@pytest.mark.parametrize("rule", alerts(load_rules()), ids=lambda rule: rule["alert"])
def test_alert_is_complete(rule: dict[str, Any]) -> None:
    assert isinstance(rule["expr"], str) and rule["expr"].strip()
    assert DURATION.fullmatch(rule["for"])
    assert rule["labels"]["severity"] in SEVERITIES
    assert rule["annotations"]["summary"].strip()
    assert rule["annotations"]["description"].strip()
    assert "$" not in re.sub(r"\{\{.*?\}\}", "", rule["expr"]), "no Grafana variables here"


@pytest.mark.parametrize("rule", alerts(load_rules()), ids=lambda rule: rule["alert"])
def test_alert_annotations_use_only_labels_the_expression_keeps(rule: dict[str, Any]) -> None:
    # Every expression aggregates; only labels of its `by (...)` clauses survive.
    kept = {
        label.strip()
        for clause in re.findall(r"\bby\s*\(([^)]*)\)", rule["expr"])
        for label in clause.split(",")
    }
    text = " ".join(rule["annotations"].values())
    assert sorted(set(re.findall(r"\$labels\.(\w+)", text)) - kept) == []


@pytest.mark.parametrize("rule", alerts(load_rules()), ids=lambda rule: rule["alert"])
def test_alert_condition_has_operands_to_check_for_data(rule: dict[str, Any], parse: Parse) -> None:
    operands = promql.condition_operands(parse(rule["expr"]))
    assert operands
    for operand in operands:
        assert promql.alert_condition(operand) is None, f"{promql.render(operand)} still compares"
        assert promql.metric_names(operand) <= KNOWN_METRICS
        assert parse(promql.render(operand)) == operand


def test_condition_operands_of_the_project_alerts(parse: Parse) -> None:
    by_name = {rule["alert"]: parse(rule["expr"]) for rule in alerts(load_rules())}
    operands = promql.condition_operands(by_name["AgentrunNoTurnsCommitted"])
    assert [promql.render(operand) for operand in operands] == [
        'sum by (namespace, tenant) (agentrun_runs_in_phase{phase="Running"})',
        "sum by (namespace, tenant) (rate(agentrun_turns_total[5m]))",
    ]
    budget = promql.alert_condition(by_name["AgentrunTenantBudgetNearlyExhausted"])
    assert budget is not None
    text = promql.render(budget)
    assert text.startswith("(max by (namespace, tenant, resource) (agentrun_tenant_budget_used)")
    assert "+ max by (namespace, tenant, resource) (agentrun_tenant_budget_reserved))" in text
    assert text.endswith("(agentrun_tenant_budget_limit > 0)")


@pytest.mark.parametrize("rule", alerts(load_rules()), ids=lambda rule: rule["alert"])
def test_alert_links_its_runbook(rule: dict[str, Any]) -> None:
    name = rule["alert"]
    assert rule["annotations"]["runbook_url"] == RUNBOOK_URL.format(alert=name)
    runbook = (RUNBOOKS / f"{name}.md").read_text()
    assert runbook.startswith(f"# {name}\n")
    for section in ("## What it means", "## How to confirm", "## What to do"):
        assert section in runbook, f"{name}.md: {section}"
    assert "kubectl " in runbook and "```promql" in runbook


def test_every_runbook_belongs_to_an_alert() -> None:
    names = {rule["alert"] for rule in alerts(load_rules())}
    assert {path.stem for path in RUNBOOKS.glob("*.md")} - {"README"} == names


@pytest.mark.parametrize("rule", alerts(load_rules()), ids=lambda rule: rule["alert"])
def test_alert_keeps_installs_apart(rule: dict[str, Any], parse: Parse) -> None:
    # Every aggregation keeps `namespace` (the install's): two installs never add up.
    aggregations = [n for n in promql.walk(parse(rule["expr"])) if n["type"] == "aggregation"]
    for node in aggregations:
        assert "namespace" in node["grouping"] and not node["without"], promql.render(node)
    assert aggregations or promql.calls(parse(rule["expr"])) == {"absent"}


# ------------------------------------------------------------------- promtool / syntax


@pytest.fixture
def promtool(prometheus_binaries: Any) -> Path:
    """The pinned promtool (built once per machine with Prometheus, see agentrun_dev)."""
    path: Path = prometheus_binaries.promtool
    return path


def run_promtool(promtool: Path, *args: str | Path, cwd: Path) -> None:
    """Run promtool and fail with its output unless it exits 0."""
    done = subprocess.run(
        [str(promtool), *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"promtool {args}:\n{done.stdout}\n{done.stderr}"


def test_every_expression_renders_back_to_the_same_tree(parse: Parse) -> None:
    # The e2e suite queries rendered parts of these trees: rendering must not change them.
    trees = {query_id(q): parse(instantiated(q)) for q in DASHBOARD_QUERIES + RULE_QUERIES}
    changed = {name for name, tree in trees.items() if parse(promql.render(tree)) != tree}
    assert changed == set()


def test_every_expression_is_valid_promql(tmp_path: Path, promtool: Path) -> None:
    # Each dashboard expression as a recording rule: promtool parses every expr.
    as_rules = {
        "groups": [
            {
                "name": "agentrun-dashboard",
                "rules": [
                    {"record": f"agentrun_dashboard:check_{index}", "expr": instantiated(q)}
                    for index, q in enumerate(DASHBOARD_QUERIES)
                ],
            }
        ]
    }
    dashboard_rules = tmp_path / "dashboard.rules.yaml"
    dashboard_rules.write_text(yaml.safe_dump(as_rules, sort_keys=False))
    run_promtool(promtool, "check", "rules", dashboard_rules, RULES_FILE, cwd=tmp_path)


ALERT_UNIT_TESTS = """
rule_files: [{rules}]
evaluation_interval: 1m
tests:
  - name: budget on used + reserved over 90% alerts; used alone, or a zero limit, does not
    interval: 1m
    input_series:
      - series: agentrun_tenant_budget_used{{namespace="ns",tenant="a",resource="tokens",job="op"}}
        values: 80x20
      - series: agentrun_tenant_budget_reserved{{namespace="ns",tenant="a",resource="tokens",
          job="op"}}
        values: 15x20
      - series: agentrun_tenant_budget_limit{{namespace="ns",tenant="a",resource="tokens",job="op"}}
        values: 100x20
      - series: agentrun_tenant_budget_used{{namespace="ns",tenant="c",resource="tokens",job="op"}}
        values: 85x20
      - series: agentrun_tenant_budget_reserved{{namespace="ns",tenant="c",resource="tokens",
          job="op"}}
        values: 0x20
      - series: agentrun_tenant_budget_limit{{namespace="ns",tenant="c",resource="tokens",job="op"}}
        values: 100x20
      - series: agentrun_tenant_budget_used{{namespace="ns",tenant="b",resource="cost_usd",
          job="op"}}
        values: 5x20
      - series: agentrun_tenant_budget_reserved{{namespace="ns",tenant="b",resource="cost_usd",
          job="op"}}
        values: 0x20
      - series: agentrun_tenant_budget_limit{{namespace="ns",tenant="b",resource="cost_usd",
          job="op"}}
        values: 0x20
    alert_rule_test:
      - eval_time: 10m
        alertname: AgentrunTenantBudgetNearlyExhausted
        exp_alerts:
          - exp_labels: {{severity: warning, namespace: ns, tenant: a, resource: tokens}}
  - name: a refused message alerts at once, per reason; none refused does not
    interval: 1m
    input_series:
      - series: agentrun_messages_refused_total{{namespace="ns",reason="bad_signature",job="op"}}
        values: 0x5 1x10
      - series: agentrun_messages_refused_total{{namespace="ns",reason="unsigned",job="op"}}
        values: 0x15
    alert_rule_test:
      - eval_time: 8m
        alertname: AgentrunMessagesRefused
        exp_alerts:
          - exp_labels: {{severity: warning, namespace: ns, reason: bad_signature}}
      - eval_time: 3m
        alertname: AgentrunMessagesRefused
        exp_alerts: []
  - name: a TurnRequest sent again as undelivered alerts at once, per reason
    interval: 1m
    input_series:
      - series: agentrun_turns_undelivered_total{{namespace="ns",reason="below_ack_floor",
          job="op"}}
        values: 0x5 1x10
      - series: agentrun_turns_undelivered_total{{namespace="ns",reason="not_delivered",
          job="op"}}
        values: 0x15
    alert_rule_test:
      - eval_time: 8m
        alertname: AgentrunTurnsUndelivered
        exp_alerts:
          - exp_labels: {{severity: warning, namespace: ns, reason: below_ack_floor}}
      - eval_time: 3m
        alertname: AgentrunTurnsUndelivered
        exp_alerts: []
  - name: run-end alerts are ratios among ended runs, with a minimum volume
    interval: 1m
    input_series:
      # busy: one run a minute of each bad reason among 24: about 4%, under every threshold
      - series: agentrun_runs_total{{namespace="ns",tenant="busy",reason="completed",outcome="ok"}}
        values: 0+20x30
      - series: agentrun_runs_total{{namespace="ns",tenant="busy",reason="model_error",
          outcome="none"}}
        values: 0+1x30
      - series: agentrun_runs_total{{namespace="ns",tenant="busy",reason="no_progress",
          outcome="partial"}}
        values: 0+1x30
      - series: agentrun_runs_total{{namespace="ns",tenant="busy",reason="checkpoint_failed",
          outcome="none"}}
        values: 0+1x30
      - series: agentrun_runs_total{{namespace="ns",tenant="busy",reason="tool_unavailable",
          outcome="none"}}
        values: 0+1x30
      # small: the same counts, but they are all its runs: 25% each
      - series: agentrun_runs_total{{namespace="ns",tenant="small",reason="model_error",
          outcome="none"}}
        values: 0+1x30
      - series: agentrun_runs_total{{namespace="ns",tenant="small",reason="no_progress",
          outcome="partial"}}
        values: 0+1x30
      - series: agentrun_runs_total{{namespace="ns",tenant="small",reason="checkpoint_failed",
          outcome="none"}}
        values: 0+1x30
      - series: agentrun_runs_total{{namespace="ns",tenant="small",reason="tool_unavailable",
          outcome="none"}}
        values: 0+1x30
      # few: one run in 15 minutes, model_error: 100%, but too few runs to tell
      - series: agentrun_runs_total{{namespace="ns",tenant="few",reason="model_error",
          outcome="none"}}
        values: 0x20 1x10
      # write: any effect_unknown share alerts
      - series: agentrun_runs_total{{namespace="ns",tenant="write",reason="completed",outcome="ok"}}
        values: 0+20x30
      - series: agentrun_runs_total{{namespace="ns",tenant="write",reason="effect_unknown",
          outcome="none"}}
        values: 0+1x30
    alert_rule_test:
      - eval_time: 25m
        alertname: AgentrunRunsEndingNoProgress
        exp_alerts:
          - exp_labels: {{severity: warning, namespace: ns, tenant: small}}
      - eval_time: 25m
        alertname: AgentrunRunsEndingModelError
        exp_alerts:
          - exp_labels: {{severity: warning, namespace: ns, tenant: small}}
      - eval_time: 25m
        alertname: AgentrunRunsEndingCheckpointFailed
        exp_alerts:
          - exp_labels: {{severity: critical, namespace: ns, tenant: small}}
      - eval_time: 25m
        alertname: AgentrunRunsEndingToolUnavailable
        exp_alerts:
          - exp_labels: {{severity: warning, namespace: ns, tenant: small}}
      - eval_time: 25m
        alertname: AgentrunRunsEndingEffectUnknown
        exp_alerts:
          - exp_labels: {{severity: critical, namespace: ns, tenant: write}}
  - name: model call failures alert as a share of the model's calls, by error type
    interval: 1m
    input_series:
      - series: agentrun_model_calls_total{{namespace="ns",tenant="t",model="m1"}}
        values: 0+20x40
      - series: agentrun_model_call_errors_total{{namespace="ns",tenant="t",model="m1",
          error_type="rate_limited"}}
        values: 0+5x40
      - series: agentrun_model_call_errors_total{{namespace="ns",tenant="t",model="m1",
          error_type="server_error"}}
        values: 0+1x40
      - series: agentrun_model_calls_total{{namespace="ns",tenant="t",model="m2"}}
        values: 0+100x40
      - series: agentrun_model_call_errors_total{{namespace="ns",tenant="t",model="m2",
          error_type="rate_limited"}}
        values: 0+5x40
    alert_rule_test:
      - eval_time: 30m
        alertname: AgentrunModelCallsFailing
        exp_alerts:
          - exp_labels: {{severity: warning, namespace: ns, model: m1, error_type: rate_limited}}
  - name: a queue growing past the workers' capacity alerts, a steady one does not
    interval: 1m
    input_series:
      - series: agentrun_turns_pending{{namespace="grow",job="op"}}
        values: 0+20x40
      - series: agentrun_worker_concurrency{{namespace="grow",job="worker",instance="w1"}}
        values: 32x40
      - series: agentrun_worker_concurrency{{namespace="grow",job="worker",instance="w2"}}
        values: 32x40
      - series: agentrun_turns_pending{{namespace="steady",job="op"}}
        values: 500x40
      - series: agentrun_worker_concurrency{{namespace="steady",job="worker",instance="w1"}}
        values: 64x40
    alert_rule_test:
      - eval_time: 35m
        alertname: AgentrunQueueLagGrowing
        exp_alerts:
          - exp_labels: {{severity: warning, namespace: grow}}
  - name: TurnRequests waiting long for a worker alert on the p90 of their wait
    interval: 1m
    input_series:
      - series: agentrun_turn_queue_wait_seconds_bucket{{namespace="slow",le="1"}}
        values: 0+1x30
      - series: agentrun_turn_queue_wait_seconds_bucket{{namespace="slow",le="30"}}
        values: 0+1x30
      - series: agentrun_turn_queue_wait_seconds_bucket{{namespace="slow",le="60"}}
        values: 0+10x30
      - series: agentrun_turn_queue_wait_seconds_bucket{{namespace="slow",le="+Inf"}}
        values: 0+10x30
      - series: agentrun_turn_queue_wait_seconds_bucket{{namespace="fast",le="1"}}
        values: 0+10x30
      - series: agentrun_turn_queue_wait_seconds_bucket{{namespace="fast",le="30"}}
        values: 0+10x30
      - series: agentrun_turn_queue_wait_seconds_bucket{{namespace="fast",le="60"}}
        values: 0+10x30
      - series: agentrun_turn_queue_wait_seconds_bucket{{namespace="fast",le="+Inf"}}
        values: 0+10x30
    alert_rule_test:
      - eval_time: 25m
        alertname: AgentrunTurnsWaitLong
        exp_alerts:
          - exp_labels: {{severity: warning, namespace: slow}}
  - name: Running runs without committed turns alert, also for a tenant with no turn ever
    interval: 1m
    input_series:
      - series: agentrun_runs_in_phase{{namespace="ns",tenant="stuck",phase="Running",job="op"}}
        values: 2x20
      - series: agentrun_runs_in_phase{{namespace="ns",tenant="new",phase="Running",job="op"}}
        values: 1x20
      - series: agentrun_runs_in_phase{{namespace="ns",tenant="busy",phase="Running",job="op"}}
        values: 3x20
      - series: agentrun_turns_total{{namespace="ns",tenant="stuck",job="worker"}}
        values: 7x20
      - series: agentrun_turns_total{{namespace="ns",tenant="busy",job="worker"}}
        values: 0+4x20
    alert_rule_test:
      - eval_time: 15m
        alertname: AgentrunNoTurnsCommitted
        exp_alerts:
          - exp_labels: {{severity: critical, namespace: ns, tenant: stuck}}
          - exp_labels: {{severity: critical, namespace: ns, tenant: new}}
  - name: a dead leader without a successor, and workers without a leader, alert per install
    interval: 1m
    input_series:
      # install "dead": its leader stops being scraped at 10m; the standby never takes over
      - series: agentrun_operator_leader{{namespace="dead",pod="op-1"}}
        values: 1x10
      - series: agentrun_operator_leader{{namespace="dead",pod="op-2"}}
        values: 0x30
      - series: agentrun_worker_concurrency{{namespace="dead",pod="w-1"}}
        values: 64x30
      # install "noworkers": a leader, but no worker exports anything
      - series: agentrun_operator_leader{{namespace="noworkers",pod="op-1"}}
        values: 1x30
      # install "healthy": a failover at 10m, workers up
      - series: agentrun_operator_leader{{namespace="healthy",pod="op-1"}}
        values: 1x10
      - series: agentrun_operator_leader{{namespace="healthy",pod="op-2"}}
        values: 0x10 1x20
      - series: agentrun_worker_concurrency{{namespace="healthy",pod="w-1"}}
        values: 64x30
    alert_rule_test:
      - eval_time: 25m
        alertname: AgentrunNoOperatorLeader
        exp_alerts:
          - exp_labels: {{severity: critical, namespace: dead}}
      - eval_time: 25m
        alertname: AgentrunWorkersAbsent
        exp_alerts:
          - exp_labels: {{severity: critical, namespace: noworkers}}
      - eval_time: 25m
        alertname: AgentrunOperatorAbsent
        exp_alerts: []
  - name: no operator scraped at all alerts; a share of targets down alerts per job
    interval: 1m
    input_series:
      - series: agentrun_worker_concurrency{{namespace="ns",pod="w-1"}}
        values: 64x20
      - series: up{{namespace="ns",job="agentrun-worker",instance="w-1"}}
        values: 1x20
      - series: up{{namespace="ns",job="agentrun-worker",instance="w-2"}}
        values: 0x20
      - series: up{{namespace="ns",job="agentrun-operator-metrics",instance="op-1"}}
        values: 1x20
      - series: up{{namespace="ns",job="someone-else",instance="x"}}
        values: 0x20
    alert_rule_test:
      - eval_time: 15m
        alertname: AgentrunOperatorAbsent
        exp_alerts:
          - exp_labels: {{severity: critical}}
      - eval_time: 15m
        alertname: AgentrunTargetsDown
        exp_alerts:
          - exp_labels: {{severity: warning, namespace: ns, job: agentrun-worker}}
  - name: the bus alerts - a filling store, an event backlog, an old approval, old CRDs
    interval: 1m
    input_series:
      # "full": 900 of 1000 bytes used; "roomy": 100 of 1000; "unknown": no store size
      - series: agentrun_jetstream_stream_bytes{{namespace="full",stream="AGENTRUN_EVENTS"}}
        values: 850x30
      - series: agentrun_jetstream_stream_bytes{{namespace="full",stream="AGENTRUN_TURNS"}}
        values: 50x30
      - series: agentrun_jetstream_store_limit_bytes{{namespace="full",pod="op-1"}}
        values: 1000x30
      - series: agentrun_jetstream_stream_bytes{{namespace="roomy",stream="AGENTRUN_EVENTS"}}
        values: 100x30
      - series: agentrun_jetstream_store_limit_bytes{{namespace="roomy",pod="op-1"}}
        values: 1000x30
      - series: agentrun_jetstream_stream_bytes{{namespace="unknown",stream="AGENTRUN_EVENTS"}}
        values: 999999x30
      # "behind": 500 events wait all along; "bursty": a burst drained within minutes
      - series: agentrun_jetstream_consumer_pending{{namespace="behind",
          consumer="agentrun-operator"}}
        values: 500x30
      - series: agentrun_jetstream_consumer_pending{{namespace="bursty",
          consumer="agentrun-operator"}}
        values: 0x10 500 0x19
      - series: agentrun_jetstream_consumer_pending{{namespace="behind",
          consumer="agentrun-workers"}}
        values: 900x30
      # "sharded": shard 2's consumer waits all along, shard 0's keeps up
      - series: agentrun_jetstream_consumer_pending{{namespace="sharded",
          consumer="agentrun-operator-2"}}
        values: 500x30
      - series: agentrun_jetstream_consumer_pending{{namespace="sharded",
          consumer="agentrun-operator-0"}}
        values: 0x30
      # tenant "old" held a call at t=0 (waits the whole time), "new" 20 minutes in
      - series: agentrun_approval_oldest_request_timestamp_seconds{{namespace="ns",tenant="old"}}
        values: 0x90
      - series: agentrun_approval_oldest_request_timestamp_seconds{{namespace="ns",tenant="new"}}
        values: _x20 1200x70
      # one operator pod of "stale" waits for newer CRDs; "fine" matches
      - series: agentrun_crd_mismatch{{namespace="stale",pod="op-2"}}
        values: 1x30
      - series: agentrun_crd_mismatch{{namespace="stale",pod="op-1"}}
        values: 0x30
      - series: agentrun_crd_mismatch{{namespace="fine",pod="op-1"}}
        values: 0x30
    alert_rule_test:
      - eval_time: 20m
        alertname: AgentrunJetStreamStoreFilling
        exp_alerts:
          - exp_labels: {{severity: warning, namespace: full}}
      - eval_time: 25m
        alertname: AgentrunRunEventsBacklog
        exp_alerts:
          - exp_labels: {{severity: warning, namespace: behind, consumer: agentrun-operator}}
          - exp_labels: {{severity: warning, namespace: sharded, consumer: agentrun-operator-2}}
      - eval_time: 70m
        alertname: AgentrunApprovalsWaitLong
        exp_alerts:
          - exp_labels: {{severity: warning, namespace: ns, tenant: old}}
      - eval_time: 25m
        alertname: AgentrunCRDMismatch
        exp_alerts:
          - exp_labels: {{severity: critical, namespace: stale}}
"""
"""promtool unit tests: each alert fires on the series it is for, and not on look-alikes."""


ANNOTATION_TEST = """
rule_files: [{rules}]
evaluation_interval: 1m
tests:
  - name: annotations render the tenant, the value and the runbook
    interval: 1m
    input_series:
      - series: agentrun_runs_in_phase{{namespace="ns",tenant="t1",phase="Running",job="op"}}
        values: 2x20
    alert_rule_test:
      - eval_time: 15m
        alertname: AgentrunNoTurnsCommitted
        exp_alerts:
          - exp_labels: {{severity: critical, namespace: ns, tenant: t1}}
            exp_annotations:
              summary: Runs of tenant t1 are Running but no turn is committed
              description: >-
                Tenant t1 has 2 run(s) in phase Running and no turn was committed for it in
                over 5 minutes. Check that workers are up and consuming AGENTRUN_TURNS, that
                NATS is reachable, and the worker logs for commit failures.
              runbook_url: https://agentrun.dev/docs/runbooks/AgentrunNoTurnsCommitted.md
"""
"""promtool unit test of one alert's annotations, against the rule file as shipped."""


def test_alerts_fire_on_synthetic_series(tmp_path: Path, promtool: Path) -> None:
    # promtool compares annotations exactly: test the conditions on a copy without them.
    rules = load_rules()
    for rule in alerts(rules):
        rule.pop("annotations")
    bare = tmp_path / "agentrun.rules.yaml"
    bare.write_text(yaml.safe_dump(rules, sort_keys=False))
    spec = tmp_path / "agentrun.rules.test.yaml"
    spec.write_text(ALERT_UNIT_TESTS.format(rules=json.dumps(str(bare))))
    run_promtool(promtool, "test", "rules", spec, cwd=tmp_path)


def test_alert_annotations_render(tmp_path: Path, promtool: Path) -> None:
    spec = tmp_path / "annotations.test.yaml"
    spec.write_text(ANNOTATION_TEST.format(rules=json.dumps(str(RULES_FILE))))
    run_promtool(promtool, "test", "rules", spec, cwd=tmp_path)


# ------------------------------------------------------------------ promql helpers


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ('rate(x{tenant=~"$tenant"}[$__rate_interval])', 'rate(x{tenant=~".*"}[1m])'),
        ('x{tenant=~"${tenant}"}[$__range]', 'x{tenant=~".*"}[1h]'),
        ("avg_over_time(x[$__interval])", "avg_over_time(x[1m])"),
        (
            'label_replace(x, "d", "$1-${1}", "s", "(.*)")',
            'label_replace(x, "d", "$1-${1}", "s", "(.*)")',
        ),
    ],
)
def test_instantiate_replaces_grafana_variables(expr: str, expected: str) -> None:
    assert promql.instantiate(expr) == expected


def test_instantiate_escapes_values_for_the_string_they_land_in(parse: Parse) -> None:
    expr = """x{tenant=~"$tenant", b=~'$tenant', c=~`$tenant`}"""
    instantiated_expr = promql.instantiate(expr, tenant_regex='a\\.b|"q"')
    assert instantiated_expr == """x{tenant=~"a\\\\.b|\\"q\\"", b=~'a\\\\.b|"q"', c=~`a\\.b|"q"`}"""
    (selector,) = promql.selectors(parse(instantiated_expr))
    assert {m.value for m in selector.matchers} == {'a\\.b|"q"'}


@pytest.mark.parametrize(
    "expr", ['x{d="${datasource}"}', "rate(x[$__rate_interval_ms])", 'x{t=~"${tenant:pipe}"}']
)
def test_instantiate_refuses_what_it_cannot_fill(expr: str) -> None:
    with pytest.raises(ValueError):
        promql.instantiate(expr)


def test_instantiate_checks_durations_and_takes_extra_variables() -> None:
    with pytest.raises(ValueError):
        promql.instantiate("rate(x[$__rate_interval])", rate_interval="1 minute")
    assert promql.instantiate("${m}_bucket", variables={"m": "h"}) == "h_bucket"


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("a / b > 0.9", "a / b"),
        ('sum by (t) (a{x="1"}) >= bool 3', 'sum by (t) (a{x="1"})'),
        ("(a > 0.5) > -(1e3)", "(a > 0.5)"),
        ("a > 0.5 > 0.9", "a > 0.5"),
        ("0.9 < rate(a[5m])", "rate(a[5m])"),
        ("(a - b == 0)", "a - b"),
        ('max(a{l=">"}) != Inf', 'max(a{l=">"})'),
        ("a > b", None),
        ("a > 2 * 60", None),
        ("a > 0 and b == 0", None),
        ("absent(a)", None),
        ("a", None),
    ],
)
def test_alert_condition(expr: str, expected: str | None, parse: Parse) -> None:
    condition = promql.alert_condition(parse(expr))
    assert (None if condition is None else promql.render(condition)) == expected


def test_condition_operands_split_set_operators_and_matching_clauses(parse: Parse) -> None:
    expr = "(a > 1 and on (t) b < 2) or ignoring (x) c unless absent(d)"
    operands = promql.condition_operands(parse(expr))
    assert [promql.render(operand) for operand in operands] == ["a", "b", "c", "absent(d)"]


def test_selectors_and_metric_names_skip_functions_keywords_and_grouping_labels(
    parse: Parse,
) -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, phase) (rate(h_bucket{t=~"x.*"}[5m]))) '
        '/ on (job) group_left (tenant) max without (instance) (g offset 5m) or {__name__="n"}'
    )
    tree = parse(expr)
    assert promql.metric_names(tree) == {"h_bucket", "g", "n"}
    assert promql.selectors(tree)[0].matcher("t") == promql.Matcher("t", "=~", "x.*")
    assert promql.ranges_ms(tree) == [300_000]
    assert promql.calls(tree) == {"histogram_quantile", "rate"}


def test_an_unknown_metric_is_caught(parse: Parse) -> None:
    # What the contract-metric checks above rely on: a misspelt name comes out of the tree.
    tree = parse('sum(rate(agentrun_turns_totl{tenant=~".*"}[1m]))')
    assert promql.metric_names(tree) - KNOWN_METRICS == {"agentrun_turns_totl"}


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        ("sum(rate(x[5m])", "unclosed"),
        ("rate(x[5m]))", "unexpected"),
        ("rate(x[$__rate_interval])", "unexpected"),
        ('x{t=~"$tenant"} + $tenant', "unexpected"),
        ("rate(x[5 m])", "unexpected"),
        ('x{t="a" u="b"}', "unexpected"),
        ("histogram_quantil(0.5, x)", "unknown function"),
        ("rate(x)", "expected type range vector"),
        ("x >", "unexpected end of input"),
        ("", "no expression found"),
        ("x ; y", "unexpected character"),
    ],
)
def test_the_parser_rejects_the_usual_mistakes(expr: str, problem: str, parse: Parse) -> None:
    with pytest.raises(PrometheusAPIError) as rejected:
        parse(expr)
    assert rejected.value.error_type == "bad_data"
    assert problem in rejected.value.error


@pytest.mark.parametrize(
    "expr",
    [
        'sum by (tenant) (rate(x_total{tenant=~".*", a!="b",}[1m])) * 60',
        "max_over_time(x[1h:5m] @ end())",
        "max_over_time(x[1h:] offset 1m30s)",
        'label_replace(x, "d", "$1", "s", "(.*)")',
        '{"gen.ai.metric", a="b"}',
        '{"gen.ai.metric", "x.y"="b"}',
        "-x + +1 # comment",
        "topk by (a) (5, x) unless on () y",
        'count_values without (b) ("v", x) > bool 1',
        "a * on (t) group_right (u, v) b",
        "x @ 1700000000.5",
    ],
)
def test_render_writes_valid_promql_back_as_the_same_tree(expr: str, parse: Parse) -> None:
    tree = parse(expr)
    assert parse(promql.render(tree)) == tree


@pytest.mark.parametrize(
    ("ms", "text"), [(0, "0s"), (90_000, "1m30s"), (7_380_000, "2h3m"), (1_500, "1s500ms")]
)
def test_durations_are_written_as_promql_writes_them(ms: int, text: str) -> None:
    assert promql.duration(ms) == text
