"""Control-plane overhead per turn: committed event of turn n → model request of turn n+1.

Zero-latency scripted model, one trivial tool call a turn, one worker, runs one at a time (so
the figure is the path operator → JetStream → worker, not queueing). Target:
p50 ≤ 5 ms, p99 ≤ 25 ms on a 2-core machine.

    .venv/bin/python bench/bench_overhead.py [--runs 5] [--turns 40]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness import (
    BenchStack,
    agent_run,
    bench_stack,
    median,
    percentile,
    read_events,
    write_result,
)

HERE = Path(__file__).parent


def overhead_gaps(
    bench: BenchStack, *, runs: int, turns: int, prefix: str = "overhead"
) -> list[float]:
    """Run ``runs`` runs of ``turns`` turns one at a time; for every turn n with a turn n+1,
    milliseconds from turn n's event as JetStream stored it to the scripted model's arrival
    time of request n+1 (both this machine's wall clock)."""
    gaps_ms: list[float] = []
    for i in range(runs):
        name, goal = f"{prefix}-{i}", f"BENCH {prefix} {i}"
        bench.apply([agent_run(name, goal, max_steps=turns)])
        bench.wait_all_terminal(1, timeout=300, names=[name])
        events = read_events(bench.nats, "default", [name])[name]
        requests = [
            r
            for r in mock_requests(bench)
            if any(m.get("content") == goal for m in r["body"]["messages"][:2])
        ]
        arrivals = {r["turn"]: r["time"] for r in requests}
        for event, stored in events:
            record = event.record if event.kind == "turn" else None
            if record is not None and record.turn + 1 in arrivals:
                gaps_ms.append((arrivals[record.turn + 1] - stored) * 1000)
    return gaps_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--turns", type=int, default=40)
    args = parser.parse_args()
    with bench_stack(HERE / "scenarios.yaml") as bench:
        bench.start_services(workers=1, extra_env={"AGENTRUN_STATUS_INTERVAL": "1"})
        gaps_ms = overhead_gaps(bench, runs=args.runs, turns=args.turns)
        write_result(
            "overhead",
            {
                "samples": len(gaps_ms),
                "p50_ms": round(median(gaps_ms), 3),
                "p90_ms": round(percentile(gaps_ms, 0.9), 3),
                "p99_ms": round(percentile(gaps_ms, 0.99), 3),
                "target": "p50 <= 5 ms, p99 <= 25 ms",
            },
        )


def mock_requests(bench: object) -> list[dict]:  # type: ignore[type-arg]
    import json
    import urllib.request

    from agentrun_dev import stack

    base = stack.mockllm_url(bench.mock).removesuffix("/v1")  # type: ignore[attr-defined]
    with urllib.request.urlopen(f"{base}/_mock/requests", timeout=30) as response:
        data = json.loads(response.read())
    return list(data["requests"])


if __name__ == "__main__":
    main()
