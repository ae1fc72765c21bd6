"""``make bench``: agentrun beside the NATS floor and the in-process peer, in one invocation on
one machine, and the ratios between them.

In order, within minutes of each other:

1. the NATS floor (``bench_floor.py``): the three JetStream round trips a turn's overhead path
   needs at the least, with nats-py on loopback, per hop and summed, against a nats-server
   closed as the stack's (TLS, JWT auth; both open with ``--open-bus``);
2. the peer (``bench_peer.py``): the OpenAI Agents SDK's in-process ``Runner`` in its own
   virtualenv, ``--runs`` × ``--turns`` (one tool call a turn) on the scripted model;
3. agentrun on the real local stack (kube-apiserver + etcd, nats-server, the scripted model,
   one operator, ``--workers`` workers): a warm-up, then the overhead per turn (committed
   event n → model request n+1, runs one at a time, as ``bench_overhead.py``), then the same
   ``--runs`` × ``--turns`` as the peer at once: turns per second (first admission → last end
   event, as JetStream stored them) and each process's CPU per turn over that batch (read
   from ``/proc`` before it is applied and after its last run ended plus ``--settle`` s, less
   each process's idle rate), with the API requests and NATS messages per turn (exact counts).

The workload is the same on both sides (``harness.workload_scenario``): each run is
``--turns`` turns of one ``calculate`` call, then a final answer that ends it. A turn in the
per-turn figures is one model call (``--turns`` + 1 a run), as the scripted model counted
them on each side; the CPU sums leave the model server out (``sum_without_model_server``) as
the stand-in for a provider. The ratios
(``figures.ratios``) and whether they meet the round's targets are printed last; everything is
written to ``bench/results/compare.json`` with the load average seen around each part.

    cd bench && ../.venv/bin/python bench_compare.py [--quick] [--runs 100] [--turns 20]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import bench_floor
import bench_peer
import figures
from bench_overhead import overhead_gaps
from harness import (
    BenchStack,
    agent_run,
    api_requests,
    bench_stack,
    cpu_seconds,
    cpu_used,
    idle_rates,
    load_average,
    mock_add_scenarios,
    mock_request_count,
    mock_reset,
    nats_messages,
    read_events,
    tree_revision,
    workload_scenario,
    write_result,
)

from agentrun_dev import stack

HERE = Path(__file__).parent
FULL = {
    "runs": 100,
    "turns": 20,
    "overhead_runs": 5,
    "overhead_turns": 40,
    "floor_samples": 2000,
    "idle": 10.0,
}
QUICK = {
    "runs": 20,
    "turns": 10,
    "overhead_runs": 2,
    "overhead_turns": 20,
    "floor_samples": 300,
    "idle": 3.0,
}
"""``--quick``: a couple of minutes, for a change's cost at a glance; its ratios are noisier."""


def warm_up(bench: BenchStack, *, runs: int = 5) -> None:
    """A few short runs, not measured: connections, caches and first-use costs."""
    names = [f"warm-{i}" for i in range(runs)]
    bench.apply([agent_run(name, f"BENCH {name}", max_steps=3) for name in names])
    bench.wait_all_terminal(runs, timeout=300, names=names)


def batch(
    bench: BenchStack, *, runs: int, turns: int, idle: float, settle: float
) -> dict[str, Any]:
    """The measured batch: ``runs`` runs of ``turns`` turns applied at once; throughput, CPU
    per turn of every process, requests and messages per turn, turns and tool calls per run."""
    base_url = stack.mockllm_url(bench.mock)
    scenario, goal, document = workload_scenario(turns)
    mock_add_scenarios(base_url, document)
    pids = bench.processes()
    api0, nats0 = api_requests(bench), nats_messages(bench)
    rates = idle_rates(pids, idle)
    mock_reset(base_url)
    names = [f"tp-{i}" for i in range(runs)]
    before, started = cpu_seconds(pids), time.monotonic()
    # the cap is a guard: the scripted model ends each run with its answer
    bench.apply([agent_run(name, f"{goal}{name}", max_steps=turns + 5) for name in names])
    # poll slowly: every kubectl list of the runs costs the API server (counted in its CPU)
    statuses = bench.wait_all_terminal(runs, timeout=900, poll=3.0, names=names)
    time.sleep(settle)
    used, window = cpu_used(before, cpu_seconds(pids)), time.monotonic() - started
    api = {k: v - api0.get(k, 0) for k, v in api_requests(bench).items() if v - api0.get(k, 0)}
    sent = {k: v - nats0.get(k, 0) for k, v in nats_messages(bench).items()}
    model_calls = mock_request_count(base_url, scenario=scenario)
    events = read_events(bench.nats, "default", names)
    first = min(stamp for evs in events.values() for _, stamp in evs[:1])
    last = max(stamp for evs in events.values() for _, stamp in evs[-1:])
    reasons = sorted({str(s.get("terminalReason")) for s in statuses})
    tool_calls = sum(s["usage"]["toolCalls"] for s in statuses)
    problem = figures.workload_problem(
        runs=runs, turns=turns, model_calls=model_calls, tool_calls=tool_calls
    )
    if problem is not None or reasons != ["completed"]:
        raise RuntimeError(f"agentrun did not run the workload: {problem}; runs ended {reasons}")
    per_turn = figures.cpu_per_turn_ms(used, rates, seconds=window, turns=model_calls)
    return {
        "runs": runs,
        "turns": model_calls,
        "steps_per_run": sum(s["usage"]["steps"] for s in statuses) / runs,
        "tool_calls_per_run": tool_calls / runs,
        "terminal_reasons": reasons,
        "seconds_first_admission_to_last_end": round(last - first, 3),
        "turns_per_second": round(model_calls / max(last - first, 1e-9), 1),
        "cpu_window_seconds": round(window, 2),
        "cpu_ms_per_turn": figures.cpu_table(per_turn),
        "idle_cpu_percent": {k: round(v * 100, 2) for k, v in rates.items()},
        "api_requests_per_turn": {k: round(v / model_calls, 3) for k, v in api.items()},
        "nats_messages_sent_per_turn": {k: round(v / model_calls, 3) for k, v in sent.items()},
    }


def measure_agentrun(args: argparse.Namespace) -> dict[str, Any]:
    """agentrun's figures on one stack: overhead per turn, then the measured batch."""
    env = {"AGENTRUN_WORKER_CONCURRENCY": str(args.runs + 28)}
    with bench_stack(HERE / "scenarios.yaml", closed=not args.open_bus) as bench:
        bench.start_services(workers=args.workers, extra_env=env)
        warm_up(bench)
        gaps = overhead_gaps(bench, runs=args.overhead_runs, turns=args.overhead_turns)
        time.sleep(args.settle)  # the last overhead run's trailing writes are not the batch's
        found = batch(bench, runs=args.runs, turns=args.turns, idle=args.idle, settle=args.settle)
    return {"workers": args.workers, "overhead": figures.spread(gaps), **found}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Options; ``--quick`` sets the defaults of `QUICK` instead of `FULL` (explicit options
    still win)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a small run (a couple of minutes)")
    parser.add_argument("--runs", type=int, help="concurrent runs in the batch (100)")
    parser.add_argument("--turns", type=int, help="turns per run, one tool call each (20)")
    parser.add_argument("--workers", type=int, default=1, help="agentrun worker processes")
    parser.add_argument("--overhead-runs", type=int, help="runs for the overhead figure (5)")
    parser.add_argument("--overhead-turns", type=int, help="turns per overhead run (40)")
    parser.add_argument("--floor-samples", type=int, help="floor iterations (2000)")
    parser.add_argument("--idle", type=float, help="seconds of idle measured before a batch")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds after a batch ends")
    parser.add_argument("--open-bus", action="store_true", help="floor and stack on open NATS")
    parser.add_argument("--name", default="compare", help="result file name (default compare)")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started = time.monotonic()
    load: dict[str, list[float]] = {"start": load_average()}
    floor = bench_floor.measure(samples=args.floor_samples, closed=not args.open_bus)
    load["after_floor"] = load_average()
    peer = bench_peer.measure(runs=args.runs, turns=args.turns, idle=min(args.idle, 3.0))
    load["after_peer"] = load_average()
    ours = measure_agentrun(args)
    load["after_agentrun"] = load_average()
    found = figures.ratios(floor, peer, ours)
    record = {
        "tree": tree_revision(),
        "quick": args.quick,
        "bus": "open" if args.open_bus else "closed (TLS, JWT auth, role permissions)",
        "workload": {"runs": args.runs, "turns": args.turns, "tool_calls_per_turn": 1},
        "cores": len(os.sched_getaffinity(0)),
        "load_average": load,
        "seconds": round(time.monotonic() - started, 1),
        "floor": floor,
        "peer": peer,
        "agentrun": ours,
        "ratios": found,
        "targets": {k: f"{how} {bound:.3g}" for k, (how, bound) in figures.TARGETS.items()},
        "targets_met": figures.targets_met(found),
    }
    write_result(args.name, record, quiet=True)
    print(*figures.report_lines(record), sep="\n")
    print(f"load average (1, 5, 15 min) around the parts: {load}; {record['cores']} cores")
    print(f"took {record['seconds']} s")


if __name__ == "__main__":
    main()
