"""``bench_streams.py`` made tiny: one closed server at R1, then a closed three-server cluster
at R3, each measured for the floor's hops and the four throughput figures, and the R3-over-R1
ratios written. Not a benchmark: the figures are checked for being there and consistent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import bench_streams

BENCH = Path(__file__).resolve().parents[2] / "bench"
THROUGHPUT = {
    "publish_per_s",
    "work_queue_per_s",
    "cas_per_s",
    "hot_cas_per_s",
    "hot_cas_retries_per_success",
}


def test_a_tiny_run_measures_one_server_and_three_and_writes_their_ratios(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "AGENTRUN_BENCH_RESULTS": str(tmp_path)}
    tiny = ["--seconds", "0.5", "--concurrency", "3", "--samples", "20", "--name", "tiny"]
    done = subprocess.run(
        [sys.executable, "bench_streams.py", *tiny],
        cwd=BENCH,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads((tmp_path / "tiny.json").read_text())
    assert (record["r1"]["servers"], record["r1"]["replicas"]) == (1, 1)
    assert (record["r3"]["servers"], record["r3"]["replicas"]) == (3, 3)
    for side in (record["r1"], record["r3"]):
        assert set(side["throughput"]) == THROUGHPUT
        assert all(
            side["throughput"][name] > 0 for name in THROUGHPUT - {"hot_cas_retries_per_success"}
        )
        assert side["hops"]["samples"] == 20
        assert set(side["hops"]["hops"]) == {"publish", "work_queue", "kv_cas"}
    publish = (
        record["r3"]["throughput"]["publish_per_s"] / record["r1"]["throughput"]["publish_per_s"]
    )
    assert record["r3_over_r1"]["publish_per_s"] == round(publish, 3)
    assert "R3 over R1" in done.stdout


def test_ratios_divide_each_r3_figure_by_its_r1_figure_and_leave_a_zero_unrated() -> None:
    r1 = {"throughput": {"publish_per_s": 200.0, "cas_per_s": 0.0}, "hops": {"sum_p50_ms": 2.0}}
    r3 = {"throughput": {"publish_per_s": 100.0, "cas_per_s": 5.0}, "hops": {"sum_p50_ms": 5.0}}
    assert bench_streams.ratios(r1, r3) == {
        "publish_per_s": 0.5,
        "cas_per_s": None,
        "floor_sum_p50_ms": 2.5,
    }
