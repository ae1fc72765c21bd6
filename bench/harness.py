"""Shared benchmark harness: the real local stack through ``agentrun_dev`` (the same code as
``agentrun dev up`` and the tests), plus helpers to create runs, read events, read each
process's CPU time and the exact request and message counts, and write results.

Every process is started with ``die_with_parent`` and stopped by pid on exit. Results go to
``bench/results/`` (or ``$AGENTRUN_BENCH_RESULTS``, which the A/B recipe sets per run).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml
from figures import MODEL_SERVER, percentile
from prometheus_client.parser import text_string_to_metric_families

from agentrun.bus import Bus, BusSettings
from agentrun_dev import binaries, components, controlplane, demo, kubectl, natsserver, stack

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(os.environ.get("AGENTRUN_BENCH_RESULTS") or REPO / "bench" / "results")

__all__ = ["median", "percentile"]  # re-exported for the scripts


@dataclass
class BenchStack:
    """A running stack for one benchmark."""

    workdir: Path
    launch: components.Launch
    cluster: controlplane.Cluster
    kubectl: kubectl.Kubectl
    nats: natsserver.NatsServer
    mock: components.Component
    env: dict[str, str]
    operator: components.Component | None = None
    workers: list[components.Component] = field(default_factory=list)
    stopped: list[Any] = field(default_factory=list)

    def processes(self) -> dict[str, int]:
        """Every process of the stack by name: the control plane's (``etcd``,
        ``kube-apiserver``; none for an existing cluster), ``nats-server``, the scripted model
        (``figures.MODEL_SERVER``), ``operator`` and each ``worker-<n>``, as their pids."""
        found = {c.name: c.record.pid for c in self.cluster.components}
        found["nats-server"] = self.nats.component.record.pid
        found[MODEL_SERVER] = self.mock.record.pid
        if self.operator is not None:
            found["operator"] = self.operator.record.pid
        found.update({w.name: w.record.pid for w in self.workers})
        return found

    def start_services(self, *, workers: int, extra_env: dict[str, str] | None = None) -> None:
        """Start the operator and ``workers`` worker processes."""
        env = {**self.env, **(extra_env or {})}
        self.operator = stack.start_operator(env, launch=self.launch)
        self.workers = [
            stack.start_worker(i, env=env, launch=self.launch) for i in range(1, workers + 1)
        ]

    def apply(self, documents: Sequence[dict[str, Any]], *, namespace: str = "default") -> None:
        """``kubectl apply`` a list of objects in one call."""
        body = {"apiVersion": "v1", "kind": "List", "items": list(documents)}
        self.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(body), timeout=600)

    def statuses(
        self, namespace: str = "default", *, names: Sequence[str] | None = None
    ) -> list[dict[str, Any]]:
        """Every AgentRun's status (of the runs in ``names`` only, if given)."""
        out = self.kubectl("get", "agentruns", "-n", namespace, "-o", "json", timeout=120).stdout
        wanted = None if names is None else set(names)
        return [
            item.get("status") or {}
            for item in json.loads(out)["items"]
            if wanted is None or item["metadata"]["name"] in wanted
        ]

    def wait_all_terminal(
        self,
        count: int,
        *,
        timeout: float,
        namespace: str = "default",
        poll: float = 0.5,
        names: Sequence[str] | None = None,
    ) -> list[dict[str, Any]]:
        """Poll until ``count`` runs (of ``names``, if given) have a terminal reason; their
        statuses. Each poll is a kubectl list. Raises TimeoutError after ``timeout`` s."""
        end = time.monotonic() + timeout
        while True:
            done = [s for s in self.statuses(namespace, names=names) if s.get("terminalReason")]
            if len(done) >= count:
                return done
            if time.monotonic() > end:
                raise TimeoutError(f"only {len(done)}/{count} runs ended within {timeout}s")
            time.sleep(poll)


def rss_mb(component: components.Component) -> float:
    """Resident set size of a component's process (and its children), in MiB."""
    proc = psutil.Process(component.record.pid)
    total = proc.memory_info().rss + sum(c.memory_info().rss for c in proc.children(recursive=True))
    return total / (1024 * 1024)


def agent_model(base_url: str) -> dict[str, Any]:
    """The ``mock`` AgentModel pointing at the scripted server."""
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentModel",
        "metadata": {"name": "mock"},
        "spec": {
            "baseURL": base_url,
            "model": "scripted",
            "contextWindow": 128000,
            "maxOutputTokens": 1000,
            "pricing": {"free": True},  # the demo's tenant has a cost budget
        },
    }


def agent_run(
    name: str, goal: str, *, max_steps: int, tools: Sequence[str] = ("calculate",)
) -> dict[str, Any]:
    """An AgentRun for the ``mock`` model."""
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {
            "model": "mock",
            "goal": goal,
            "tools": list(tools),
            "budget": {"maxSteps": max_steps, "maxToolCalls": 10000, "timeout": "30m"},
        },
    }


@contextlib.contextmanager
def bench_stack(scenarios: Path, *, closed: bool = True) -> Iterator[BenchStack]:
    """Control plane, CRDs, nats-server (closed, as shipped, unless ``closed`` is False) and the
    mock model; operator and workers on request. Everything is stopped by pid on the way out;
    the working directory (stores and logs, about 75 MB) is removed after a clean exit and
    kept, with its path printed, when the benchmark failed."""
    workdir = Path(tempfile.mkdtemp(prefix="agentrun-bench-"))
    launch = components.Launch(log_dir=workdir / "logs", die_with_parent=True)
    binaries.ensure_binaries()
    cluster = controlplane.open_cluster(workdir / "cp", launch=launch)
    started: list[components.Component] = []
    failed = True
    try:
        kc = kubectl.Kubectl.for_cluster(cluster)
        kubectl.apply_crds(kc, REPO / "crds")
        nats = natsserver.start_nats_server(workdir / "nats", launch=launch, closed=closed)
        mock = stack.start_mockllm([scenarios], launch=launch)
        started.append(mock)
        env = stack.service_env(kubeconfig=str(cluster.kubeconfig), nats=nats)
        kc("apply", "-f", "-", input=yaml.safe_dump(agent_model(stack.mockllm_url(mock))))
        kc("apply", "-f", "-", input=yaml.safe_dump(demo.default_tenant()))
        bench = BenchStack(workdir, launch, cluster, kc, nats, mock, env)
        try:
            yield bench
        finally:
            for component in [*bench.workers, *([bench.operator] if bench.operator else [])]:
                components.stop_component(component)
            nats.stop()
        failed = False
    finally:
        for component in started:
            components.stop_component(component)
        cluster.stop()
        if failed:
            print(f"bench: the stack's files and logs are kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def read_events(
    server: natsserver.NatsServer, namespace: str, names: Sequence[str]
) -> dict[str, list[tuple[Any, float]]]:
    """For each run, its events with the JetStream store timestamp (epoch seconds)."""

    async def read() -> dict[str, list[tuple[Any, float]]]:
        bus = await Bus.connect(
            BusSettings(url=server.url, auth=server.auth()), name="bench-reader"
        )
        out: dict[str, list[tuple[Any, float]]] = {}
        try:
            import nats.js.errors

            from agentrun import protocol
            from agentrun.protocol import RunEvent

            for name in names:
                subject = protocol.event_subject(namespace, name)
                seq, events = 1, []
                while True:
                    try:
                        raw = await bus.js._jsm.get_msg(
                            protocol.STREAM_EVENTS, seq=seq, subject=subject, next=True, direct=True
                        )
                    except nats.js.errors.NotFoundError:
                        break
                    assert raw.data is not None and raw.seq is not None and raw.time is not None
                    events.append((RunEvent.decode(raw.data, seq=raw.seq), raw.time.timestamp()))
                    seq = raw.seq + 1
                out[name] = events
        finally:
            await bus.close()
        return out

    return asyncio.run(read())


def cpu_seconds(pids: Mapping[str, int]) -> dict[str, float]:
    """User plus system CPU seconds each named process (with its live children) has used so
    far, from ``/proc`` (psutil). Raises ``psutil.NoSuchProcess`` if one has exited."""
    out: dict[str, float] = {}
    for name, pid in pids.items():
        proc = psutil.Process(pid)
        total = 0.0
        for member in [proc, *proc.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                times = member.cpu_times()
                total += times.user + times.system
        out[name] = total
    return out


def cpu_used(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """CPU seconds per process between two `cpu_seconds` readings."""
    return {name: after[name] - before[name] for name in before}


def idle_rates(pids: Mapping[str, int], seconds: float) -> dict[str, float]:
    """Each process's CPU seconds per second over ``seconds`` of doing nothing (the stack's
    polling, lease renewals and timers; subtracted from a measured window)."""
    before = cpu_seconds(pids)
    time.sleep(seconds)
    return {k: v / seconds for k, v in cpu_used(before, cpu_seconds(pids)).items()}


def load_average() -> list[float]:
    """The machine's 1, 5 and 15 minute load averages, rounded."""
    return [round(x, 2) for x in os.getloadavg()]


def api_requests(bench: BenchStack, *, by_code: bool = False) -> dict[str, int]:
    """The API server's request counts for agentrun's kinds, by verb and subresource, and by
    response code if ``by_code`` (``"PATCH agentruns/status 409"``), from its
    ``apiserver_request_total``: exact, so unaffected by a noisy machine."""
    text = bench.kubectl("get", "--raw", "/metrics", timeout=60).stdout
    counts: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":  # the parser drops a counter's _total
            continue
        for sample in family.samples:
            labels = sample.labels
            if not sample.name.endswith("_total") or labels.get("group") != "agentrun.dev":
                continue
            subresource = labels.get("subresource", "")
            key = "{} {}{}{}".format(
                labels["verb"],
                labels["resource"],
                f"/{subresource}" if subresource else "",
                f" {labels.get('code', '')}" if by_code else "",
            )
            counts[key] = counts.get(key, 0) + int(sample.value)
    return dict(sorted(counts.items()))


def per_run(before: Mapping[str, int], after: Mapping[str, int], runs: int) -> dict[str, float]:
    """What each count rose by from ``before`` to ``after`` (those that moved), divided by
    ``runs``: API requests per run from two ``api_requests`` readings."""
    moved = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    return {k: round(v / runs, 3) for k, v in sorted(moved.items())}


def without_codes(counts: Mapping[str, int]) -> dict[str, int]:
    """``api_requests(by_code=True)``'s counts summed over the response codes."""
    summed: dict[str, int] = {}
    for key, count in counts.items():
        request = key.rsplit(" ", 1)[0]
        summed[request] = summed.get(request, 0) + count
    return dict(sorted(summed.items()))


def nats_messages(bench: BenchStack) -> dict[str, int]:
    """Messages each agentrun client connection sent to the stack's NATS server (``/connz``),
    by connection kind (operator, worker, worker ledger): exact, like ``api_requests``."""
    url = f"{bench.nats.monitor_url}/connz?limit=1000"
    with urllib.request.urlopen(url, timeout=10) as response:
        connz = json.loads(response.read())
    totals: dict[str, int] = {}
    for conn in connz.get("connections", []):
        name = conn.get("name", "")
        if not name.startswith("agentrun-"):
            continue
        kind = "-".join(p for p in name.split("-") if not p.isdigit())
        totals[kind] = totals.get(kind, 0) + int(conn.get("in_msgs", 0))
    return totals


def mock_request_count(base_url: str, *, scenario: str | None = None) -> int:
    """Chat requests the scripted model at ``base_url`` (``…/v1``) answered 200 since its last
    reset (of ``scenario`` only, if given)."""
    query = f"?scenario={scenario}" if scenario else ""
    url = f"{base_url.removesuffix('/v1')}/_mock/requests{query}"
    with urllib.request.urlopen(url, timeout=60) as response:
        return sum(r["status"] == 200 for r in json.loads(response.read())["requests"])


def workload_scenario(turns: int) -> tuple[str, str, str]:
    """The shared workload of the comparison: ``turns`` turns of one ``calculate`` call, then
    a final answer (``turns`` + 1 model calls; the run ends by itself, on either side).

    Returns (scenario name, goal prefix that selects it, scenario YAML for
    ``POST /_mock/scenarios?mode=append``). The goal holds no ``BENCH``: ``scenarios.yaml``'s
    endless loop matches that anywhere, and the first matching scenario wins."""
    name, goal = f"bench-workload-{turns}", f"WORKLOAD-{turns}-TURNS "
    call = {
        "tool_calls": [{"name": "calculate", "arguments": {"expression": "{turn}+1"}}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 10},
    }
    answer = {"content": "done", "usage": {"prompt_tokens": 50, "completion_tokens": 2}}
    document = {
        "scenarios": [
            {"name": name, "match": {"goal": f"^{goal}"}, "turns": [call] * turns + [answer]}
        ]
    }
    return name, goal, yaml.safe_dump(document)


def mock_add_scenarios(base_url: str, document: str) -> None:
    """Append the scenarios of the YAML ``document`` to the scripted model at ``base_url``."""
    url = f"{base_url.removesuffix('/v1')}/_mock/scenarios?mode=append"
    request = urllib.request.Request(url, data=document.encode(), method="POST")
    urllib.request.urlopen(request, timeout=30).close()


def mock_reset(base_url: str) -> None:
    """Forget the scripted model's recorded requests (``POST /_mock/reset``)."""
    url = f"{base_url.removesuffix('/v1')}/_mock/reset"
    urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=30).close()


def tree_revision() -> str:
    """``git describe --always --dirty`` of the tree the benchmark runs from ("unknown" outside
    a git checkout, e.g. an A/B tree made with ``git archive``: the recipe records its rev)."""
    try:
        done = subprocess.run(
            ["git", "-C", str(REPO), "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except OSError:
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def write_result(name: str, figures: dict[str, Any], *, quiet: bool = False) -> Path:
    """Print the figures (unless ``quiet``) and write ``<results>/<name>.json``."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": name,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": psutil.cpu_count(), "python": platform.python_version()},
        **figures,
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    if not quiet:
        for key, value in figures.items():
            print(f"{name}: {key} = {value}")
    print(f"{name}: written to {path}")
    return path


median = statistics.median
