"""``bench_scaleout.py``'s arithmetic: the speed-up over the first worker count and the
workers' CPU per turn summed over every ``worker-<n>`` process (the stack's other processes
left out)."""

from __future__ import annotations

from typing import Any

import bench_scaleout


def count(workers: int, turns_per_second: float, per_process: dict[str, float]) -> dict[str, Any]:
    return {
        "workers": workers,
        "turns_per_second": turns_per_second,
        "cpu_ms_per_turn": {"per_process": per_process},
    }


def test_the_summary_gives_each_count_its_speedup_and_its_workers_cpu_per_turn() -> None:
    one = count(1, 100.0, {"operator": 3.0, "worker-1": 6.0, "nats-server": 2.0})
    two = count(2, 150.0, {"operator": 3.5, "worker-1": 3.5, "worker-2": 3.25, "etcd": 0.5})
    assert bench_scaleout.summary([one, two]) == [
        {
            "workers": 1,
            "turns_per_second": 100.0,
            "speedup": 1.0,
            "workers_cpu_ms_per_turn": 6.0,
            "operator_cpu_ms_per_turn": 3.0,
        },
        {
            "workers": 2,
            "turns_per_second": 150.0,
            "speedup": 1.5,
            "workers_cpu_ms_per_turn": 6.75,
            "operator_cpu_ms_per_turn": 3.5,
        },
    ]


def test_a_first_count_that_ran_nothing_leaves_the_speedup_unrated() -> None:
    rows = bench_scaleout.summary([count(1, 0.0, {}), count(2, 10.0, {"worker-1": 1.0})])
    assert [row["speedup"] for row in rows] == [None, None]
