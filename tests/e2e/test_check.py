"""``agentrun check`` (the chart's ``helm test``) on the real API server: with its default goal
the run ends ``completed``, the command prints its end, deletes the run and exits 0; a run that
ends with another reason exits 1 saying which was expected, and ``--keep`` keeps it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import E2EStack

pytestmark = pytest.mark.e2e


def check(stack_: E2EStack, *args: str) -> subprocess.CompletedProcess[str]:
    """``agentrun check --model mock`` with ``args``, as a user with the stack's kubeconfig."""
    return subprocess.run(
        [str(Path(sys.executable).with_name("agentrun")), "check", "--model", "mock", *args],
        env={**stack_.kubectl.env},
        capture_output=True,
        text=True,
        check=False,
        timeout=180,
    )


def check_runs(stack_: E2EStack, namespace: str) -> list[str]:
    """The names of the namespace's AgentRuns that ``agentrun check`` made."""
    listed = stack_.kubectl("get", "agentruns", "-n", namespace, "-l", "agentrun.dev/check=true",
                            "-o", "name")  # fmt: skip
    return listed.stdout.split()


def test_a_completed_check_run_passes_and_is_deleted(stack_: E2EStack, test_namespace: str) -> None:
    done = check(stack_, "-n", test_namespace, "--timeout", "60")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Succeeded / completed, 1 step," in done.stdout, done.stdout
    deadline = time.monotonic() + 30  # deleted by `check` once it ended
    while check_runs(stack_, test_namespace):
        assert time.monotonic() < deadline, check_runs(stack_, test_namespace)
        time.sleep(0.5)


def test_a_check_run_ending_otherwise_fails_and_keep_keeps_it(
    stack_: E2EStack, test_namespace: str
) -> None:
    done = check(stack_, "-n", test_namespace, "--goal", "E2E-MAX-STEPS check", "--keep")
    assert done.returncode == 1, done.stdout + done.stderr
    # the scenario calls a tool the check run does not offer: three malformed turns
    assert "Failed / invalid_decision, 3 steps" in done.stdout, done.stdout
    assert "expected terminal reason 'completed'" in done.stdout
    (kept,) = check_runs(stack_, test_namespace)
    assert kept.startswith("agentrun.agentrun.dev/agentrun-check-")
