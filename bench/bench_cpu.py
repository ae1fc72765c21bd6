"""CPU seconds per turn of every process of the stack, and the API and NATS traffic per turn:
figures for A/B comparisons on a shared machine, where wall-clock latency and turns/s swing
several-fold with the other tenants' load.

One operator, one worker, ``--runs`` concurrent runs of ``--turns`` turns each on the
zero-latency scripted model, ``--repeat`` batches. Each process's user+system CPU time
(operator, worker, nats-server, kube-apiserver, etcd, the model server) is read from the kernel
before each batch is applied and after its last run has ended (plus ``--settle`` seconds, so
the trailing status writes are counted), less its idle rate (the pull loops' polling, lease
renewals, the API server's and etcd's own timers, measured over ``--idle`` seconds first).
``total_cpu_ms_per_turn`` stays operator + worker, as before; ``stack_cpu_ms_per_turn`` has
every process and the sums with and without the model server. A warm-up batch of 5-turn
runs goes first and is not counted. CPU time still moves with
contention (shared caches, a busier scheduler: ±15 % between runs was seen on 2 busy cores), so
interleave the trees compared and take medians or minima over several runs. The request counts
(the API server's ``apiserver_request_total`` for agentrun's kinds) and the messages each
process sent to NATS (the server's ``/connz``) are exact: they show a change in what is done
per turn, independent of the machine.

    cd bench && ../.venv/bin/python bench_cpu.py [--runs 20] [--turns 20] [--repeat 1] [--open-bus]

``--open-bus`` runs nats-server open (plain text, no auth) instead of closed (TLS, JWT auth,
each process with its role's permissions, as shipped): interleave both to measure what the
closed bus costs per turn. The nats-server's own CPU per turn is reported too (TLS and the
permission checks are partly its work)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import figures
from harness import (
    BenchStack,
    agent_run,
    api_requests,
    bench_stack,
    cpu_seconds,
    cpu_used,
    idle_rates,
    median,
    nats_messages,
    write_result,
)

HERE = Path(__file__).parent


def batch(
    bench: BenchStack, *, prefix: str, runs: int, turns: int, settle: float
) -> dict[str, Any]:
    """Apply ``runs`` runs, wait for all to end; each process's CPU seconds (``cpu``), the
    turns done and the window's seconds."""
    pids = bench.processes()
    names = [f"{prefix}-{i}" for i in range(runs)]
    before = cpu_seconds(pids)
    started = time.monotonic()
    bench.apply([agent_run(name, f"BENCH cpu {name}", max_steps=turns) for name in names])
    statuses = bench.wait_all_terminal(len(names), timeout=900.0, poll=2.0, names=names)
    time.sleep(settle)
    used = cpu_used(before, cpu_seconds(pids))
    steps = sum(s["usage"]["steps"] for s in statuses)
    return {"cpu": used, "turns": steps, "seconds": time.monotonic() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument("--open-bus", action="store_true", help="nats-server without TLS, auth")
    args = parser.parse_args()
    with bench_stack(HERE / "scenarios.yaml", closed=not args.open_bus) as bench:
        bench.start_services(
            workers=1, extra_env={"AGENTRUN_WORKER_CONCURRENCY": str(args.runs + 28)}
        )
        # warm-up, not counted: first-use costs (connections, schema compilation, caches)
        # belong to no turn, and would weigh on a batch's median with few batches
        batch(bench, prefix="warm", runs=args.runs, turns=5, settle=args.settle)
        before_api, before_nats = api_requests(bench), nats_messages(bench)
        idle = idle_rates(bench.processes(), args.idle)
        results = [
            batch(bench, prefix=f"cpu{k}", runs=args.runs, turns=args.turns, settle=args.settle)
            for k in range(args.repeat)
        ]
        api = api_requests(bench)
        api = {k: v - before_api.get(k, 0) for k, v in api.items() if v - before_api.get(k, 0)}
        nats_sent = {k: v - before_nats.get(k, 0) for k, v in nats_messages(bench).items()}
    turns = sum(int(r["turns"]) for r in results)
    # the idle cost over each batch's span is subtracted: it does not scale with turns
    per_batch = [
        figures.cpu_per_turn_ms(r["cpu"], idle, seconds=r["seconds"], turns=int(r["turns"]))
        for r in results
    ]
    per_process = {name: round(median([b[name] for b in per_batch]), 3) for name in idle}
    services = [b["operator"] + b["worker-1"] for b in per_batch]
    write_result(
        "cpu-open-bus" if args.open_bus else "cpu",
        {
            "bus": "open" if args.open_bus else "closed (TLS, JWT auth, role permissions)",
            "batches": len(results),
            "turns_per_batch": [int(r["turns"]) for r in results],
            "operator_cpu_ms_per_turn": per_process["operator"],
            "worker_cpu_ms_per_turn": per_process["worker-1"],
            "total_cpu_ms_per_turn": round(median(services), 3),
            "nats_server_cpu_ms_per_turn": per_process["nats-server"],
            "stack_cpu_ms_per_turn": figures.cpu_table(per_process),
            "batch_seconds": [round(r["seconds"], 1) for r in results],
            "api_requests_per_turn": {k: round(v / turns, 3) for k, v in api.items()},
            "nats_messages_sent_per_turn": {k: round(v / turns, 3) for k, v in nats_sent.items()},
            "idle_cpu_percent": {k: round(v * 100, 2) for k, v in idle.items()},
        },
    )


if __name__ == "__main__":
    main()
