"""`make bench-quick`'s script end to end, made tiny: the floor, the peer (its own virtualenv,
built once per machine) and agentrun on a real stack, then a JSON record with every figure
and ratio. Not a benchmark: the figures are checked for being there and consistent, not fast."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrun_dev import binaries

pytestmark = pytest.mark.e2e

BENCH = Path(__file__).resolve().parents[2] / "bench"

TINY = ["--quick", "--runs", "3", "--turns", "3", "--overhead-runs", "1", "--overhead-turns", "4"]
TINY += ["--floor-samples", "30", "--idle", "1", "--settle", "1", "--name", "tiny"]
STACK = {"etcd", "kube-apiserver", "nats-server", "model-server", "operator", "worker-1"}


def test_a_tiny_compare_measures_every_part_and_writes_the_ratios(
    tmp_path: Path, devenv_binaries: binaries.Binaries
) -> None:
    env = {**os.environ, "AGENTRUN_BENCH_RESULTS": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "bench_compare.py", *TINY],
        cwd=BENCH,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads((tmp_path / "tiny.json").read_text())
    floor, peer, ours = record["floor"], record["peer"], record["agentrun"]
    assert set(floor["hops"]) == {"publish", "work_queue", "kv_cas"}
    assert floor["samples"] == 30
    assert set(peer["cpu_ms_per_turn"]["per_process"]) == {"peer", "model-server"}
    # the same workload on both sides: 3 turns of one call and an answer, 4 model calls a run
    assert peer["turns"] == ours["turns"] == 12
    assert peer["tool_calls_per_run"] == ours["tool_calls_per_run"] == 3
    assert ours["steps_per_run"] == 4
    assert ours["terminal_reasons"] == ["completed"]
    assert set(ours["cpu_ms_per_turn"]["per_process"]) == STACK
    assert ours["overhead"]["samples"] == 4  # each of the 4 tool turns has a next request
    assert ours["api_requests_per_turn"]
    assert all(value is not None for value in record["ratios"].values()), record["ratios"]
    assert "throughput, one worker" in done.stdout
