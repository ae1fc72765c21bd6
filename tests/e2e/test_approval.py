"""A call to a tool in spec.approval.tools waits for a person, who decides with the CLI; a
decision (or a cancel) taken while no operator runs is acted on when one returns."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agentrun import kernel
from agentrun.kernel import wire
from agentrun_dev import components

from .conftest import E2EStack, run_manifest
from .events import read_events

pytestmark = pytest.mark.e2e


def cli(stack_: E2EStack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).with_name("agentrun")), *args],
        env={**stack_.kubectl.env},
        capture_output=True,
        text=True,
        check=False,
    )


def goal_of(namespace: str, name: str) -> str:
    """The goal of run ``name`` in ``namespace``: unique in the scripted model's log, which
    holds every test's requests ("approved" is in "approved-later" too)."""
    return f"E2E-APPROVAL {namespace}/{name}."


def start(stack_: E2EStack, namespace: str, name: str) -> dict[str, Any]:
    manifest = run_manifest(name, goal_of(namespace, name), approval={"tools": ["calculate"]})
    stack_.apply(namespace, manifest)
    return stack_.wait_for(namespace, name, lambda s: s.get("phase") == "AwaitingApproval")


def second_request_tools(stack_: E2EStack, namespace: str, name: str) -> list[dict[str, Any]]:
    requests = [r for r in stack_.mock_requests() if goal_of(namespace, name) in str(r["body"])]
    assert len(requests) == 2
    return [m for m in requests[1]["body"]["messages"] if m["role"] == "tool"]


def test_the_run_waits_then_an_approved_call_runs(
    stack_: E2EStack, test_namespace: str, nats_server: object
) -> None:
    status = start(stack_, test_namespace, "approved")
    pending = status["pendingApproval"]
    assert (pending["toolCallID"], pending["tool"], pending["arguments"]) == (
        "a1",
        "calculate",
        {"expression": "6*7"},
    )
    assert pending["digest"] == kernel.digest_of("calculate", {"expression": "6*7"})
    assert status["usage"]["toolCalls"] == 1  # the sleep ran; the held call did not
    # a negative check: nothing moves the run on without a decision. 1.5 s is three of the
    # operator's status intervals, ample for a turn of this scenario to commit and show
    time.sleep(1.5)
    assert stack_.get(test_namespace, "approved")["status"]["phase"] == "AwaitingApproval"
    result = cli(stack_, "approve", "approved", "--digest", pending["digest"], "-n", test_namespace)
    assert result.returncode == 0, result.stderr
    assert '    "expression": "6*7"' in result.stdout.splitlines()  # shown in full
    done = stack_.wait_terminal(test_namespace, "approved")
    assert (done["terminalReason"], done["answer"]) == ("completed", "Reviewed and done.")
    assert "pendingApproval" not in done
    # who approved: the CLI names the caller as the API server knows them, and the decision
    # is recorded under that name in the trajectory and the Event
    me = stack_.kubectl("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}").stdout
    said = f"approve: {pending['digest']} as {me} (applied only while that call is the pending one)"
    assert me and result.stdout.splitlines()[-1] == said
    decisions = [
        e.approval
        for e in read_events(nats_server, test_namespace, "approved")  # type: ignore[arg-type]
        if e.kind == "approval"
    ]
    assert [(a.approved, a.reviewer) for a in decisions if a is not None] == [(True, me)]
    events = stack_.kubectl(
        "get", "events", "-n", test_namespace, "--field-selector", "reason=Approved",
        "-o", "jsonpath={.items[*].message}",
    ).stdout  # fmt: skip
    assert f"approved by {me}" in events
    tools = second_request_tools(stack_, test_namespace, "approved")
    assert [(m["tool_call_id"], m["content"]) for m in tools] == [
        (wire.wire_call_id("a1"), "42"),  # ids go out in wire form
        (wire.wire_call_id("s1"), "slept 0.1s"),
    ]


def test_a_denied_call_is_answered_as_denied_and_the_model_goes_on(
    stack_: E2EStack, test_namespace: str
) -> None:
    start(stack_, test_namespace, "denied")
    assert cli(stack_, "deny", "denied", "-n", test_namespace).returncode == 0
    done = stack_.wait_terminal(test_namespace, "denied")
    assert done["terminalReason"] == "completed"
    assert (done["usage"]["toolFailures"], done["usage"]["toolCallsNotRun"]) == (0, 1)
    (a1, _) = second_request_tools(stack_, test_namespace, "denied")
    assert a1["content"] == "ERROR: " + kernel.DENIED


def test_an_approval_naming_other_arguments_is_not_applied(
    stack_: E2EStack, test_namespace: str
) -> None:
    start(stack_, test_namespace, "forged")
    forged = kernel.digest_of("calculate", {"expression": "6*7*1000"})
    stack_.kubectl(
        "annotate", "agentrun", "forged", "-n", test_namespace, f"agentrun.dev/approve={forged}"
    )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # the operator consumes (removes) the annotation
        obj = stack_.get(test_namespace, "forged") or {}
        if "agentrun.dev/approve" not in (obj["metadata"].get("annotations") or {}):
            break
        time.sleep(0.2)
    else:
        raise AssertionError("the forged approval annotation was never processed")
    # a negative check: the annotation was read, and applied it would have resumed the run
    # at once; a second (two status intervals) shows whether it did
    time.sleep(1.0)
    status = stack_.get(test_namespace, "forged")["status"]
    assert status["phase"] == "AwaitingApproval"
    assert status["usage"]["toolCalls"] == 1
    real = status["pendingApproval"]["digest"]
    assert cli(stack_, "approve", "forged", "--digest", real, "-n", test_namespace).returncode == 0
    assert stack_.wait_terminal(test_namespace, "forged")["terminalReason"] == "completed"


def test_approve_says_so_when_nothing_waits(stack_: E2EStack, test_namespace: str) -> None:
    stack_.apply(test_namespace, run_manifest("idle", "E2E-429 nothing to approve"))
    stack_.wait_terminal(test_namespace, "idle")
    result = cli(stack_, "approve", "idle", "-n", test_namespace)
    assert result.returncode == 1
    assert "idle is not waiting for an approval" in result.stderr


def test_the_cli_says_plainly_when_a_run_is_missing_or_already_ended(
    stack_: E2EStack, test_namespace: str
) -> None:
    missing = cli(stack_, "approve", "nosuch", "-n", test_namespace)
    assert missing.returncode == 1
    assert missing.stderr.startswith("agentrun: error: Error from server (NotFound)")
    assert "Traceback" not in missing.stderr and "returned non-zero" not in missing.stderr
    stack_.apply(test_namespace, run_manifest("over", "E2E-429 already over"))
    stack_.wait_terminal(test_namespace, "over")
    late = cli(stack_, "cancel", "over", "-n", test_namespace)
    assert late.returncode == 0
    assert late.stdout.strip() == "over already ended: Succeeded / completed"
    annotations = stack_.get(test_namespace, "over")["metadata"].get("annotations") or {}
    assert "agentrun.dev/cancel" not in annotations


def kopf_annotations(stack_: E2EStack, namespace: str, name: str) -> list[str]:
    obj = stack_.get(namespace, name)
    assert obj is not None
    return [k for k in obj["metadata"].get("annotations") or {} if k.startswith("kopf.")]


def test_decisions_taken_while_no_operator_runs_are_acted_on_when_one_returns(
    stack_: E2EStack, test_namespace: str
) -> None:
    """kopf remembers what it last handled of a run in the operator's memory, so it writes no
    annotation of its own to a run it handles at once; an operator that starts reads from each
    run what it did not handle itself: an approval and a cancel set while no operator ran are
    acted on, and a run created meanwhile is admitted."""
    ns = test_namespace
    waiting = start(stack_, ns, "approved-later")
    start(stack_, ns, "cancelled-later")
    components.stop_component(stack_.operator)
    digest = waiting["pendingApproval"]["digest"]
    result = cli(stack_, "approve", "approved-later", "--digest", digest, "-n", ns)
    assert result.returncode == 0, result.stderr
    stack_.kubectl("annotate", "agentrun", "cancelled-later", "-n", ns, "agentrun.dev/cancel=true")
    stack_.apply(ns, run_manifest("created-later", "E2E-PARALLEL-ORDER created-later"))
    time.sleep(1.0)  # a negative check: with no operator, nothing moves
    assert stack_.get(ns, "approved-later")["status"]["phase"] == "AwaitingApproval"  # type: ignore[index]
    assert "status" not in (stack_.get(ns, "created-later") or {})

    stack_.restart_dead()
    ends = {name: stack_.wait_terminal(ns, name) for name in ("approved-later", "cancelled-later")}
    assert (ends["approved-later"]["terminalReason"], ends["approved-later"]["answer"]) == (
        "completed",
        "Reviewed and done.",
    )
    assert ends["cancelled-later"]["terminalReason"] == "cancelled"
    assert stack_.wait_terminal(ns, "created-later")["terminalReason"] == "completed"
    for name in ("approved-later", "cancelled-later", "created-later"):
        assert kopf_annotations(stack_, ns, name) == []


def test_a_run_cancelled_then_asked_to_run_again_runs_again(
    stack_: E2EStack, test_namespace: str
) -> None:
    """How a run still going is run again (its ``RerunIgnored`` Warning says so): cancel it,
    then set ``agentrun.dev/rerun``. The cancel that ended it is taken off with the rerun, so
    the new run is not cancelled as it is queued."""
    ns = test_namespace
    start(stack_, ns, "again")
    stack_.kubectl("annotate", "agentrun", "again", "-n", ns, "agentrun.dev/cancel=true")
    assert stack_.wait_terminal(ns, "again")["terminalReason"] == "cancelled"
    stack_.kubectl("annotate", "agentrun", "again", "-n", ns, "agentrun.dev/rerun=true")
    again = stack_.wait_for(ns, "again", lambda s: s.get("phase") == "AwaitingApproval")
    assert "terminalReason" not in again
    obj = stack_.get(ns, "again")
    assert obj is not None
    annotations = obj["metadata"].get("annotations") or {}
    assert "agentrun.dev/cancel" not in annotations and "agentrun.dev/rerun" not in annotations
