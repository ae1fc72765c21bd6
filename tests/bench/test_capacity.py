"""``bench/capacity.py``'s arithmetic: turns/s per core from CPU per turn (the workers'
average when there are several), API requests per run from per-turn counts, the slopes per
1,000 runs present, and a part left ``null`` when its source is missing."""

from __future__ import annotations

from typing import Any

import capacity
import pytest

COMPARE: dict[str, Any] = {
    "tree": "abc",
    "time": "t",
    "agentrun": {
        "steps_per_run": 20,
        "turns_per_second": 200.0,
        "cpu_ms_per_turn": {
            "per_process": {"operator": 1.6, "worker-1": 4.0, "worker-2": 3.0, "etcd": 0.2},
            "sum_without_model_server": 8.8,
        },
        "nats_messages_sent_per_turn": {"agentrun-worker": 3.1},
        "api_requests_per_turn": {"PATCH agentruns": 0.2, "PATCH agentruns/status": 0.125},
    },
}


def row(present: int, rss: float, settled: float, admitted: float) -> dict[str, Any]:
    return {
        "present": present,
        "operator_rss_mb": rss,
        "operator_settled_seconds": settled,
        "worker_rss_mb": 128.0,
        "apply_to_first_request": {"p50_s": 0.02},
        "bulk": {"admitted_per_second": admitted, "api_requests_per_run": {"POST agentruns": 1.0}},
    }


def test_per_turn_figures_come_from_cpu_per_turn_and_the_run_length() -> None:
    part = capacity.per_turn(COMPARE)
    assert part["turns_per_second_per_worker_core"] == pytest.approx(1000 / 3.5, abs=0.1)
    assert part["turns_per_second_per_operator_core"] == 625.0
    assert part["api_requests_per_run"] == {"PATCH agentruns": 4.0, "PATCH agentruns/status": 2.5}
    assert part["stack_cpu_ms_per_turn"] == 8.8


def test_runs_present_give_slopes_per_thousand_from_the_smallest_to_the_largest_size() -> None:
    objects = {"rows": [row(10000, 250.0, 20.0, 50.0), row(1000, 150.0, 5.0, 60.0)]}
    part = capacity.objects_part(objects)
    assert part["sizes"] == [1000, 10000]
    assert part["operator_rss_mb_per_1000_runs_present"] == pytest.approx(11.11, abs=0.01)
    assert part["operator_startup_seconds_per_1000_runs_present"] == pytest.approx(1.67, abs=0.01)
    assert part["admitted_per_second"] == [60.0, 50.0]
    one = capacity.objects_part({"rows": [row(1000, 150.0, 5.0, 60.0)]})
    assert one["operator_rss_mb_per_1000_runs_present"] is None  # one size: no slope


def test_a_missing_source_leaves_its_part_null_and_the_others_name_their_run() -> None:
    streams = {"r1": {"throughput": {"publish_per_s": 100.0}, "hops": {"sum_p50_ms": 2.0}}}
    out = capacity.capacity({"compare": COMPARE, "streams": streams, "objects": None})
    assert out["objects"] is None and out["scaleout"] is None
    assert out["streams"] == {"r1": {"publish_per_s": 100.0, "hops_p50_sum_ms": 2.0}}
    assert out["per_turn"]["measured_turns_per_second_one_worker"] == 200.0
    assert out["from"] == {
        "compare": {"tree": "abc", "time": "t"},
        "streams": {"tree": None, "time": None},
    }


def test_an_operator_that_died_is_carried_through() -> None:
    died = {"present": 50000, "after_seconds": 16.0, "log_tail": "lost the leader Lease"}
    assert capacity.objects_part({"rows": [], "operator_died": died}) == {"operator_died": died}
