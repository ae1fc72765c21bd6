"""``make bench-ab REF=<git rev>``: a change's cost in one command. This tree against another
(REF), a benchmark run in both in turn, the order swapped each round (ref, this, this, ref, …:
``run_order``), medians of every figure and their ratio.

The other tree is ``git archive REF`` unpacked under the agentrun cache directory with its own
virtualenv (``pip install -e 'TREE[test]' -e TREE/devtools``), both built once per commit and
reused. By default the benchmark scripts are this tree's (copied into ``TREE/bench-ab/``, so the
instrument is the same on both sides and only the runtime differs); ``--own-bench`` runs the
ref's own ``bench/`` instead (for a ref whose ``agentrun_dev`` lacks what this tree's harness
calls: refs before the closed bus, 60a0290); then only the figures both trees' scripts write
are compared. Each run
writes its JSON into a directory of its own (``AGENTRUN_BENCH_RESULTS``); every number in it is
compared (``figures.ab_summary``): medians over ``--repeat`` runs a side, this/ref.

On a shared machine a single pair says little: CPU per turn moves ±15–25 % between stacks,
wall-clock figures several-fold. Interleaving puts both trees under the same load drift, and
swapping the order each round keeps a drift that goes one way through the runs (a machine
slowing down) from reading as a change; the exact counts (API requests, NATS messages per
turn) show whether a turn does different work.

    cd bench && ../.venv/bin/python bench_ab.py --ref main [--bench bench_cpu.py]
        [--repeat 3] [--own-bench] [-- ARGS FOR THE BENCH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import figures
import venvs
from harness import REPO, load_average, tree_revision, write_result

from agentrun_dev import binaries, console

HERE = Path(__file__).parent
BENCH_FILES = ("*.py", "*.yaml", "peer/*", "probes/*")
OLD_REF_HINT = (
    "; this tree's scripts need the ref's agentrun_dev to offer what they call (the closed"
    " bus's NATS server, from 60a0290 on): for an older ref run its own scripts (OWN=1,"
    " --own-bench)"
)


def resolve(ref: str) -> str:
    """The full commit id of ``ref`` in this repository; raises SystemExit naming it if git
    does not know it."""
    done = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"bench_ab: --ref {ref!r} is not a commit of {REPO}")
    return done.stdout.strip()


def ref_tree(sha: str, *, log: console.Log = console.log_to_stderr) -> tuple[Path, Path]:
    """The ref's source tree and its virtualenv's python, made once per commit."""
    directory = venvs.cache_dir("ab", sha)
    tree = directory / "tree"
    if not (tree / venvs.STAMP).is_file():
        with binaries.build_lock(directory, what=f"the tree of {sha[:12]}", log=log):
            if not (tree / venvs.STAMP).is_file():
                shutil.rmtree(tree, ignore_errors=True)
                tree.mkdir(parents=True)
                archive = subprocess.Popen(
                    ["git", "-C", str(REPO), "archive", sha], stdout=subprocess.PIPE
                )
                subprocess.run(["tar", "-x", "-C", str(tree)], stdin=archive.stdout, check=True)
                if archive.wait() != 0:
                    raise RuntimeError(f"git archive {sha} failed")
                (tree / venvs.STAMP).touch()
    python = venvs.ensure_venv(
        directory, installs=[["-e", f"{tree}[test]", "-e", str(tree / "devtools")]], log=log
    )
    return tree, python


def bench_dir(tree: Path, *, own: bool) -> Path:
    """Where the ref's runs execute from: its own ``bench/``, or a fresh copy of this tree's
    benchmark files in ``TREE/bench-ab/`` (so ``harness.REPO`` is still the ref's tree)."""
    if own:
        return tree / "bench"
    target = tree / "bench-ab"
    shutil.rmtree(target, ignore_errors=True)
    for pattern in BENCH_FILES:
        for source in HERE.glob(pattern):
            if source.is_file():
                destination = target / source.relative_to(HERE)
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, destination)
    return target


def run_once(python: Path, directory: Path, script: str, args: list[str], out: Path) -> Any:
    """Run ``script`` from ``directory`` with ``python``, its results into ``out``; the one
    JSON record it wrote (a harness older than ``AGENTRUN_BENCH_RESULTS`` writes into
    ``directory/results``: the files it wrote there during the run). Raises
    CalledProcessError if it fails, RuntimeError if it wrote not exactly one record."""
    out.mkdir(parents=True)
    env = {**os.environ, "AGENTRUN_BENCH_RESULTS": str(out)}
    started = time.time()
    subprocess.run([str(python), script, *args], cwd=directory, env=env, check=True)
    written = sorted(out.glob("*.json")) or [
        path for path in (directory / "results").glob("*.json") if path.stat().st_mtime >= started
    ]
    if len(written) != 1:
        raise RuntimeError(f"{script} wrote {len(written)} result files into {out}, not one")
    return json.loads(written[0].read_text())


def report(summary: dict[str, dict[str, Any]]) -> list[str]:
    """One line per figure: ref median, this tree's median, this/ref."""
    width = max((len(path) for path in summary), default=10)
    lines = [f"{'figure':<{width}}  {'ref':>12}  {'this':>12}  this/ref"]
    for path, row in summary.items():
        ratio = "—" if row["b_over_a"] is None else f"{row['b_over_a']:.3f}"
        lines.append(f"{path:<{width}}  {row['a']:>12.4g}  {row['b']:>12.4g}  {ratio}")
    return lines


def run_order(repeat: int) -> list[tuple[int, str]]:
    """The runs, (round, side), in the order they are made: ``ref`` then ``this`` in even
    rounds, ``this`` then ``ref`` in odd ones. Strict alternation (ref, this, ref, this) runs
    ``this`` later in every pair, so a machine slowing down steadily through the runs reads as
    ``this`` costing more (seen: every process, the untouched model server too, 1.1–1.3×);
    with the order swapped, a steady drift weighs on both sides alike after each two rounds."""
    sides = ("ref", "this")
    return [(i, side) for i in range(repeat) for side in (sides if i % 2 == 0 else sides[::-1])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ref", required=True, help="the other tree: a git rev of this repo")
    parser.add_argument("--bench", default="bench_cpu.py", help="the script (bench_cpu.py)")
    parser.add_argument("--repeat", type=int, default=3, help="runs a side (3)")
    parser.add_argument("--own-bench", action="store_true", help="the ref's own bench/ scripts")
    parser.add_argument("bench_args", nargs=argparse.REMAINDER, help="-- then the bench's args")
    args = parser.parse_args()
    bench_args = args.bench_args[1:] if args.bench_args[:1] == ["--"] else args.bench_args
    sha = resolve(args.ref)
    tree, ref_python = ref_tree(sha)
    ref_dir = bench_dir(tree, own=args.own_bench)
    if not (ref_dir / args.bench).is_file():
        raise SystemExit(f"bench_ab: {args.bench} is not in {ref_dir}")
    sides = {"ref": (ref_python, ref_dir), "this": (Path(sys.executable), HERE)}
    records: dict[str, list[Any]] = {"ref": [], "this": []}
    loads: list[dict[str, Any]] = []
    scratch = Path(tempfile.mkdtemp(prefix="agentrun-bench-ab-"))
    try:
        for i, side in run_order(args.repeat):
            python, directory = sides[side]
            print(f"bench_ab: {side} run {i + 1}/{args.repeat} ({args.bench})", flush=True)
            before = load_average()
            out = scratch / f"{side}-{i}"
            try:
                record = run_once(python, directory, args.bench, bench_args, out)
            except subprocess.CalledProcessError as err:
                hint = OLD_REF_HINT if side == "ref" and not args.own_bench else ""
                raise SystemExit(f"bench_ab: {args.bench} failed in the {side} tree{hint}") from err
            records[side].append(record)
            loads.append({"side": side, "run": i + 1, "before": before, "after": load_average()})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    summary = figures.ab_summary(records["ref"], records["this"])
    print(*report(summary), sep="\n")
    name = f"ab-{Path(args.bench).stem.removeprefix('bench_')}"
    write_result(
        name,
        {
            "ref": args.ref,
            "ref_commit": sha,
            "this": tree_revision(),
            "bench": args.bench,
            "bench_args": bench_args,
            "own_bench": args.own_bench,
            "repeat": args.repeat,
            "load_average": loads,
            "summary": summary,
        },
        quiet=True,
    )


if __name__ == "__main__":
    main()
