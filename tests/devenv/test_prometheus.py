"""A real Prometheus (built from the Go module proxy at a pinned version) and its promtool.

The server scrapes a ``prometheus_client`` registry served from this test process and
evaluates rule files; promtool lints expositions and rules. The cold build into an empty cache
runs only with ``AGENTRUN_TEST_GO_BUILD=1`` (minutes on a warm Go cache, longer cold).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import prometheus_client
import pytest
import yaml
from prometheus_support import PrometheusStarter, serve_metrics

from agentrun_dev import gobuild, probes, prometheus

RULES = textwrap.dedent(
    """
    groups:
      - name: demo
        rules:
          - record: tenant:demo_events:sum
            expr: sum by (tenant) (demo_events_total)
          - alert: DemoEventsSeen
            expr: sum by (tenant) (demo_events_total) > 2
            labels:
              severity: warning
            annotations:
              summary: "tenant {{ $labels.tenant }} saw {{ $value }} events"
    """
)
BAD_RULES = textwrap.dedent(
    """
    groups:
      - name: broken
        rules:
          - alert: Broken
            expr: sum by (tenant) (rate(demo_events_total[5m])
    """
)


def demo_registry() -> tuple[prometheus_client.CollectorRegistry, prometheus_client.Counter]:
    registry = prometheus_client.CollectorRegistry()
    counter = prometheus_client.Counter(
        "demo_events", "Events seen by the demo.", ["tenant"], registry=registry
    )
    return registry, counter


# --- pure parts -----------------------------------------------------------------------------


def test_the_cache_is_versioned_under_the_user_cache_dir(tmp_path: Path) -> None:
    assert prometheus.cache_bin_dir(tmp_path) == tmp_path / "prometheus" / "v0.316.0" / "bin"


def test_the_go_directive_sets_the_minimum_go() -> None:
    assert gobuild.go_directive_of("module m\n\ngo 1.26.7\n\nrequire x v1\n") == (1, 26)
    assert gobuild.go_directive_of("module m\n") == (1, 16)


def test_the_release_is_read_from_the_version_file(tmp_path: Path) -> None:
    (tmp_path / "VERSION").write_text("3.16.0\n")
    assert gobuild.prometheus_release_of(tmp_path) == "3.16.0"
    (tmp_path / "VERSION").write_text("main\n")
    with pytest.raises(gobuild.BuildError, match="not a version"):
        gobuild.prometheus_release_of(tmp_path)


def test_the_release_is_stamped_at_link_time() -> None:
    flags = gobuild.prometheus_ldflags(release="3.16.0", module_version="v0.316.0").split()

    assert "github.com/prometheus/common/version.Version=3.16.0" in flags
    assert "github.com/prometheus/common/version.Revision=v0.316.0" in flags
    assert flags.count("-X") == len(flags) // 2


def test_the_config_has_one_static_job_per_target_group(tmp_path: Path) -> None:
    text = prometheus.prometheus_config(
        {"operator": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"]},
        rule_files=[tmp_path / "a.rules.yaml"],
        scrape_interval="2s",
    )

    assert yaml.safe_load(text) == {
        "global": {"scrape_interval": "2s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp_path / "a.rules.yaml")],
        "scrape_configs": [
            {"job_name": "operator", "static_configs": [{"targets": ["127.0.0.1:1"]}]},
            {
                "job_name": "worker",
                "static_configs": [{"targets": ["127.0.0.1:2", "127.0.0.1:3"]}],
            },
        ],
    }


def test_without_go_the_error_names_the_prometheus_override(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(gobuild.BuildError, match=r"go not found on PATH.*PROMETHEUS_BINARIES"):
        gobuild.build_prometheus(tmp_path, module_version="v0.316.0", log=lambda _: None)


def test_incomplete_prometheus_binaries_are_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROMETHEUS_BINARIES", str(tmp_path))
    with pytest.raises(prometheus.PrometheusBinariesError, match="lacks prometheus and promtool"):
        prometheus.ensure_prometheus(root=tmp_path / "empty-cache", log=lambda _: None)


# --- the real binaries ----------------------------------------------------------------------


def test_prometheus_binaries_are_used_as_they_are(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    prometheus_binaries: prometheus.PrometheusBinaries,
) -> None:
    (tmp_path / "prometheus").symlink_to(prometheus_binaries.prometheus)
    (tmp_path / "promtool").symlink_to(prometheus_binaries.promtool)
    monkeypatch.setenv("PROMETHEUS_BINARIES", str(tmp_path))

    found = prometheus.ensure_prometheus(root=tmp_path / "empty-cache", log=lambda _: None)

    assert found == prometheus.PrometheusBinaries(
        prometheus=tmp_path / "prometheus", promtool=tmp_path / "promtool"
    )


@pytest.mark.parametrize("name", ["prometheus", "promtool"])
def test_the_binaries_report_the_pinned_release(
    prometheus_binaries: prometheus.PrometheusBinaries, name: str
) -> None:
    binary = getattr(prometheus_binaries, name)
    result = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True)

    assert f"{name}, version {prometheus.PROMETHEUS_RELEASE} " in result.stdout + result.stderr


def test_prometheus_scrapes_a_counter_and_a_query_returns_its_value(
    prometheus_factory: PrometheusStarter,
) -> None:
    registry, counter = demo_registry()
    counter.labels(tenant="acme").inc(3)
    with serve_metrics(registry) as address:
        server = prometheus_factory({"demo": [address]})

        targets = server.wait_for_targets_up(timeout=30)
        samples = server.query('demo_events_total{tenant="acme"}')

    assert [(t["labels"]["job"], t["labels"]["instance"], t["health"]) for t in targets] == [
        ("demo", address, "up")
    ]
    assert len(samples) == 1
    assert samples[0]["metric"]["job"] == "demo"
    assert float(samples[0]["value"][1]) == 3.0
    assert server.value(f'up{{job="demo",instance="{address}"}}') == 1.0
    assert server.value("vector(2) * 21") == 42.0
    assert server.query('demo_events_total{tenant="nobody"}') == []


def test_a_bad_query_raises_with_prometheus_own_error_text(
    prometheus_factory: PrometheusStarter,
) -> None:
    server = prometheus_factory({})

    with pytest.raises(prometheus.PrometheusAPIError, match=r"bad_data: .*parse error") as caught:
        server.query("sum(rate(demo_events_total[5m])")

    assert caught.value.error_type == "bad_data"


def test_rules_are_loaded_evaluated_and_an_alert_fires(
    tmp_path: Path, prometheus_factory: PrometheusStarter
) -> None:
    rules = tmp_path / "demo.rules.yaml"
    rules.write_text(RULES)
    registry, counter = demo_registry()
    counter.labels(tenant="acme").inc(5)
    with serve_metrics(registry) as address:
        server = prometheus_factory({"demo": [address]}, rule_files=[rules])
        server.wait_for_targets_up(timeout=30)
        firing = _wait_until_alert_fires(server, "DemoEventsSeen", timeout=30)
        groups = server.wait_for_rules_evaluated(timeout=30)
        recorded = server.query('tenant:demo_events:sum{tenant="acme"}')

    assert [g["name"] for g in groups] == ["demo"]
    assert [(r["name"], r["health"], r.get("lastError", "")) for r in groups[0]["rules"]] == [
        ("tenant:demo_events:sum", "ok", ""),
        ("DemoEventsSeen", "ok", ""),
    ]
    assert [float(s["value"][1]) for s in recorded] == [5.0]
    assert [(a["labels"]["tenant"], a["labels"]["severity"]) for a in firing] == [
        ("acme", "warning")
    ]
    assert firing[0]["annotations"]["summary"] == "tenant acme saw 5 events"


def test_a_rules_file_that_does_not_parse_stops_startup_with_the_reason(
    tmp_path: Path, prometheus_factory: PrometheusStarter
) -> None:
    rules = tmp_path / "broken.rules.yaml"
    rules.write_text(BAD_RULES)

    with pytest.raises(probes.NotReadyError, match=r"(?s)exited.*parse error"):
        prometheus_factory({}, rule_files=[rules])


def test_a_dead_target_times_out_with_its_scrape_error(
    prometheus_factory: PrometheusStarter,
) -> None:
    dead = f"127.0.0.1:{probes.free_port()}"
    server = prometheus_factory({"gone": [dead]})
    # its first scrape comes up to a scrape interval after start-up (later on a busy machine):
    # until then the target is "unknown", with no error to report
    deadline = time.monotonic() + 30
    while not any(t["health"] == "down" for t in server.active_targets()):
        assert time.monotonic() < deadline, f"never scraped: {server.active_targets()}"
        time.sleep(0.2)

    with pytest.raises(TimeoutError, match=rf"gone/{re.escape(dead)}: down \(.*connection refused"):
        server.wait_for_targets_up(timeout=1)


def test_promtool_accepts_a_clean_exposition(
    prometheus_binaries: prometheus.PrometheusBinaries,
) -> None:
    registry, counter = demo_registry()
    counter.labels(tenant="acme").inc()
    prometheus_client.Histogram(
        "demo_latency_seconds", "Latency of the demo.", registry=registry
    ).observe(0.2)

    ok, output = prometheus.promtool_check_metrics(
        prometheus_binaries.promtool, prometheus_client.generate_latest(registry).decode()
    )

    assert (ok, output) == (True, "")


def test_promtool_flags_a_counter_without_the_total_suffix(
    prometheus_binaries: prometheus.PrometheusBinaries,
) -> None:
    text = "# HELP demo_events Events.\n# TYPE demo_events counter\ndemo_events 1\n"

    ok, output = prometheus.promtool_check_metrics(prometheus_binaries.promtool, text)

    assert not ok
    assert 'demo_events counter metrics should have "_total" suffix' in output


def test_promtool_rejects_an_exposition_that_does_not_parse(
    prometheus_binaries: prometheus.PrometheusBinaries,
) -> None:
    ok, output = prometheus.promtool_check_metrics(
        prometheus_binaries.promtool, "# TYPE x_total counter\nx_total{tenant=acme} 1\n"
    )

    assert not ok
    assert "error while linting" in output


def test_promtool_accepts_valid_rules(
    tmp_path: Path, prometheus_binaries: prometheus.PrometheusBinaries
) -> None:
    rules = tmp_path / "demo.rules.yaml"
    rules.write_text(RULES)

    ok, output = prometheus.promtool_check_rules(prometheus_binaries.promtool, rules)

    assert ok, output
    assert "SUCCESS: 2 rules found" in output


def test_promtool_rejects_an_invalid_promql_expression(
    tmp_path: Path, prometheus_binaries: prometheus.PrometheusBinaries
) -> None:
    rules = tmp_path / "broken.rules.yaml"
    rules.write_text(BAD_RULES)

    ok, output = prometheus.promtool_check_rules(prometheus_binaries.promtool, rules)

    assert not ok
    assert "FAILED" in output
    assert "parse error" in output


def test_promtool_lint_findings_fail_the_rules_check_by_default(
    tmp_path: Path, prometheus_binaries: prometheus.PrometheusBinaries
) -> None:
    rules = tmp_path / "dup.rules.yaml"
    rule = {"record": "tenant:demo_events:sum", "expr": "sum by (tenant) (demo_events_total)"}
    rules.write_text(yaml.safe_dump({"groups": [{"name": "dup", "rules": [rule, rule]}]}))

    strict = prometheus.promtool_check_rules(prometheus_binaries.promtool, rules)
    lenient = prometheus.promtool_check_rules(prometheus_binaries.promtool, rules, lint_fatal=False)

    assert not strict[0]
    assert "duplicate" in strict[1].lower()
    assert lenient[0], lenient[1]


# --- the cold build -------------------------------------------------------------------------

BUILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from agentrun_dev import prometheus
    def show(line): print(line, flush=True)
    found = prometheus.ensure_prometheus(root=Path(sys.argv[1]), log=show)
    print("RESULT", found.prometheus, found.promtool)
    """
)


@pytest.mark.usefixtures("prometheus_binaries")  # after the session's build: Go's cache warm
@pytest.mark.timeout(7200)  # with Go's build cache warm (the session built once) ~30 s
def test_two_concurrent_callers_share_one_build_into_an_empty_cache(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_BINARIES"}
    callers = [
        subprocess.Popen(
            [sys.executable, "-c", BUILD, str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [caller.communicate(timeout=7000)[0] for caller in callers]

    assert [caller.returncode for caller in callers] == [0, 0], outputs
    assert sum("[3/3] building prometheus, promtool" in out for out in outputs) == 1, outputs
    assert sum("another process is building" in out for out in outputs) <= 1
    bin_dir = prometheus.cache_bin_dir(tmp_path)
    assert sorted(p.name for p in bin_dir.iterdir()) == ["prometheus", "promtool"]


def _wait_until_alert_fires(
    server: prometheus.PrometheusServer, alert: str, *, timeout: float
) -> list[dict[str, Any]]:
    """The alert `alert` once it is firing (from ``/api/v1/alerts``)."""
    deadline = time.monotonic() + timeout
    while True:
        firing = [
            a
            for a in server.alerts()
            if a["labels"]["alertname"] == alert and a["state"] == "firing"
        ]
        if firing:
            return firing
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{alert} did not fire within {timeout:g} s: {server.alerts()}")
        time.sleep(0.2)
