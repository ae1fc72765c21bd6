""".ci/pytest-tiers, what `make pytest` runs: the first tier (no Go-built binary) beside the
background builds, then the rest; the exit status says whether any tier or build failed, and
an interrupted run leaves no build behind.

The tier logic is driven with a stand-in virtualenv ``bin/`` (``pytest``, ``agentrun`` and
``python`` scripts that record their arguments and exit as told); which tests each tier selects
is checked by collecting real test files with the script's own marker expression.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / ".ci" / "pytest-tiers"

FAKE_PYTEST = """#!/bin/sh
echo "pytest $*" >> "$CALLS"
case "$*" in
  *"-m not ("*) exit "${SECOND_RC:-0}";;
  *"-m node or"*) exit "${THIRD_RC:-0}";;
  *) exit "${FIRST_RC:-0}";;
esac
"""
FAKE_AGENTRUN = """#!/bin/sh
if [ "$(nice)" -gt "$NICE_BASE" ]; then
  echo "background agentrun $*" >> "$CALLS"
  echo "building something" >&2
  echo $$ > "$CALLS.build-pid"
  if [ -n "${BUILD_SLEEP:-}" ]; then exec sleep "$BUILD_SLEEP"; fi
  exit "${BUILD_RC:-0}"
fi
echo "agentrun $*" >> "$CALLS"
"""
FAKE_PYTHON = """#!/bin/sh
echo "background python $*" >> "$CALLS"
exit "${LLAMA_RC:-0}"
"""


def tier(name: str) -> str:
    """The marker expression of the script's `name` tier (``first`` or ``last``)."""
    match = re.search(rf"^{name}_tier='([^']+)'$", SCRIPT.read_text(), re.MULTILINE)
    assert match is not None
    return match[1]


def venv_bin(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, text in (("pytest", FAKE_PYTEST), ("agentrun", FAKE_AGENTRUN)):
        (bin_dir / name).write_text(text)
    (bin_dir / "python").write_text(FAKE_PYTHON)
    for script in bin_dir.iterdir():
        script.chmod(0o755)
    return bin_dir


def tiers(tmp_path: Path, **rcs: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run the script on the stand-in bin/ with `rcs` (FIRST_RC, SECOND_RC, THIRD_RC,
    BUILD_RC, LLAMA_RC); returns its result and the recorded calls, foreground ones in order."""
    calls = tmp_path / "calls"
    env = {**os.environ, "CALLS": str(calls), "NICE_BASE": str(os.nice(0)), **rcs}
    done = subprocess.run(
        [str(SCRIPT), str(venv_bin(tmp_path)), "--durations=30"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done, calls.read_text().splitlines()


def test_the_three_tiers_run_around_the_background_builds_and_all_passing_is_0(
    tmp_path: Path,
) -> None:
    done, calls = tiers(tmp_path)

    assert done.returncode == 0, done.stdout + done.stderr
    foreground = [c for c in calls if not c.startswith("background ")]
    assert foreground == [
        f"pytest --durations=30 -m {tier('first')}",
        "agentrun dev binaries",
        f"pytest --durations=30 -m not ({tier('first')}) and not ({tier('last')})",
        "agentrun dev binaries --all",
        f"pytest --durations=30 -m {tier('last')}",
    ]
    background = [c for c in calls if c.startswith("background ")]
    assert background == [
        "background agentrun dev binaries --all",
        "background python -m agentrun_dev.llamaserver",
    ]
    assert "building something" in (tmp_path / "venv" / "builds.log").read_text()


@pytest.mark.parametrize("failing", ["FIRST_RC", "SECOND_RC", "THIRD_RC"])
def test_a_failing_tier_fails_the_run_and_the_other_tiers_still_run(
    tmp_path: Path, failing: str
) -> None:
    done, calls = tiers(tmp_path, **{failing: "1"})

    assert done.returncode == 1
    assert sum(c.startswith("pytest ") for c in calls) == 3


def test_a_failed_background_build_fails_the_run_shows_its_log_and_skips_the_llama_build(
    tmp_path: Path,
) -> None:
    done, calls = tiers(tmp_path, BUILD_RC="3")

    assert done.returncode == 1
    assert "a background build failed" in done.stdout
    assert "building something" in done.stdout
    assert not any("llamaserver" in c for c in calls)
    assert sum(c.startswith("pytest ") for c in calls) == 3


def test_a_failed_llama_build_fails_the_run(tmp_path: Path) -> None:
    done, _ = tiers(tmp_path, LLAMA_RC="1")

    assert done.returncode == 1
    assert "a background build failed" in done.stdout


def test_an_interrupted_run_stops_the_background_build(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    env = {
        **os.environ,
        "CALLS": str(calls),
        "NICE_BASE": str(os.nice(0)),
        "BUILD_SLEEP": "120",
    }
    script = subprocess.Popen(
        [str(SCRIPT), str(venv_bin(tmp_path))],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        pid_file = Path(f"{calls}.build-pid")
        deadline = time.monotonic() + 30
        while not (pid_file.is_file() and pid_file.read_text().strip()):
            assert time.monotonic() < deadline, "the background build never started"
            time.sleep(0.05)
        build = int(pid_file.read_text())
        script.send_signal(signal.SIGTERM)
        assert script.wait(timeout=30) == 130
    finally:
        if script.poll() is None:
            script.kill()
    deadline = time.monotonic() + 10
    while _alive(build):
        assert time.monotonic() < deadline, f"the background build {build} outlived the run"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _collected(marker: str, *files: str) -> set[str]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            marker,
            *files,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode in (0, 5), done.stdout + done.stderr  # 5: none selected
    return {line for line in done.stdout.splitlines() if "::" in line}


@pytest.mark.binaries  # collecting the control plane's tests builds (or waits for) it
def test_the_first_tier_holds_no_test_that_needs_a_go_built_binary() -> None:
    files = ("tests/devenv/test_controlplane.py", "tests/devenv/test_binaries.py")
    first = _collected(tier("first"), *files)
    second = _collected(f"not ({tier('first')}) and not ({tier('last')})", *files)
    last = _collected(tier("last"), *files)
    every = _collected("", *files)

    assert first.isdisjoint(second) and first.isdisjoint(last) and second.isdisjoint(last)
    assert first | second | last == every
    # the control plane through a fixture, directly (control_plane) or not (kubectl)
    in_controlplane = {t for t in every if t.startswith("tests/devenv/test_controlplane.py")}
    assert in_controlplane and in_controlplane <= second
    # marked by hand: they build, or wait for, the kubernetes binaries themselves
    assert (
        "tests/devenv/test_binaries.py::"
        "test_two_concurrent_callers_share_one_build_into_an_empty_cache"
    ) in second
    # the node's binaries: after the node's build, which goes on beside the second tier
    assert (
        "tests/devenv/test_binaries.py::"
        "test_the_node_s_network_policy_enforcer_is_the_pinned_kube_router"
    ) in last
    pure = "tests/devenv/test_binaries.py::test_the_etcd_pin_is_read_from_build_dependencies_yaml"
    assert pure in first
