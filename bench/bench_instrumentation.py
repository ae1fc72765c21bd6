"""Cost of instrumentation: the throughput benchmark with tracing exported vs not.

Metrics (prometheus-client counters and histograms) are always recorded; "on" adds OpenTelemetry
spans for every run, model call and tool call, exported (console exporter, to the process
logs). Runs alternate off/on ``--rounds`` times; medians and their ratio are reported.
Target: on is at most 10% slower.

    cd bench && ../.venv/bin/python bench_instrumentation.py [--rounds 2]
"""

from __future__ import annotations

import argparse

from bench_throughput import measure
from harness import median, write_result

TRACING = {"OTEL_TRACES_EXPORTER": "console"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--turns", type=int, default=20)
    args = parser.parse_args()
    off: list[float] = []
    on: list[float] = []
    for _ in range(args.rounds):
        off.append(float(measure(args.runs, args.turns, {})["turns_per_second"]))  # type: ignore[arg-type]
        on.append(float(measure(args.runs, args.turns, TRACING)["turns_per_second"]))  # type: ignore[arg-type]
    slower = 1 - median(on) / median(off)
    write_result(
        "instrumentation",
        {
            "turns_per_second_tracing_off": off,
            "turns_per_second_tracing_on": on,
            "median_off": round(median(off), 1),
            "median_on": round(median(on), 1),
            "slowdown": round(slower, 3),
            "target": "tracing on at most 10% slower",
        },
    )


if __name__ == "__main__":
    main()
