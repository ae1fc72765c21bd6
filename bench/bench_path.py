"""Where a turn's overhead goes: ``bench_overhead.py``'s path (committed event of turn n →
model request of turn n+1, runs one at a time) cut into its steps, with the NATS floor's hops
measured in the same run beside them.

The operator and the worker run with ``probes/sitecustomize.py`` loaded (``PYTHONPATH``),
which times, per turn: the event's delivery to the operator (JetStream's store time → the
operator's handler), the operator's work until it publishes the TurnRequest, the publish
until JetStream's ack, the TurnRequest's delivery to the worker (its store time → the
worker's handler), the worker's work before the model call (history, the kernel's plan, the
tenant-ledger reservation), and the ``openai`` client's work until the request's headers are
on the wire; the scripted model's arrival time closes the path. Like the overhead, a path
runs from a turn's event to the next request (a run's admission → its turn 0 is kept apart:
``first_turns``, where the worker reads a history it has not cached). p50, p90 and p99 per
step, in milliseconds; each step's share of the whole path's median; and, for the slowest 5 %
of the turns, each step's median over those turns and the step that slowed each most
(``slowest_turns``): where the tail comes from.

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
from harness import bench_stack, load_average, read_events, write_result

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
SLOWEST = 0.05
"""The part of the turns (by their whole path) whose steps ``slowest_turns`` shows."""
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
    """p50/p90/p99 (ms) and samples of each step over the turns that reached both its marks."""
    took = [durations(m, steps) for m in marks.values()]
    out: dict[str, dict[str, float]] = {}
    for label, _, _ in steps:
        values = [turn[label] for turn in took if label in turn]
        out[label] = {
            "p50_ms": round(percentile(values, 0.5), 3),
            "p90_ms": round(percentile(values, 0.9), 3),
            "p99_ms": round(percentile(values, 0.99), 3),
            "samples": len(values),
        }
    return out


def slowest_turns(
    marks: dict[int, dict[str, float]], steps: tuple[tuple[str, str, str], ...], *, part: float
) -> dict[str, Any]:
    """Where the slowest turns' time went: of the turns whose whole path (committed →
    arrival) is in the slowest ``part`` (0.05: the slowest 5 %, at least one turn), the
    median path (ms), each step's median (ms) over those turns, and how many of them each
    step slowed most (its time above its own median over all turns: ``slowed_most``). A step
    whose median there is far above its p50 over all turns is where the tail comes from. Empty
    when no turn has the whole path."""
    whole = sorted(
        (m for m in marks.values() if "arrival" in m and "committed" in m),
        key=lambda m: m["arrival"] - m["committed"],
    )
    slow = whole[-max(1, round(len(whole) * part)) :] if whole else []
    if not slow:
        return {}
    typical = {label: row["p50_ms"] for label, row in step_figures(marks, steps).items()}
    took = [durations(m, steps) for m in slow]
    steps_ms: dict[str, float] = {}
    for label, _, _ in steps:
        values = [turn[label] for turn in took if label in turn]
        steps_ms[label] = round(percentile(values, 0.5), 3) if values else 0.0
    slowed = collections.Counter(
        max(turn, key=lambda label: turn[label] - typical[label]) for turn in took if turn
    )
    path = [1000 * (m["arrival"] - m["committed"]) for m in slow]
    return {
        "turns": len(slow),
        "path_ms": round(percentile(path, 0.5), 3),
        "steps_ms": steps_ms,
        "slowed_most": dict(slowed.most_common()),
    }


def durations(m: dict[str, float], steps: tuple[tuple[str, str, str], ...]) -> dict[str, float]:
    """How long (ms) each step of ``steps`` took in the turn with marks ``m``, for the steps
    whose two marks it reached."""
    return {
        label: 1000 * (m[end] - m[start]) for label, start, end in steps if start in m and end in m
    }


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
            events = read_events(bench.nats, "default", [f"path-{i}" for i in range(args.runs)])
        marks = marks_of(Path(folder))  # written as the processes stopped
        missing = sorted({m for p in Path(folder).glob("*.missing") for m in p.read_text().split()})
    arrivals = _arrivals_by_request(requests, marks)
    for seq, at in arrivals.items():
        marks[seq]["arrival"] = at
    turns = {e.seq for run in events.values() for e, _ in run if e.kind == "turn"}
    first = {seq: m for seq, m in marks.items() if seq not in turns}  # admission → turn 0
    marks = {seq: m for seq, m in marks.items() if seq in turns}  # the overhead's paths
    path = step_figures(marks, STEPS)
    whole = [
        1000 * (m["arrival"] - m["committed"])
        for m in marks.values()
        if "arrival" in m and "committed" in m
    ]
    slow = slowest_turns(marks, STEPS, part=SLOWEST)
    figures: dict[str, Any] = {
        "overhead_p50_ms": round(percentile(gaps, 0.5), 3),
        "overhead_p99_ms": round(percentile(gaps, 0.99), 3),
        "path_p50_ms": round(percentile(whole, 0.5), 3),
        "steps": path,
        "slowest_turns": slow,
        "first_turns": step_figures(first, STEPS),
        "beside_the_path": step_figures(marks, SIDE_STEPS),
        "floor": floor,
        "probe_missing": missing,
        "load_average": load_average(),
    }
    tail = f"slowest {SLOWEST:.0%}"
    print(f"{'step':52s} {'p50 ms':>8s} {'p90 ms':>8s} {'p99 ms':>8s} {'share':>6s} {tail:>11s}")
    for label, row in path.items():
        share = row["p50_ms"] / figures["path_p50_ms"] if figures["path_p50_ms"] else 0
        in_tail = slow.get("steps_ms", {}).get(label, 0.0)
        print(
            f"{label:52s} {row['p50_ms']:8.3f} {row['p90_ms']:8.3f} {row['p99_ms']:8.3f} "
            f"{share:6.0%} {in_tail:11.3f}"
        )
    print(
        f"{'the whole path (committed → arrival)':52s} {figures['path_p50_ms']:8.3f} "
        f"{'':26s} {slow.get('path_ms', 0.0):11.3f}"
    )
    print(
        "floor hops p50 (ms): " + ", ".join(f"{k} {v['p50_ms']}" for k, v in floor["hops"].items())
    )
    if slow:
        print(
            f"the step that slowed each of the slowest {slow['turns']} turns most: "
            + ", ".join(f"{label} {n}" for label, n in slow["slowed_most"].items())
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
