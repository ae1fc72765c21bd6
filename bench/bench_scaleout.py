"""Worker scale-out: the same batch with 1, 2 and 4 worker processes, turns/s and CPU per turn
of every process for each, and where adding workers stops paying on this machine.

For each count in ``--workers`` (``1,2,4``), a stack of its own (kube-apiserver + etcd,
nats-server, the scripted model, one operator and that many workers; closed bus as shipped), a
warm-up, then ``bench_compare.batch``: ``--runs`` runs of ``--turns`` turns (one ``calculate``
call a turn, then the answer) applied at once on the zero-latency scripted model, turns/s from
the first admission to the last end event as JetStream stored them, and each process's CPU per
turn less its idle rate. ``speedup`` is each count's turns/s over one worker's, and
``workers_cpu_ms_per_turn`` the workers' CPU per turn summed, so a worker that only waits
shows as no speed-up at the same CPU, and contention as more CPU per turn. The machine's
core count and the load average around each count are in the JSON: on a machine with fewer
cores than processes, the speed-up is bounded by the cores, not by agentrun.

    cd bench && ../.venv/bin/python bench_scaleout.py [--workers 1,2,4] [--runs 100] [--turns 20]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from bench_compare import batch, warm_up
from harness import bench_stack, load_average, tree_revision, write_result

HERE = Path(__file__).parent


def measure(workers: int, *, runs: int, turns: int, idle: float, settle: float) -> dict[str, Any]:
    """One stack with `workers` worker processes; the batch's figures (``bench_compare.batch``)
    with the load average before and after. Raises RuntimeError when the workload was not run
    exactly (``bench_compare.batch``)."""
    env = {"AGENTRUN_WORKER_CONCURRENCY": str(runs + 28)}
    with bench_stack(HERE / "scenarios.yaml") as bench:
        bench.start_services(workers=workers, extra_env=env)
        warm_up(bench)
        before = load_average()
        found = batch(bench, runs=runs, turns=turns, idle=idle, settle=settle)
    return {"workers": workers, **found, "load_average": [before, load_average()]}


def workers_cpu(found: dict[str, Any]) -> float:
    """The worker processes' CPU ms per turn, summed (``worker-<n>`` in the per-process table)."""
    table = found["cpu_ms_per_turn"]["per_process"]
    return round(sum(v for name, v in table.items() if name.startswith("worker-")), 3)


def summary(counts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per worker count: turns/s, the speed-up over the first count's, the workers' and the
    operator's CPU ms per turn."""
    base = counts[0]["turns_per_second"]
    return [
        {
            "workers": found["workers"],
            "turns_per_second": found["turns_per_second"],
            "speedup": round(found["turns_per_second"] / base, 3) if base else None,
            "workers_cpu_ms_per_turn": workers_cpu(found),
            "operator_cpu_ms_per_turn": found["cpu_ms_per_turn"]["per_process"].get("operator"),
        }
        for found in counts
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", default="1,2,4", help="worker counts, comma-separated")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--idle", type=float, default=5.0, help="idle seconds measured first")
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument("--name", default="scaleout")
    args = parser.parse_args()
    counts = [
        measure(int(n), runs=args.runs, turns=args.turns, idle=args.idle, settle=args.settle)
        for n in args.workers.split(",")
    ]
    rows = summary(counts)
    for row in rows:
        print(
            f"{row['workers']} worker(s): {row['turns_per_second']} turns/s "
            f"(x{row['speedup']}), workers {row['workers_cpu_ms_per_turn']} ms CPU a turn, "
            f"operator {row['operator_cpu_ms_per_turn']} ms"
        )
    record = {
        "cores": os.cpu_count(),
        "revision": tree_revision(),
        "summary": rows,
        "counts": counts,
    }
    write_result(args.name, record)


if __name__ == "__main__":
    main()
