"""`make mutate`: mutation testing of the pure core with mutmut, and its score.

mutmut (configured in the repository's ``pyproject.toml``, ``[tool.mutmut]``) copies the
``agentrun`` package into ``mutants/``, mutates the pure modules listed there one small change
at a time, and runs the pure tests covering each change. This module runs it, then reads its
verdicts (``mutmut results --all true``) and prints the score per package and every survivor
that ``tests/mutants-equivalent.txt`` does not explain (a surviving mutant is a missing test or
a documented equivalent). What belongs here: running mutmut and reading its verdicts. What does
not: the configuration (``pyproject.toml``) and the reasons (``tests/``).

Usage: ``python -m agentrun_dev.mutation [--jobs N] [--report-only] [REPO]``; exits 1 when a
survivor is unexplained.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

DETECTED = frozenset({"killed", "timeout", "caught by type check", "segfault"})
"""Verdicts that count as the tests noticing the mutant (a timeout: the change made a test
hang, which a test run notices too)."""
COUNTED = DETECTED | {"survived", "no tests", "suspicious"}
"""Verdicts a score is taken over; ``not checked`` and ``skipped`` mutants are left out."""
EQUIVALENT_FILE = Path("tests") / "mutants-equivalent.txt"
_LINE = re.compile(r"^\s*(?P<name>\S+__mutmut_\d+): (?P<verdict>.+?)\s*$")


@dataclasses.dataclass(frozen=True, slots=True)
class Score:
    """The verdicts of one package's mutants."""

    detected: int
    counted: int

    @property
    def percent(self) -> float:
        """Detected mutants per 100 counted (100.0 with none counted)."""
        return 100.0 * self.detected / self.counted if self.counted else 100.0


def parse_results(text: str) -> dict[str, str]:
    """``mutmut results --all true`` output → mutant name → verdict (lines of another shape,
    such as progress output, are skipped)."""
    found = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if match:
            found[match["name"]] = match["verdict"]
    return found


def package_of(mutant: str) -> str:
    """The package a mutant's module belongs to: ``agentrun.kernel.gates.x_f__mutmut_3`` →
    ``agentrun.kernel``."""
    return ".".join(mutant.split(".")[:2])


def scores(verdicts: Mapping[str, str]) -> dict[str, Score]:
    """The score of each package, and of all of them under ``"total"``."""
    detected: collections.Counter[str] = collections.Counter()
    counted: collections.Counter[str] = collections.Counter()
    for name, verdict in verdicts.items():
        if verdict not in COUNTED:
            continue
        for key in (package_of(name), "total"):
            counted[key] += 1
            detected[key] += verdict in DETECTED
    return {key: Score(detected[key], counted[key]) for key in sorted(counted)}


def read_equivalent(text: str) -> dict[str, str]:
    """``tests/mutants-equivalent.txt`` → mutant name → why it is equivalent. One mutant per
    line, its name, whitespace, the reason; ``#`` starts a comment. Raises ``ValueError``
    naming the line when a name has no reason."""
    explained = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, reason = line.partition(" ")
        if not reason.strip():
            raise ValueError(f"{EQUIVALENT_FILE}:{number}: {name} has no reason")
        explained[name] = reason.strip()
    return explained


def unexplained(verdicts: Mapping[str, str], explained: Iterable[str]) -> list[str]:
    """Survivors (and mutants no test covers) that no reason explains, sorted."""
    known = set(explained)
    return sorted(
        name
        for name, verdict in verdicts.items()
        if verdict in ("survived", "no tests") and name not in known
    )


def report(verdicts: Mapping[str, str], explained: Mapping[str, str]) -> tuple[str, bool]:
    """The printed report and whether every survivor is explained."""
    lines = ["mutation score (detected / checked):"]
    for key, score in scores(verdicts).items():
        lines.append(f"  {key:<20} {score.detected:>5} / {score.counted:<5} {score.percent:6.1f} %")
    equivalent = [n for n, v in verdicts.items() if v == "survived" and n in explained]
    lines.append(f"  survivors explained as equivalent ({EQUIVALENT_FILE}): {len(equivalent)}")
    missing = unexplained(verdicts, explained)
    if missing:
        lines.append(f"unexplained survivors ({len(missing)}; `mutmut show NAME` prints one):")
        lines.extend(f"  {name}: {verdicts[name]}" for name in missing)
    else:
        lines.append("no unexplained survivor")
    return "\n".join(lines), not missing


def main(argv: list[str] | None = None) -> int:
    """Run mutmut in ``REPO`` (unless ``--report-only``), print the report; 1 if a survivor
    is unexplained."""
    parser = argparse.ArgumentParser(prog="python -m agentrun_dev.mutation")
    parser.add_argument("repo", nargs="?", default=".", type=Path)
    parser.add_argument("--jobs", type=int, default=2, help="mutants tested at once")
    parser.add_argument("--report-only", action="store_true", help="read the last run's results")
    args = parser.parse_args(argv)
    mutmut = str(Path(sys.executable).with_name("mutmut"))
    if not args.report_only:
        subprocess.run([mutmut, "run", "--max-children", str(args.jobs)], cwd=args.repo, check=True)
    done = subprocess.run(
        [mutmut, "results", "--all", "true"],
        cwd=args.repo,
        check=True,
        capture_output=True,
        text=True,
    )
    equivalent_file = args.repo / EQUIVALENT_FILE
    explained = read_equivalent(equivalent_file.read_text()) if equivalent_file.exists() else {}
    text, clean = report(parse_results(done.stdout), explained)
    print(text)
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
