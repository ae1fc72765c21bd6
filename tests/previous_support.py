"""The previous revision of agentrun, built from this repository's history: the code a rolling
upgrade's old workers run while this tree's operator drives them (the supported skew,
docs/operations.md "Upgrades and version skew"), on the dev stack
(``tests/e2e/test_version_skew.py``) and on the node (``tests/cluster/test_helm_install.py``).

When a release is cut, ``PREVIOUS`` becomes the previous release's tag."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PREVIOUS = "60a0290322c8b31f137f3e615240eef830ee611f"
"""The revision before the wire messages carried a schema version (main when it was added)."""
PREVIOUS_POD = "c965a0b28bf8de331938b0e191dc145269661562"
"""The previous revision as the chart's pods see it: the last one landed before this round,
whose worker serves what this chart's worker pod asks (the loop-served health port its probes
read, the drain it is given). ``PREVIOUS``'s worker serves no health port, so this chart's
probes never pass on it: a chart runs workers of the previous release only as long as they
honour its pod contract (docs/operations.md, "Upgrades and version skew")."""


def install_previous(work: Path, revision: str = PREVIOUS) -> Path:
    """The ``agentrun`` package of `revision`, installed without dependencies (this
    environment's serve: the same interpreter and libraries) into ``work/site``; that
    directory, to put first on ``PYTHONPATH``. Raises subprocess.CalledProcessError when git
    or pip fails."""
    source, site = work / "src", work / "site"
    source.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", revision], check=True, capture_output=True
    )
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
         str(source)],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    return site
