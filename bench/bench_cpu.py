"""CPU seconds per turn of the operator and the worker, and the API and NATS traffic per turn:
figures for A/B comparisons on a shared machine, where wall-clock latency and turns/s swing
several-fold with the other tenants' load.

One operator, one worker, ``--runs`` concurrent runs of ``--turns`` turns each on the
zero-latency scripted model, ``--repeat`` batches. The operator's and worker's user+system CPU
time is read from the kernel before each batch is applied and after its last run has ended
(plus ``--settle`` seconds, so the trailing status writes are counted), less their idle rate
(the pull loops' polling, measured over ``--idle`` seconds first). A warm-up batch of 5-turn
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
import json
import time
from pathlib import Path

import psutil
from harness import BenchStack, agent_run, bench_stack, median, write_result

HERE = Path(__file__).parent


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds the process ``pid`` has used so far."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def batch(
    bench: BenchStack, *, prefix: str, runs: int, turns: int, settle: float
) -> dict[str, float]:
    """Apply ``runs`` runs, wait for all to end; CPU seconds of operator, worker and
    nats-server, turns."""
    assert bench.operator is not None
    op_pid, wk_pid = bench.operator.record.pid, bench.workers[0].record.pid
    nats_pid = bench.nats.component.record.pid
    names = [f"{prefix}-{i}" for i in range(runs)]
    before = cpu_seconds(op_pid), cpu_seconds(wk_pid), cpu_seconds(nats_pid)
    started = time.monotonic()
    bench.apply([agent_run(name, f"BENCH cpu {name}", max_steps=turns) for name in names])
    statuses = wait_ended(bench, names, timeout=900.0)
    time.sleep(settle)
    after = cpu_seconds(op_pid), cpu_seconds(wk_pid), cpu_seconds(nats_pid)
    steps = sum(s["usage"]["steps"] for s in statuses)
    return {
        "operator": after[0] - before[0],
        "worker": after[1] - before[1],
        "nats": after[2] - before[2],
        "turns": steps,
        "seconds": time.monotonic() - started,
    }


def wait_ended(bench: BenchStack, names: list[str], *, timeout: float) -> list[dict[str, object]]:
    """Poll (every 2 s) until every run in ``names`` has a terminal reason; their statuses."""
    end = time.monotonic() + timeout
    wanted = set(names)
    while True:
        out = bench.kubectl("get", "agentruns", "-o", "json", timeout=120).stdout
        items = json.loads(out)["items"]
        done = [
            i.get("status") or {}
            for i in items
            if i["metadata"]["name"] in wanted and (i.get("status") or {}).get("terminalReason")
        ]
        if len(done) == len(wanted):
            return done
        if time.monotonic() > end:
            raise TimeoutError(f"only {len(done)}/{len(wanted)} runs ended within {timeout}s")
        time.sleep(2.0)


def api_requests(bench: BenchStack) -> dict[str, int]:
    """The API server's request counts for agentrun's kinds, by verb and subresource (from its
    ``apiserver_request_total``): exact, so unaffected by a noisy machine."""
    text = bench.kubectl("get", "--raw", "/metrics", timeout=60).stdout
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{") or 'group="agentrun.dev"' not in line:
            continue
        labels = dict(
            part.split("=", 1) for part in line[line.index("{") + 1 : line.index("}")].split(",")
        )
        key = "{} {}{}".format(
            labels["verb"].strip('"'),
            labels["resource"].strip('"'),
            ("/" + labels["subresource"].strip('"'))
            if labels.get("subresource", '""') != '""'
            else "",
        )
        counts[key] = counts.get(key, 0) + int(float(line.rsplit(" ", 1)[1]))
    return dict(sorted(counts.items()))


def nats_messages(bench: BenchStack) -> dict[str, int]:
    """Messages each agentrun client connection sent to the NATS server (``/connz``), by
    connection kind (operator, worker, worker ledger): exact, like ``api_requests``."""
    import urllib.request

    totals: dict[str, int] = {}
    try:
        with urllib.request.urlopen(f"{bench.nats.monitor_url}/connz?limit=1000", timeout=10) as r:
            connz = json.loads(r.read())
    except OSError:
        return totals
    for conn in connz.get("connections", []):
        name = conn.get("name", "")
        if not name.startswith("agentrun-"):
            continue
        kind = "-".join(p for p in name.split("-") if not p.isdigit())
        totals[kind] = totals.get(kind, 0) + int(conn.get("in_msgs", 0))
    return totals


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
        assert bench.operator is not None
        # warm-up, not counted: first-use costs (connections, schema compilation, caches)
        # belong to no turn, and would weigh on a batch's median with few batches
        batch(bench, prefix="warm", runs=args.runs, turns=5, settle=args.settle)
        op_pid, wk_pid = bench.operator.record.pid, bench.workers[0].record.pid
        before_api, before_nats = api_requests(bench), nats_messages(bench)
        nats_pid = bench.nats.component.record.pid
        idle0 = cpu_seconds(op_pid), cpu_seconds(wk_pid), cpu_seconds(nats_pid)
        time.sleep(args.idle)
        idle1 = cpu_seconds(op_pid), cpu_seconds(wk_pid), cpu_seconds(nats_pid)
        idle_op = (idle1[0] - idle0[0]) / args.idle
        idle_wk = (idle1[1] - idle0[1]) / args.idle
        idle_nats = (idle1[2] - idle0[2]) / args.idle
        results = [
            batch(bench, prefix=f"cpu{k}", runs=args.runs, turns=args.turns, settle=args.settle)
            for k in range(args.repeat)
        ]
        api = api_requests(bench)
        api = {k: v - before_api.get(k, 0) for k, v in api.items() if v - before_api.get(k, 0)}
        nats_sent = {k: v - before_nats.get(k, 0) for k, v in nats_messages(bench).items()}
    turns = sum(int(r["turns"]) for r in results)
    # the idle polling cost over each batch's span is subtracted: it does not scale with turns
    per_turn_op = [(r["operator"] - idle_op * r["seconds"]) / r["turns"] * 1000 for r in results]
    per_turn_wk = [(r["worker"] - idle_wk * r["seconds"]) / r["turns"] * 1000 for r in results]
    per_turn_nats = [(r["nats"] - idle_nats * r["seconds"]) / r["turns"] * 1000 for r in results]
    write_result(
        "cpu-open-bus" if args.open_bus else "cpu",
        {
            "bus": "open" if args.open_bus else "closed (TLS, JWT auth, role permissions)",
            "batches": len(results),
            "turns_per_batch": [int(r["turns"]) for r in results],
            "operator_cpu_ms_per_turn": round(median(per_turn_op), 3),
            "worker_cpu_ms_per_turn": round(median(per_turn_wk), 3),
            "total_cpu_ms_per_turn": round(
                median([a + b for a, b in zip(per_turn_op, per_turn_wk, strict=True)]), 3
            ),
            "nats_server_cpu_ms_per_turn": round(median(per_turn_nats), 3),
            "batch_seconds": [round(r["seconds"], 1) for r in results],
            "api_requests_per_turn": {k: round(v / turns, 3) for k, v in api.items()},
            "nats_messages_sent_per_turn": {k: round(v / turns, 3) for k, v in nats_sent.items()},
            "operator_idle_cpu_percent": round(idle_op * 100, 2),
            "worker_idle_cpu_percent": round(idle_wk * 100, 2),
        },
    )


if __name__ == "__main__":
    main()
