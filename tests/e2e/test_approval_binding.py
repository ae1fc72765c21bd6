"""Approving binds what a person saw: the held call is shown in full (escapes neutralised) by
``describe``, ``logs`` and ``approve`` itself, and an approval names that call's digest (or is
confirmed on a terminal after the call was shown), so a call that changed since is refused."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

import pytest

from agentrun import kernel

from .conftest import E2EStack, run_manifest
from .test_approval import cli
from .test_k8s_events import reasons, wait_events
from .test_kubectl_plugin import plugin, plugin_env

pytestmark = pytest.mark.e2e

FIRST = kernel.digest_of("calculate", {"expression": "1+1"})
SECOND = kernel.digest_of("calculate", {"expression": "2+2 \x1b]0;owned\x07\x9b2J"})


def no_controls(text: str) -> bool:
    """No character a terminal would act on (newlines aside), and no bidi mark."""
    return not [c for c in text if unicodedata.category(c) == "Cc" and c not in "\n"]


def on_a_terminal(stack_: E2EStack, answer: str, *args: str) -> tuple[int, str]:
    """``agentrun ARGS`` with a pseudo-terminal as stdin and stdout; types ``answer`` once it
    asks. Returns the exit status and everything it printed."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [str(Path(sys.executable).with_name("agentrun")), *args],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env={**stack_.kubectl.env},
        close_fds=True,
    )
    os.close(follower)
    seen = b""
    answered = False
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(leader, 4096)
                except OSError:  # the follower side closed: the program ended
                    break
                if not chunk:
                    break
                seen += chunk
            if not answered and b"[y/N]" in seen:
                os.write(leader, answer.encode() + b"\n")
                answered = True
            if process.poll() is not None and not ready:
                break
        code = process.wait(timeout=30)
    finally:
        os.close(leader)
        if process.poll() is None:
            process.kill()
    return code, seen.decode(errors="replace")


def test_an_approval_binds_the_call_the_person_saw(stack_: E2EStack, test_namespace: str) -> None:
    manifest = run_manifest("pair", "E2E-PAIRED-REVIEW", approval={"tools": ["calculate"]})
    stack_.apply(test_namespace, manifest)
    status = stack_.wait_for(test_namespace, "pair", lambda s: s.get("phase") == "AwaitingApproval")
    assert status["pendingApproval"]["digest"] == FIRST, status["pendingApproval"]

    # the person looks: the call to decide in full, with the digest that approves exactly it
    seen = plugin(stack_, "describe", "pair", "-n", test_namespace)
    assert seen.returncode == 0, seen.stderr
    assert f"--digest {FIRST}" in seen.stdout and f"digest {FIRST}" in seen.stdout
    assert '"expression": "1+1"' in seen.stdout
    assert no_controls(seen.stdout)
    assert "2+2 \\u001b]0;owned\\u0007\\x9b2J" in seen.stdout  # call 2 listed, escapes shown

    # meanwhile someone else approves call 1: call 2 is pending now
    other = cli(stack_, "approve", "pair", "--digest", FIRST, "-n", test_namespace)
    assert other.returncode == 0, other.stderr
    stack_.wait_for(
        test_namespace, "pair", lambda s: (s.get("pendingApproval") or {}).get("digest") == SECOND
    )

    # the person approves what they saw: refused, and call 2 stays undecided
    late = cli(stack_, "approve", "pair", "--digest", FIRST, "-n", test_namespace)
    assert late.returncode == 1
    assert f"the pending call's digest is {SECOND}" in late.stderr
    assert '"expression": "2+2 \\u001b]0;owned\\u0007\\x9b2J"' in late.stdout  # shown to them
    assert no_controls(late.stdout)
    late_plugin = plugin(stack_, "approve", "pair", "--digest", FIRST, "-n", test_namespace)
    assert late_plugin.returncode == 1 and SECOND in late_plugin.stderr

    # a digest written straight into the annotation is checked by the operator too
    stack_.kubectl(
        "annotate", "agentrun", "pair", "-n", test_namespace, f"agentrun.dev/approve={FIRST}"
    )
    wait_events(
        stack_, test_namespace, "AgentRun", "pair", lambda f: "ApprovalNotApplied" in reasons(f)
    )

    # without a digest and without a terminal, approve refuses and says what to run
    blind = cli(stack_, "approve", "pair", "-n", test_namespace)
    assert blind.returncode == 1
    assert f"agentrun approve pair --digest {SECOND}" in blind.stderr

    held = stack_.get(test_namespace, "pair")["status"]
    assert held["phase"] == "AwaitingApproval"
    assert [c["decision"] for c in held["pendingApproval"]["heldCalls"]] == ["approved", "pending"]

    # on a terminal: the call and its digest are shown and the person is asked
    code, shown = on_a_terminal(stack_, "n", "approve", "pair", "-n", test_namespace)
    assert code == 1 and f"digest {SECOND}" in shown and "not approved" in shown
    assert stack_.get(test_namespace, "pair")["status"]["phase"] == "AwaitingApproval"
    code, shown = on_a_terminal(stack_, "y", "approve", "pair", "-n", test_namespace)
    assert code == 0, shown
    assert f"approve: {SECOND}" in shown
    done = stack_.wait_terminal(test_namespace, "pair")
    assert done["terminalReason"] == "completed"

    # the trajectory shows both held calls in full, and no model escape reaches the terminal
    logs = subprocess.run(
        [str(stack_.kubectl.binary), "agentrun", "logs", "pair", "-n", test_namespace],
        env=plugin_env(stack_),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert logs.returncode == 0, logs.stderr
    assert no_controls(logs.stdout)
    assert f"digest {FIRST}" in logs.stdout and f"digest {SECOND}" in logs.stdout
    assert "says: Two changes \\x1b[8mhidden\\x1b[0m for review." in logs.stdout
    assert '"expression": "2+2 \\u001b]0;owned\\u0007\\x9b2J"' in logs.stdout
