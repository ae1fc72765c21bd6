"""The harness's guards that need no stack: a peer that reports a failure or nothing, a peer
that hangs, a bench that writes no result, a ref git does not know; the A/B's order of runs."""

from __future__ import annotations

import io
import statistics
import sys
import time
from pathlib import Path

import bench_ab
import bench_peer
import pytest


def test_a_peer_that_exits_without_answering_voids_the_figure(tmp_path: Path) -> None:
    with pytest.raises(bench_peer.PeerError, match="exited without answering"):
        bench_peer._read_line(io.StringIO(""), tmp_path / "peer.log")


def test_a_peer_reporting_failed_runs_voids_the_figure(tmp_path: Path) -> None:
    line = '{"ready": true, "errors": ["MaxTurnsExceeded: Max turns (25) exceeded"]}\n'
    with pytest.raises(bench_peer.PeerError, match="MaxTurnsExceeded"):
        bench_peer._read_line(io.StringIO(line), tmp_path / "peer.log")


def test_a_hanging_peer_is_killed_after_its_timeout(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    started = time.monotonic()
    with (
        (tmp_path / "peer.log").open("w") as log,
        bench_peer._started(argv, log, timeout=0.5) as peer,
    ):
        assert peer.stdout is not None
        with pytest.raises(bench_peer.PeerError):
            bench_peer._read_line(peer.stdout, tmp_path / "peer.log")
    assert time.monotonic() - started < 30
    assert peer.returncode is not None


def test_a_bench_that_writes_no_result_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "quiet.py").write_text("print('measured nothing')\n")
    with pytest.raises(RuntimeError, match="wrote 0 result files"):
        bench_ab.run_once(Path(sys.executable), tmp_path, "quiet.py", [], tmp_path / "out")


def test_a_ref_git_does_not_know_is_refused_by_name() -> None:
    with pytest.raises(SystemExit, match="'no-such-ref' is not a commit"):
        bench_ab.resolve("no-such-ref")


def test_the_sides_swap_order_each_round_so_a_steady_drift_reads_as_no_change() -> None:
    order = bench_ab.run_order(4)
    assert order == [
        (0, "ref"),
        (0, "this"),
        (1, "this"),
        (1, "ref"),
        (2, "ref"),
        (2, "this"),
        (3, "this"),
        (3, "ref"),
    ]
    # a machine slowing down by the same step each run: both sides' medians equal
    costs: dict[str, list[float]] = {"ref": [], "this": []}
    for position, (_, side) in enumerate(order):
        costs[side].append(1.0 + 0.1 * position)
    assert statistics.median(costs["this"]) == pytest.approx(statistics.median(costs["ref"]))
    assert bench_ab.run_order(1) == [(0, "ref"), (0, "this")]
