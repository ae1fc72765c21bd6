"""Disaster recovery as an on-call engineer meets it (docs/operations.md): a run whose
checkpoint (its event stream) was lost while no operator ran is not restarted from turn 0 on
its own — it ends ``checkpoint_failed``, a Warning Event says why, the model is not called
again — and runs again from turn 0 only with ``agentrun.dev/rerun: "true"``; an AgentRun
restored from a backup (its ``agentrun.dev/admitted-uid`` another object's, as Velero leaves
it) is not executed: it ends ``checkpoint_failed``, or shows its original's end when the
original's events are still in NATS."""

from __future__ import annotations

import collections
import json
import time
from typing import Any

import pytest

from agentrun_dev import components, stack

from .conftest import ORPHAN_AFTER, E2EStack, run_manifest
from .events import purge_events, read_events, turn_numbers
from .test_k8s_events import wait_events

pytestmark = pytest.mark.e2e

ADMITTED_UID = "agentrun.dev/admitted-uid"
RERUN = "agentrun.dev/rerun"


def model_requests(stack_: E2EStack, goal: str) -> list[dict[str, Any]]:
    """The scripted model's requests of the run with ``goal`` (unique to the test)."""
    return [r for r in stack_.mock_requests() if goal in json.dumps(r["body"])]


def annotations(stack_: E2EStack, namespace: str, name: str) -> dict[str, str]:
    obj = stack_.get(namespace, name)
    assert obj is not None
    return dict(obj["metadata"].get("annotations") or {})


def rerun_completes(stack_: E2EStack, namespace: str, name: str, goal: str) -> None:
    """``agentrun.dev/rerun=true`` on the ended run: it runs again from turn 0 as a new run,
    one model request per turn, and completes."""
    before = len(model_requests(stack_, goal))
    stack_.kubectl("annotate", "agentrun", name, "-n", namespace, f"{RERUN}=true")
    status = stack_.wait_for(
        namespace, name, lambda s: s.get("terminalReason") == "completed", timeout=90
    )
    assert (status["answer"], status["usage"]["steps"]) == ("Finished the long job.", 5)
    assert len(model_requests(stack_, goal)) - before == 5
    marks = annotations(stack_, namespace, name)
    obj = stack_.get(namespace, name)
    assert obj is not None
    assert RERUN not in marks and marks.get(ADMITTED_UID) == obj["metadata"]["uid"]


def test_a_run_whose_checkpoint_is_lost_ends_and_reruns_only_when_asked(
    stack_: E2EStack, test_namespace: str, nats_server: Any
) -> None:
    goal = "E2E-LONG job (its checkpoint is lost)"
    stack_.apply(test_namespace, run_manifest("lost", goal))
    stack_.wait_for(test_namespace, "lost", lambda s: (s.get("usage") or {}).get("steps", 0) >= 2)
    uid = stack_.get(test_namespace, "lost")["metadata"]["uid"]  # type: ignore[index]
    assert annotations(stack_, test_namespace, "lost")[ADMITTED_UID] == uid
    components.kill_component(stack_.operator)
    # with no operator, nothing dispatches a turn past the one a worker may hold (dispatched
    # before the kill, asked of the model and its commit refused at any time from now on, on
    # a loaded machine after any fixed wait): the model may be asked for turn len(committed)
    # at most, each turn once
    committed = turn_numbers(read_events(nats_server, test_namespace, "lost"))
    purge_events(nats_server, test_namespace, "lost")
    stack_.operator = stack.start_operator(stack_.env, launch=stack_.launch)

    status = stack_.wait_terminal(test_namespace, "lost", timeout=60)
    assert status["terminalReason"] == "checkpoint_failed"
    assert status["message"].startswith("not resumed: this run was admitted before")
    assert f"kubectl annotate agentrun lost -n {test_namespace} {RERUN}=true" in status["message"]
    found = wait_events(
        stack_,
        test_namespace,
        "AgentRun",
        "lost",
        lambda f: any(e["reason"] == "CheckpointFailed" for e in f),
    )
    (ended,) = [e for e in found if e["reason"] == "CheckpointFailed"]
    assert ended["type"] == "Warning" and "holds none of its events" in ended["message"]
    time.sleep(2 * ORPHAN_AFTER)  # a turn dispatched again would have reached the model now
    asked = collections.Counter(int(r["turn"]) for r in model_requests(stack_, goal))
    assert max(asked) <= len(committed) and set(asked.values()) == {1}, (committed, asked)
    assert read_events(nats_server, test_namespace, "lost") == []

    rerun_completes(stack_, test_namespace, "lost", goal)
    events = read_events(nats_server, test_namespace, "lost")
    assert turn_numbers(events) == [0, 1, 2, 3, 4]
    assert events[0].kind == "admitted" and events[0].run_uid == uid


def test_a_lost_run_with_a_rerun_asked_before_the_operator_returns_starts_again(
    stack_: E2EStack, test_namespace: str, nats_server: Any
) -> None:
    goal = "E2E-LONG job (rerun asked while the operator is down)"
    stack_.apply(test_namespace, run_manifest("asked", goal))
    stack_.wait_for(test_namespace, "asked", lambda s: (s.get("usage") or {}).get("steps", 0) >= 1)
    components.kill_component(stack_.operator)
    purge_events(nats_server, test_namespace, "asked")
    stack_.kubectl("annotate", "agentrun", "asked", "-n", test_namespace, f"{RERUN}=true")
    time.sleep(1.5)
    stack_.operator = stack.start_operator(stack_.env, launch=stack_.launch)
    status = stack_.wait_terminal(test_namespace, "asked", timeout=90)
    assert (status["terminalReason"], status["usage"]["steps"]) == ("completed", 5)
    assert turn_numbers(read_events(nats_server, test_namespace, "asked")) == [0, 1, 2, 3, 4]
    assert RERUN not in annotations(stack_, test_namespace, "asked")


def test_an_agentrun_restored_from_a_backup_is_not_executed(
    stack_: E2EStack, test_namespace: str, nats_server: Any
) -> None:
    goal = "E2E-LONG job (restored from a backup)"
    manifest = run_manifest("restored", goal)
    manifest["metadata"]["annotations"] = {ADMITTED_UID: "3f0c1e9a-0000-4000-8000-restoredcopy"}
    stack_.apply(test_namespace, manifest)  # as Velero restores it: no status, a new uid
    status = stack_.wait_terminal(test_namespace, "restored", timeout=30)
    assert status["terminalReason"] == "checkpoint_failed"
    assert status["message"].startswith("not executed: this object was restored from a backup")
    time.sleep(2 * ORPHAN_AFTER)
    assert model_requests(stack_, goal) == []
    assert read_events(nats_server, test_namespace, "restored") == []

    rerun_completes(stack_, test_namespace, "restored", goal)


def test_a_finished_run_restored_while_its_events_are_kept_shows_its_end(
    stack_: E2EStack, test_namespace: str, nats_server: Any
) -> None:
    """etcd restored without status (Velero's default), NATS kept: the copy shows the end its
    original's events hold, and nothing runs again."""
    goal = "E2E-LONG job (restored, its events kept)"
    stack_.apply(test_namespace, run_manifest("kept", goal))
    done = stack_.wait_terminal(test_namespace, "kept", timeout=60)
    assert done["terminalReason"] == "completed"
    uid = stack_.get(test_namespace, "kept")["metadata"]["uid"]  # type: ignore[index]
    assert annotations(stack_, test_namespace, "kept")[ADMITTED_UID] == uid
    asked = len(model_requests(stack_, goal))
    components.kill_component(stack_.operator)
    stack_.kubectl("delete", "agentrun", "kept", "-n", test_namespace, "--timeout=20s")
    copy = run_manifest("kept", goal)
    copy["metadata"]["annotations"] = {ADMITTED_UID: uid}
    stack_.apply(test_namespace, copy)
    stack_.operator = stack.start_operator(stack_.env, launch=stack_.launch)

    status = stack_.wait_terminal(test_namespace, "kept", timeout=60)
    assert (status["terminalReason"], status["answer"], status["usage"]["steps"]) == (
        "completed",
        "Finished the long job.",
        5,
    )
    time.sleep(2 * ORPHAN_AFTER)
    assert len(model_requests(stack_, goal)) == asked
    assert turn_numbers(read_events(nats_server, test_namespace, "kept")) == [0, 1, 2, 3, 4]


def test_a_restored_copy_carrying_kopfs_annotation_of_an_earlier_version_is_not_executed(
    stack_: E2EStack, test_namespace: str, nats_server: Any
) -> None:
    """kopf writes nothing of its own to a run (its last-handled copy is in the operator's
    memory); a backup taken under an earlier version holds kopf's annotation, which the
    operator does not read: the restored copy is recognised all the same."""
    goal = "E2E-LONG job (restored with kopf's annotations)"
    stack_.apply(test_namespace, run_manifest("known", goal))
    assert stack_.wait_terminal(test_namespace, "known", timeout=60)["terminalReason"] == (
        "completed"
    )
    marks = annotations(stack_, test_namespace, "known")
    assert not any(k.startswith("kopf.") for k in marks), marks
    stack_.kubectl("delete", "agentrun", "known", "-n", test_namespace, "--timeout=20s")
    asked = len(model_requests(stack_, goal))
    copy = run_manifest("known", goal)
    copy["metadata"]["annotations"] = {
        ADMITTED_UID: marks[ADMITTED_UID],
        # as operators up to 0.1.0 had kopf write it: the labels and annotations it compared
        "kopf.agentrun.dev/last-handled-configuration": '{"metadata":{}}\n',
    }
    stack_.apply(test_namespace, copy)
    status = stack_.wait_terminal(test_namespace, "known", timeout=30)
    assert status["terminalReason"] == "checkpoint_failed"
    assert status["message"].startswith("not executed: this object was restored from a backup")
    time.sleep(2 * ORPHAN_AFTER)
    assert len(model_requests(stack_, goal)) == asked
