"""Operator RSS with 1,000 AgentRun objects present (all run to their end: one turn each).
Target: ≤ 250 MB.

    .venv/bin/python bench/bench_operator_memory.py [--objects 1000]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from harness import agent_run, bench_stack, rss_mb, write_result

HERE = Path(__file__).parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--objects", type=int, default=1000)
    args = parser.parse_args()
    with bench_stack(HERE / "scenarios.yaml") as bench:
        bench.start_services(workers=2)
        assert bench.operator is not None
        idle = rss_mb(bench.operator)
        started = time.monotonic()
        for first in range(0, args.objects, 250):
            batch = [
                agent_run(f"mem-{i}", f"BENCH memory {i}", max_steps=1)
                for i in range(first, min(first + 250, args.objects))
            ]
            bench.apply(batch)
        bench.wait_all_terminal(args.objects, timeout=1200)
        settle = time.monotonic() - started
        time.sleep(3)
        samples = [rss_mb(bench.operator) for _ in range(5) if time.sleep(0.2) is None]
        write_result(
            "operator_memory",
            {
                "objects": args.objects,
                "seconds_to_all_terminal": round(settle, 1),
                "operator_rss_mb_idle": round(idle, 1),
                "operator_rss_mb_with_objects": round(max(samples), 1),
                "target": "<= 250 MB with 1,000 AgentRuns",
            },
        )


if __name__ == "__main__":
    main()
