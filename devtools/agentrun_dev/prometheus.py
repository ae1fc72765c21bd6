"""A real Prometheus server and promtool, to prove dashboards and alert rules against.

Binaries, in order of preference:

1. ``PROMETHEUS_BINARIES``: a directory holding ``prometheus`` and ``promtool``.
2. The per-machine cache, ``<user cache dir>/agentrun/prometheus/<module version>/bin/``.
3. A build from the Go module proxy into that cache (see `gobuild.build_prometheus`), once per
   machine: a file lock makes concurrent callers wait for a single build.

Prometheus is pinned at `PROMETHEUS_MODULE_VERSION`, the Go module version of
``github.com/prometheus/prometheus`` (``v0.316.0`` is Prometheus 3.16.0).

`start_prometheus` runs one server on a free loopback port that scrapes the given static
targets and evaluates the given rule files; `PrometheusServer` wraps the parts of its HTTP API
that tests need (instant queries, PromQL syntax trees from Prometheus' own parser, targets,
rules). `promtool_check_metrics` and `promtool_check_rules` lint an exposition and a rules
file.

What belongs here: locating, caching and building the binaries (through `gobuild`), starting
the server and talking to it. What the metrics and rules say belongs to the runtime and the
chart.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from agentrun_dev import binaries, components, console, gobuild, probes

PROMETHEUS_MODULE_VERSION = "v0.316.0"
"""``github.com/prometheus/prometheus`` at this version is Prometheus 3.16.0."""
PROMETHEUS_RELEASE = "3.16.0"
"""The release that `PROMETHEUS_MODULE_VERSION` reports in ``--version``."""
NAMES = gobuild.PROMETHEUS_NAMES
_HTTP_TIMEOUT = 10.0
_PROMTOOL_TIMEOUT = 60.0


class PrometheusBinariesError(RuntimeError):
    """``PROMETHEUS_BINARIES`` lacks a binary; the message says what to do."""


class PrometheusAPIError(RuntimeError):
    """The Prometheus HTTP API answered an error (bad PromQL, timeout…) or no JSON.

    The message holds Prometheus' own ``errorType`` and ``error`` text.
    """

    def __init__(self, message: str, *, error_type: str = "", error: str = "") -> None:
        super().__init__(message)
        self.error_type = error_type
        """Prometheus' ``errorType``, e.g. ``"bad_data"``; ``""`` if it sent none."""
        self.error = error
        """Prometheus' ``error`` text, e.g. ``"1:5: parse error: …"``."""


@dataclasses.dataclass(frozen=True, slots=True)
class PrometheusBinaries:
    """Absolute paths of the two executables."""

    prometheus: Path
    promtool: Path


def cache_bin_dir(root: Path | None = None) -> Path:
    """The cache directory of the pinned build, under `root` (default `binaries.cache_root()`)."""
    base = binaries.cache_root() if root is None else root
    return base / "prometheus" / PROMETHEUS_MODULE_VERSION / "bin"


def ensure_prometheus(
    *, root: Path | None = None, log: console.Log = console.log_to_stderr
) -> PrometheusBinaries:
    """prometheus and promtool from ``PROMETHEUS_BINARIES`` or the cache, built if needed.

    Args:
        root: cache root (default `binaries.cache_root()`); tests pass a temporary one.
        log: receives progress lines (a cold build takes minutes; Go's output is streamed).

    Raises:
        PrometheusBinariesError: ``PROMETHEUS_BINARIES`` lacks a binary.
        gobuild.BuildError: no suitable Go, or the build failed.
    """
    override = os.environ.get("PROMETHEUS_BINARIES", "").strip()
    if override:
        return _from_override(Path(override))
    bin_dir = cache_bin_dir(root)
    missing = binaries.missing_in(bin_dir, NAMES)
    if missing:
        with binaries.build_lock(bin_dir.parent, what="prometheus and promtool", log=log):
            missing = binaries.missing_in(
                bin_dir, NAMES
            )  # another process may have built them meanwhile
            if missing:
                _build(bin_dir, names=missing, log=log)
    return PrometheusBinaries(prometheus=bin_dir / "prometheus", promtool=bin_dir / "promtool")


@dataclasses.dataclass(frozen=True, slots=True)
class PrometheusServer:
    """A running Prometheus server on loopback, and the parts of its HTTP API tests use."""

    url: str
    """Base URL, ``http://127.0.0.1:<port>``."""
    config_path: Path
    """The generated ``prometheus.yml``."""
    storage_dir: Path
    """The TSDB directory (``--storage.tsdb.path``)."""
    targets: Mapping[str, tuple[str, ...]]
    """Scrape jobs as configured: job name → ``("127.0.0.1:port", …)``."""
    component: components.Component

    def stop(self) -> None:
        """Stop it by pid (SIGTERM, then SIGKILL after 10 s)."""
        components.stop_component(self.component)

    def query(self, expr: str, *, time: float | None = None) -> list[dict[str, Any]]:
        """Evaluate PromQL `expr` as an instant query (``/api/v1/query``).

        Args:
            expr: the PromQL expression.
            time: evaluation time, Unix seconds; None means now.

        Returns:
            One dict per sample, ``{"metric": {label: value}, "value": [unix_ts, "text"]}``
            (the value is a string, as Prometheus sends it; ``float()`` it). A vector gives
            one per series (``[]`` when nothing matched); a scalar or string result is
            returned as a single sample with empty labels. Range vectors (``x[5m]``) give
            ``{"metric": …, "values": [[ts, "text"], …]}`` per series.

        Raises:
            PrometheusAPIError: Prometheus rejected the query (its error text is in the
                message) or could not be reached.
        """
        params = {"query": expr}
        if time is not None:
            params["time"] = f"{time:.3f}"
        data = self._call("/api/v1/query", form=params)
        result = data.get("result", [])
        if data.get("resultType") in ("scalar", "string"):
            return [{"metric": {}, "value": result}]
        return list(result)

    def parse(self, expr: str) -> dict[str, Any]:
        """The syntax tree of PromQL `expr`, as Prometheus' own parser reads it.

        Uses ``/api/v1/parse_query``; nothing is evaluated. Each node is a dict with a
        ``type`` (``vectorSelector``, ``matrixSelector``, ``call``, ``aggregation``,
        ``binaryExpr``, ``unaryExpr``, ``parenExpr``, ``subquery``, ``numberLiteral``,
        ``stringLiteral``) and that type's fields (selectors: ``name`` and ``matchers``
        ``[{"name", "type", "value"}]``; ranges in milliseconds).

        Raises:
            PrometheusAPIError: `expr` is not valid PromQL (``bad_data``, with the parser's
                message and position), or Prometheus could not be reached.
        """
        return self._call("/api/v1/parse_query", form={"query": expr})

    def value(self, expr: str, *, time: float | None = None) -> float | None:
        """The single value of `expr` (a one-series vector or a scalar), or None if empty.

        Raises:
            PrometheusAPIError: like `query`.
            ValueError: the result holds more than one series.
        """
        samples = self.query(expr, time=time)
        if not samples:
            return None
        if len(samples) > 1:
            raise ValueError(f"{expr!r} returned {len(samples)} series, expected one: {samples}")
        return float(samples[0]["value"][1])

    def active_targets(self) -> list[dict[str, Any]]:
        """The active scrape targets (``/api/v1/targets?state=active``).

        Each dict holds ``labels`` (with ``job`` and ``instance``), ``scrapeUrl``,
        ``health`` (``"up"``, ``"down"`` or ``"unknown"``) and ``lastError``.
        Raises PrometheusAPIError like `query`.
        """
        data = self._call("/api/v1/targets?state=active")
        return list(data.get("activeTargets", []))

    def wait_for_targets_up(self, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Wait until every configured target has been scraped successfully (health "up").

        Returns the active targets (see `active_targets`). Raises TimeoutError naming the
        targets that are not up and their last scrape error, or PrometheusAPIError.
        """
        wanted = {
            (job, address) for job, addresses in self.targets.items() for address in addresses
        }
        deadline = time.monotonic() + timeout
        while True:
            active = self.active_targets()
            health = {
                (t["labels"].get("job", ""), t["labels"].get("instance", "")): t for t in active
            }
            pending = {key for key in wanted if health.get(key, {}).get("health") != "up"}
            if not pending:
                return active
            if time.monotonic() >= deadline:
                details = "; ".join(
                    f"{job}/{address}: {health[(job, address)]['health']}"
                    f" ({health[(job, address)].get('lastError') or 'not scraped yet'})"
                    if (job, address) in health
                    else f"{job}/{address}: not an active target"
                    for job, address in sorted(pending)
                )
                raise TimeoutError(f"targets not up within {timeout:g} s: {details}")
            time.sleep(0.2)

    def rules(self) -> list[dict[str, Any]]:
        """The loaded rule groups (``/api/v1/rules``).

        Each group dict holds ``name``, ``file`` and ``rules``; each rule holds ``name``,
        ``query``, ``type`` (``"alerting"`` or ``"recording"``), ``health`` (``"ok"``,
        ``"err"`` or ``"unknown"`` before its first evaluation) and ``lastError``; alerting
        rules also ``state`` and ``alerts``. Raises PrometheusAPIError like `query`.
        """
        data = self._call("/api/v1/rules")
        return list(data.get("groups", []))

    def alerts(self) -> list[dict[str, Any]]:
        """The active alerts, pending or firing (``/api/v1/alerts``).

        Each dict holds ``labels`` (with ``alertname``), ``annotations`` (templates
        expanded), ``state`` (``"pending"`` or ``"firing"``), ``activeAt`` and ``value``.
        Raises PrometheusAPIError like `query`.
        """
        data = self._call("/api/v1/alerts")
        return list(data.get("alerts", []))

    def wait_for_rules_evaluated(self, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Wait until every loaded rule has been evaluated once; returns `rules()` then.

        A rule whose evaluation failed counts as evaluated (its ``health`` is ``"err"``):
        check ``health`` and ``lastError`` on the result. Raises TimeoutError naming the
        rules still unevaluated, or PrometheusAPIError.
        """
        deadline = time.monotonic() + timeout
        while True:
            groups = self.rules()
            unevaluated = [
                rule.get("name", "?")
                for group in groups
                for rule in group.get("rules", [])
                if rule.get("health") == "unknown"
            ]
            if not unevaluated:
                return groups
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"rules not evaluated within {timeout:g} s: {', '.join(unevaluated)}"
                )
            time.sleep(0.2)

    def _call(self, path: str, *, form: Mapping[str, str] | None = None) -> dict[str, Any]:
        """GET `path` (or POST `form` to it) and return the envelope's ``data``."""
        body = None if form is None else urllib.parse.urlencode(form).encode()
        request = urllib.request.Request(self.url + path, data=body)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=_HTTP_TIMEOUT) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:  # 400 / 422 / 503 carry an error envelope
            raw = exc.read()
        except OSError as exc:
            raise PrometheusAPIError(f"cannot reach Prometheus at {self.url}{path}: {exc}") from exc
        try:
            envelope = json.loads(raw)
        except ValueError as exc:
            raise PrometheusAPIError(
                f"Prometheus at {self.url}{path} sent no JSON: {raw[:300]!r}"
            ) from exc
        if envelope.get("status") != "success":
            error_type, error = str(envelope.get("errorType", "")), str(envelope.get("error", ""))
            what = f" for {form['query']!r}" if form and "query" in form else ""
            raise PrometheusAPIError(
                f"Prometheus {path.split('?')[0]}{what} failed: {error_type}: {error}",
                error_type=error_type,
                error=error,
            )
        data = envelope.get("data", {})
        return data if isinstance(data, dict) else {"result": data}


def start_prometheus(
    workdir: Path,
    *,
    targets: Mapping[str, Sequence[str]],
    rule_files: Sequence[Path] = (),
    scrape_interval: str = "1s",
    evaluation_interval: str = "1s",
    prometheus_binaries: PrometheusBinaries | None = None,
    launch: components.Launch | None = None,
    ready_timeout: float = 60.0,
) -> PrometheusServer:
    """Start Prometheus on a free loopback port, scraping `targets` and evaluating `rule_files`.

    Writes ``workdir/prometheus.yml`` (one job per `targets` key with a static config of its
    addresses), keeps the TSDB in ``workdir/data`` and waits until ``/-/ready`` answers. The
    log is ``prometheus.log`` in the launch's log directory (default ``workdir/logs``).

    Args:
        workdir: directory for the config and TSDB (created if needed).
        targets: job name → ``["127.0.0.1:port", …]``, scraped at ``/metrics`` over http.
        rule_files: recording / alerting rule files, loaded as they are.
        scrape_interval, evaluation_interval: Prometheus durations, e.g. ``"1s"``.
        prometheus_binaries: which binaries (default `ensure_prometheus()`, which may build
            them).
        launch: log directory, lifetime and progress output of the process.
        ready_timeout: seconds to wait for ``/-/ready``.

    Raises:
        probes.NotReadyError: it exited (e.g. a rule file does not parse) or was not ready
            within `ready_timeout`; the message holds its log tail; it is stopped first.
        PrometheusBinariesError, gobuild.BuildError: see `ensure_prometheus`.
    """
    launch = components.Launch(log_dir=workdir / "logs") if launch is None else launch
    found = prometheus_binaries or ensure_prometheus(log=launch.log)
    workdir.mkdir(parents=True, exist_ok=True)
    storage = workdir / "data"
    config_path = workdir / "prometheus.yml"
    jobs = {job: tuple(addresses) for job, addresses in targets.items()}
    config_path.write_text(
        prometheus_config(
            jobs,
            rule_files=rule_files,
            scrape_interval=scrape_interval,
            evaluation_interval=evaluation_interval,
        )
    )
    port = probes.free_port()
    argv = [
        str(found.prometheus),
        f"--config.file={config_path}",
        f"--storage.tsdb.path={storage}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=info",
        # Hidden flag, default 5s: how long the scrape manager batches target updates, so the
        # static targets would only be scraped ~5 s after start.
        "--scrape.discovery-reload-interval=250ms",
    ]
    url = f"http://127.0.0.1:{port}"
    component = launch.start(
        dataclasses.replace(launch.spec("prometheus", argv), cwd=workdir),
        probe=probes.Probe(url=f"{url}/-/ready"),
        ports={"web": port},
        ready_timeout=ready_timeout,
    )
    return PrometheusServer(
        url=url, config_path=config_path, storage_dir=storage, targets=jobs, component=component
    )


def prometheus_config(
    targets: Mapping[str, Sequence[str]],
    *,
    rule_files: Sequence[Path] = (),
    scrape_interval: str = "1s",
    evaluation_interval: str = "1s",
) -> str:
    """The ``prometheus.yml`` text that `start_prometheus` writes (see there for the args)."""
    config = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval},
        "rule_files": [str(Path(p).resolve()) for p in rule_files],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": list(addresses)}]}
            for job, addresses in targets.items()
        ],
    }
    return yaml.safe_dump(config, sort_keys=False)


def promtool_check_metrics(promtool: Path, text: str) -> tuple[bool, str]:
    """``promtool check metrics`` on the exposition `text` (passed on stdin).

    Returns (clean, output): clean is True when promtool exits 0, i.e. the text parses and
    has no lint problems (such as a counter without the ``_total`` suffix); output is
    promtool's stdout and stderr, one problem per line.
    Raises subprocess.TimeoutExpired if promtool hangs for 60 s, OSError if it cannot run.
    """
    return _promtool(promtool, ["check", "metrics"], stdin=text)


def promtool_check_rules(
    promtool: Path, path: Path, *, lint_fatal: bool = True
) -> tuple[bool, str]:
    """``promtool check rules`` on the rules file at `path`.

    Returns (clean, output): clean is True when promtool exits 0, i.e. the YAML and every
    PromQL expression parse, and (with `lint_fatal`, the default) there are no lint
    findings such as duplicate rules. Output is promtool's stdout and stderr.
    Raises like `promtool_check_metrics`.
    """
    args = ["check", "rules", *(["--lint-fatal"] if lint_fatal else []), str(path)]
    return _promtool(promtool, args, stdin=None)


def _promtool(promtool: Path, args: list[str], *, stdin: str | None) -> tuple[bool, str]:
    result = subprocess.run(
        [str(promtool), *args],
        input=stdin,
        stdin=subprocess.DEVNULL if stdin is None else None,
        capture_output=True,
        text=True,
        timeout=_PROMTOOL_TIMEOUT,
        check=False,
    )
    return result.returncode == 0, (result.stdout + result.stderr).strip()


def _from_override(directory: Path) -> PrometheusBinaries:
    missing = binaries.missing_in(directory, NAMES)
    if missing:
        raise PrometheusBinariesError(
            f"PROMETHEUS_BINARIES={directory} lacks {' and '.join(missing)}: point it at a"
            " directory holding prometheus and promtool, or unset it to build them from source"
        )
    return PrometheusBinaries(prometheus=directory / "prometheus", promtool=directory / "promtool")


def _build(bin_dir: Path, *, names: list[str], log: console.Log) -> None:
    log(
        f"building {', '.join(names)} (Prometheus {PROMETHEUS_RELEASE}, module"
        f" {PROMETHEUS_MODULE_VERSION}) from the Go module proxy into {bin_dir}; this takes a"
        " while once per machine"
    )
    started = time.monotonic()
    gobuild.build_prometheus(
        bin_dir, module_version=PROMETHEUS_MODULE_VERSION, names=names, log=log
    )
    minutes, seconds = divmod(int(time.monotonic() - started), 60)
    log(f"built {', '.join(names)} in {minutes}m{seconds:02d}s")
