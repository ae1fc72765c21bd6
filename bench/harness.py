"""Shared benchmark harness: the real local stack through ``agentrun_dev`` (the same code as
``agentrun dev up`` and the tests), plus helpers to create runs, read events and write results.

Every process is started with ``die_with_parent`` and stopped by pid on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

from agentrun.bus import Bus, BusSettings
from agentrun_dev import binaries, components, controlplane, demo, kubectl, natsserver, stack

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"


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

    def statuses(self, namespace: str = "default") -> list[dict[str, Any]]:
        """Every AgentRun's status."""
        out = self.kubectl("get", "agentruns", "-n", namespace, "-o", "json", timeout=120).stdout
        return [item.get("status") or {} for item in json.loads(out)["items"]]

    def wait_all_terminal(
        self, count: int, *, timeout: float, namespace: str = "default", poll: float = 0.5
    ) -> list[dict[str, Any]]:
        """Poll until ``count`` runs have a terminal reason (each poll is a kubectl list)."""
        end = time.monotonic() + timeout
        while True:
            done = [s for s in self.statuses(namespace) if s.get("terminalReason")]
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
    mock model; operator and workers on request."""
    workdir = Path(tempfile.mkdtemp(prefix="agentrun-bench-"))
    launch = components.Launch(log_dir=workdir / "logs", die_with_parent=True)
    binaries.ensure_binaries()
    cluster = controlplane.open_cluster(workdir / "cp", launch=launch)
    started: list[components.Component] = []
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
    finally:
        for component in started:
            components.stop_component(component)
        cluster.stop()


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


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def write_result(name: str, figures: dict[str, Any]) -> Path:
    """Print the figures and write ``bench/results/<name>.json``."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": name,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": psutil.cpu_count(), "python": platform.python_version()},
        **figures,
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    for key, value in figures.items():
        print(f"{name}: {key} = {value}")
    print(f"{name}: written to {path.relative_to(REPO)}")
    return path


median = statistics.median
