"""Load held, longer: the soak of ``tests/natsfaults/test_soak.py`` (three NATS servers at R3, two
operators over four shards, three workers, five tenants, runs of 2, 4 and 6 model calls of 2 s
each) at bench size, its chaos loop killing a NATS server, an operator and a worker in turn,
round after round (at least 20 s apart) while runs are being created or queued. The test's own
checks hold (no turn lost or committed twice, no ledger difference, a call asked again only
across a worker's kill); the figures are its report: runs completed, turns lost, turns
committed twice, calls asked again, ledger differences, a turn's overhead p50/p99 during the
faults and outside them, the longest a run waited between two turns.

It runs the test with pytest on the session's own control plane (the suite's fixtures), so
it needs what ``make test`` needs built (``agentrun dev binaries --control-plane``).

    cd bench && ../.venv/bin/python bench_soak.py [--runs-per-tenant 400] [--concurrency 20]
        [--rounds 100]

"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import REPO, load_average, tree_revision, write_result

TEST = "tests/natsfaults/test_soak.py"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs-per-tenant", type=int, default=400, help="five tenants")
    parser.add_argument("--concurrency", type=int, default=20, help="each tenant's limit")
    parser.add_argument(
        "--rounds", type=int, default=100, help="rounds of faults at most, 20 s apart"
    )
    parser.add_argument("--name", default="soak")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as scratch:
        report = Path(scratch) / "report.json"
        env = {
            **os.environ,
            "AGENTRUN_SOAK_RUNS": str(args.runs_per_tenant),
            "AGENTRUN_SOAK_CONCURRENCY": str(args.concurrency),
            "AGENTRUN_SOAK_ROUNDS": str(args.rounds),
            "AGENTRUN_SOAK_REPORT": str(report),
        }
        before = load_average()
        command = [sys.executable, "-m", "pytest", TEST, "-q", "-s", "-p", "no:cacheprovider"]
        command += ["--basetemp", str(Path(scratch) / "tmp")]
        done = subprocess.run(command, cwd=REPO, env=env, check=False)
        if not report.exists():
            raise SystemExit(f"the soak wrote no report (pytest exit {done.returncode})")
        figures = json.loads(report.read_text())
    write_result(
        args.name,
        {
            "cores": os.cpu_count(),
            "revision": tree_revision(),
            "passed": done.returncode == 0,
            "load_average": [before, load_average()],
            **figures,
        },
    )
    if done.returncode != 0:
        raise SystemExit(f"the soak's checks failed (pytest exit {done.returncode})")


if __name__ == "__main__":
    main()
