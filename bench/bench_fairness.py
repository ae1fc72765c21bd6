"""Fair shares of the worker slots: how long another tenant's runs wait for their first model
call while one tenant floods, against the same runs with no flood, in one stack.

Tenant A (namespace ``bench-a``) applies ``--flood`` cheap runs (one turn each, the model
answering after ``--latency-ms``), in batches of 100 as fast as the API server takes them;
once A's turns fill the workers' slots, tenant B (``bench-b``) applies ``--runs`` runs of the
same kind, one every ``--every`` seconds. Before the flood, B applied the same runs on the idle
stack. For each of B's runs: the wait from its creation to the scripted model receiving
its first request, and the part of it after admission (its ``admitted`` event, as JetStream
stored it), which is where worker slots are waited for. "Created" is when B's ``kubectl apply``
returned (the object exists; kubectl's own start-up, a second on a busy machine, is not
counted). The target: with A flooding, B's p99
wait grows by no more than one turn's time (``--latency-ms``). It prints each figure, then a
table of B's p50/p99/max waits in both phases with their ratios (flood over no flood) and the
extra p99 against the target (``figures.fairness_lines``), and writes the JSON.

    .venv/bin/python bench/bench_fairness.py [--flood 1000] [--runs 10] [--slots 16]
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from figures import fairness_comparison, fairness_lines, wait_figures
from harness import (
    BenchStack,
    agent_run,
    bench_stack,
    load_average,
    mock_add_scenarios,
    read_events,
    tree_revision,
    write_result,
)

from agentrun_dev import stack

HERE = Path(__file__).parent
BATCH = 100
"""A's runs per ``kubectl apply``."""


def scenarios(latency_ms: int) -> str:
    """One turn each: the answer after ``latency_ms`` (tenant A's goals ``FAIR-A``, B's
    ``FAIR-B``, separate scenarios so B's requests can be listed on their own)."""
    answer = {"content": "done", "latency_ms": latency_ms, "usage": {"prompt_tokens": 20}}
    return yaml.safe_dump(
        {
            "scenarios": [
                {"name": f"fair-{t}", "match": {"goal": f"^FAIR-{t.upper()} "}, "turns": [answer]}
                for t in ("a", "b")
            ]
        }
    )


def tenant(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentTenant",
        "metadata": {"name": name},
        "spec": {"namespaces": [name]},
    }


def arrivals(base_url: str, scenario: str) -> dict[str, float]:
    """The first arrival at the scripted model of each run of ``scenario``, by run name (the
    word after the goal's prefix)."""
    url = f"{base_url.removesuffix('/v1')}/_mock/requests?scenario={scenario}"
    with urllib.request.urlopen(url, timeout=60) as response:
        recorded = json.loads(response.read())["requests"]
    first: dict[str, float] = {}
    for request in recorded:
        goal = next(m["content"] for m in request["body"]["messages"] if m["role"] == "user")
        name = goal.split()[1]
        first[name] = min(first.get(name, request["time"]), request["time"])
    return first


def submit_b(bench: BenchStack, phase: str, args: argparse.Namespace) -> dict[str, float]:
    """Apply B's runs one every ``args.every`` s; when each was created (epoch s: when its
    ``kubectl apply`` returned, so kubectl's own start-up is not counted), by name."""
    applied: dict[str, float] = {}
    for i in range(args.runs):
        name = f"b-{phase}-{i}"
        bench.apply([agent_run(name, f"FAIR-B {name}", max_steps=2, tools=())], namespace="bench-b")
        applied[name] = time.time()
        time.sleep(args.every)
    return applied


def waits(bench: BenchStack, applied: dict[str, float], seen: dict[str, float]) -> dict[str, Any]:
    """B's waits (``figures.wait_figures``, seconds): ``from_created`` (``kubectl apply``
    returned → first model request) and ``from_admission`` (admitted event → that request)."""
    names = sorted(applied)
    admitted = {
        name: next(stamp for event, stamp in events if event.kind == "admitted")
        for name, events in read_events(bench.nats, "bench-b", names).items()
    }
    return {
        "from_created": wait_figures([seen[n] - applied[n] for n in names]),
        "from_admission": wait_figures([seen[n] - admitted[n] for n in names]),
    }


def watch_b(base_url: str, seen: dict[str, float], done: threading.Event) -> None:
    """Keep B's first arrivals (the scripted model keeps a bounded number of requests)."""
    while not done.wait(0.5):
        for name, at in arrivals(base_url, "fair-b").items():
            seen[name] = min(seen.get(name, at), at)
    for name, at in arrivals(base_url, "fair-b").items():
        seen[name] = min(seen.get(name, at), at)


def flood(bench: BenchStack, count: int) -> None:
    """Apply A's ``count`` runs in batches of ``BATCH``."""
    for start in range(0, count, BATCH):
        batch = [
            agent_run(f"a-{i}", f"FAIR-A a-{i}", max_steps=2, tools=())
            for i in range(start, min(start + BATCH, count))
        ]
        bench.apply(batch, namespace="bench-a")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    env = {
        "AGENTRUN_WORKER_CONCURRENCY": str(args.slots),
        "AGENTRUN_ADMISSION_PER_NAMESPACE": str(args.admission_per_namespace),
        # the chart's Lease timings, not the dev stack's short ones: on a machine shared by
        # other builds, a 6 s renewal deadline ended the operator before the flood began
        "AGENTRUN_LEASE_DURATION": "15",
        "AGENTRUN_LEASE_RENEW_DEADLINE": "10",
    }
    with bench_stack(HERE / "scenarios.yaml") as bench:
        base = stack.mockllm_url(bench.mock)
        mock_add_scenarios(base, scenarios(args.latency_ms))
        for name in ("bench-a", "bench-b"):
            bench.kubectl("create", "namespace", name)
            bench.kubectl("apply", "-f", "-", input=yaml.safe_dump(tenant(name)))
        bench.start_services(workers=args.workers, extra_env=env)
        bench.apply([agent_run("warm", "FAIR-B warm", max_steps=2, tools=())], namespace="bench-b")
        bench.wait_all_terminal(1, timeout=300, namespace="bench-b")
        seen: dict[str, float] = {}
        done = threading.Event()
        watcher = threading.Thread(target=watch_b, args=(base, seen, done), daemon=True)
        watcher.start()
        load_before = load_average()
        quiet = submit_b(bench, "quiet", args)
        bench.wait_all_terminal(args.runs + 1, timeout=600, namespace="bench-b")
        flooding = threading.Thread(target=flood, args=(bench, args.flood), daemon=True)
        flood_started = time.monotonic()
        flooding.start()
        while len(arrivals(base, "fair-a")) < args.slots * args.workers:
            time.sleep(0.2)  # A's turns fill the slots
        loaded = submit_b(bench, "flood", args)
        bench.wait_all_terminal(2 * args.runs + 1, timeout=1800, namespace="bench-b")
        flood_left = args.flood - len(
            [s for s in bench.statuses("bench-a") if s.get("terminalReason")]
        )
        done.set()
        watcher.join()
        flooding.join()
        figures = {
            "revision": tree_revision(),
            "flood_runs": args.flood,
            "b_runs": args.runs,
            "workers": args.workers,
            "slots_per_worker": args.slots,
            "admission_per_namespace": args.admission_per_namespace,
            "turn_seconds": args.latency_ms / 1000,
            "quiet": waits(bench, quiet, seen),
            "flood": waits(bench, loaded, seen),
            "flood_runs_not_ended_when_b_was_done": flood_left,
            "flood_seconds_until_b_was_done": round(time.monotonic() - flood_started, 1),
            "load_average": {"before": load_before, "after": load_average()},
        }
    comparison = fairness_comparison(
        figures["quiet"], figures["flood"], turn_seconds=figures["turn_seconds"]
    )
    figures["comparison"] = comparison
    figures["p99_extra_wait_s"] = comparison["from_created"]["p99_extra_s"]
    figures["p99_extra_wait_after_admission_s"] = comparison["from_admission"]["p99_extra_s"]
    figures["target"] = "B's p99 wait grows by at most one turn's time (turn_seconds) in the flood"
    figures["target_met"] = comparison["from_created"]["target_met"]
    figures["target_met_after_admission"] = comparison["from_admission"]["target_met"]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--flood", type=int, default=1000, help="tenant A's runs")
    parser.add_argument("--runs", type=int, default=10, help="tenant B's runs per phase")
    parser.add_argument("--every", type=float, default=0.5, help="seconds between B's runs")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--slots", type=int, default=16, help="AGENTRUN_WORKER_CONCURRENCY")
    parser.add_argument("--latency-ms", type=int, default=200, help="one turn's model time")
    parser.add_argument(
        "--admission-per-namespace",
        type=int,
        default=4,
        help="AGENTRUN_ADMISSION_PER_NAMESPACE (1000: no bound, as before issue 21's fix)",
    )
    parser.add_argument("--name", default="fairness", help="the result file's name")
    args = parser.parse_args()
    record = measure(args)
    write_result(args.name, record)
    print("\n".join(fairness_lines(record)))


if __name__ == "__main__":
    main()
