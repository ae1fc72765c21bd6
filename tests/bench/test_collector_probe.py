"""The collector probe (``probes/sitecustomize.py``, ``AGENTRUN_GC_PROBE``) in a process named
as the worker is: it counts the cyclic collector's passes by generation and their CPU, and
``bench_objects.collector_per_run`` turns two readings into figures per run; ``bench-ab``
copies the probes for the ref's side."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import bench_ab
import bench_objects

SCRIPT = """
import gc, time
for _ in range(3):
    gc.collect()
for _ in range(20_000):
    a = []; a.append(a)  # cycles: young collections
time.sleep(1.5)  # the probe writes every second
"""


def test_a_probed_process_reports_its_collector_passes_and_their_cpu(tmp_path: Path) -> None:
    program = tmp_path / "agentrun-worker"  # the probe acts in processes named as ours are
    program.write_text(SCRIPT)
    out = tmp_path / "gc"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(bench_objects.HERE / "probes")}
    env["AGENTRUN_GC_PROBE"] = str(out)
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(program)], env=env, timeout=60, check=False)
    assert done.returncode == 0
    assert time.monotonic() - started < 30
    (pid,) = bench_objects.collector_totals(str(out))
    figures = bench_objects.collector_per_run(
        {}, bench_objects.collector_totals(str(out)), {"worker-1": pid}, 2
    )
    row = figures["worker-1"]
    assert row["gen2"] >= 1.5  # three whole collections, over 2 runs
    assert row["gen0"] > 0
    assert row["cpu_ms"] > 0
    assert bench_objects.collector_per_run({}, {}, {"worker-1": pid}, 2) == {}  # not probed


def test_bench_ab_gives_the_refs_side_the_probes(tmp_path: Path) -> None:
    copied = bench_ab.bench_dir(tmp_path, own=False)
    assert (copied / "probes" / "sitecustomize.py").is_file()
