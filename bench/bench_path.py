"""Where a turn's overhead goes: ``bench_overhead.py``'s path (committed event of turn n →
model request of turn n+1, runs one at a time) cut into its steps, with the NATS floor's hops
measured in the same run beside them.

The operator and the worker run with ``probes/sitecustomize.py`` loaded (``PYTHONPATH``),
which times, per turn: the event's delivery to the operator (JetStream's store time → the
operator's handler), the operator's work until it publishes the TurnRequest, the publish
until JetStream's ack, the TurnRequest's delivery to the worker (its store time → the
worker's handler), the worker's work before the model call (history, the kernel's plan, the
tenant-ledger reservation), and the ``openai`` client's work until the request's headers are
on the wire; the scripted model's arrival time closes the path. Medians and p90 per step, in
milliseconds; each step's share of the whole path's median.

    cd bench && ../.venv/bin/python bench_path.py [--runs 5] [--turns 40]
"""

from __future__ import annotations

import argparse
import collections
import tempfile
from pathlib import Path
from typing import Any

from bench_floor import measure as measure_floor
from bench_overhead import mock_requests, overhead_gaps
from figures import percentile
from harness import bench_stack, load_average, write_result

HERE = Path(__file__).parent

STEPS = (
    ("event delivered to the operator", "committed", "event_received"),
    ("operator: event → TurnRequest published", "event_received", "publish_start"),
    ("operator: publish → TurnRequest stored", "publish_start", "request_stored"),
    ("TurnRequest stored → delivered to a worker", "request_stored", "request_received"),
    ("worker: received → turn started (history)", "request_received", "run_turn_start"),
    ("worker: turn started → kernel plan", "run_turn_start", "plan_start"),
    ("worker: kernel plan", "plan_start", "plan_end"),
    ("worker: plan → reservation", "plan_end", "reserve_start"),
    ("worker: tenant-ledger reservation", "reserve_start", "reserve_end"),
    ("worker: reserved → model call (span, request)", "reserve_end", "model_call_start"),
    ("openai client: call → headers on the wire", "model_call_start", "headers_start"),
    ("headers on the wire → the model's arrival", "headers_start", "arrival"),
)
"""Each step: its label, and the marks it runs from and to."""
SIDE_STEPS = (("operator: TurnRequest publish → ack", "publish_start", "publish_end"),)
"""Steps beside the path (the worker starts before the operator has its ack)."""


def marks_of(folder: Path) -> dict[int, dict[str, float]]:
    """Per committed event (its stream sequence), the first time each mark was reached (epoch
    seconds), from the probe's records in ``folder``. Raises ``KeyError`` on a step the
    probe does not write."""
    marks: dict[int, dict[str, float]] = collections.defaultdict(dict)
    for path in folder.glob("*.txt"):
        for line in path.read_text().splitlines():
            step, key, first, second = line.split()
            if key == "None":
                continue
            seen = marks[int(key)]
            a, b = float(first), float(second)
            names = {
                "event_received": ("committed", "event_received"),
                "publish": ("publish_start", "publish_end"),
                "request_received": ("request_stored", "request_received"),
                "run_turn": ("run_turn_start", "run_turn_end"),
                "plan": ("plan_start", "plan_end"),
                "reserve": ("reserve_start", "reserve_end"),
                "model_call": ("model_call_start", "model_call_end"),
                "headers_sent": ("headers_start", "headers_end"),
            }[step]
            for name, value in zip(names, (a, b), strict=True):
                seen.setdefault(name, value)
    return marks


def step_figures(
    marks: dict[int, dict[str, float]], steps: tuple[tuple[str, str, str], ...]
) -> dict[str, dict[str, float]]:
    """p50/p90 (ms) and samples of each step over the turns that reached both its marks."""
    out: dict[str, dict[str, float]] = {}
    for label, start, end in steps:
        values = [1000 * (m[end] - m[start]) for m in marks.values() if start in m and end in m]
        out[label] = {
            "p50_ms": round(percentile(values, 0.5), 3),
            "p90_ms": round(percentile(values, 0.9), 3),
            "samples": len(values),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--turns", type=int, default=40)
    args = parser.parse_args()
    floor = measure_floor(samples=1000)
    with tempfile.TemporaryDirectory(prefix="agentrun-path-") as folder:
        with bench_stack(HERE / "scenarios.yaml") as bench:
            env = {
                "PYTHONPATH": str(HERE / "probes"),
                "AGENTRUN_PATH_PROBE": folder,
                "AGENTRUN_STATUS_INTERVAL": "1",
            }
            bench.start_services(workers=1, extra_env=env)
            gaps = overhead_gaps(bench, runs=args.runs, turns=args.turns, prefix="path")
            requests = mock_requests(bench)
        marks = marks_of(Path(folder))  # written as the processes stopped
        missing = sorted({m for p in Path(folder).glob("*.missing") for m in p.read_text().split()})
    arrivals = _arrivals_by_request(requests, marks)
    for seq, at in arrivals.items():
        marks[seq]["arrival"] = at
    path = step_figures(marks, STEPS)
    whole = [
        1000 * (m["arrival"] - m["committed"])
        for m in marks.values()
        if "arrival" in m and "committed" in m
    ]
    figures: dict[str, Any] = {
        "overhead_p50_ms": round(percentile(gaps, 0.5), 3),
        "overhead_p99_ms": round(percentile(gaps, 0.99), 3),
        "path_p50_ms": round(percentile(whole, 0.5), 3),
        "steps": path,
        "beside_the_path": step_figures(marks, SIDE_STEPS),
        "floor": floor,
        "probe_missing": missing,
        "load_average": load_average(),
    }
    print(f"{'step':52s} {'p50 ms':>8s} {'p90 ms':>8s} {'share':>6s}")
    for label, row in path.items():
        share = row["p50_ms"] / figures["path_p50_ms"] if figures["path_p50_ms"] else 0
        print(f"{label:52s} {row['p50_ms']:8.3f} {row['p90_ms']:8.3f} {share:6.0%}")
    print(f"{'the whole path (committed → arrival)':52s} {figures['path_p50_ms']:8.3f}")
    print(
        "floor hops p50 (ms): " + ", ".join(f"{k} {v['p50_ms']}" for k, v in floor["hops"].items())
    )
    if missing:
        print(f"path: the probe found no {', '.join(missing)}: those steps have no samples")
    write_result("path", figures)


def _arrivals_by_request(
    requests: list[dict[str, Any]], marks: dict[int, dict[str, float]]
) -> dict[int, float]:
    """The scripted model's arrival of each probed model call, matched to its turn's key by
    time: the first arrival after the worker put the call's headers on the wire."""
    times = sorted(r["time"] for r in requests)
    out: dict[int, float] = {}
    for seq, m in marks.items():
        sent = m.get("headers_start")
        if sent is None:
            continue
        later = [t for t in times if t >= sent]
        if later:
            out[seq] = later[0]
    return out


if __name__ == "__main__":
    main()
