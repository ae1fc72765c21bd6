"""What kopf compares between watch events of an AgentRun, and where its last-handled copy
lives (``startup.RunDiffBaseStorage`` over ``runs.handled.HandledActions``): the control
annotations only, in this process's memory, never written to the object; what this process did
not handle is read from the object (no phase: a creation; a phase: admitted, its control
annotations not handled; ended: its cancel handled)."""

from __future__ import annotations

import json
from typing import Any

import kopf
import pytest
from kopf._cogs.structs import diffs
from kopf._core.intents import causes

from agentrun.operator import runs
from agentrun.operator.handlers import startup as handlers
from agentrun.operator.runs.handled import ACTIONS, HandledActions

SPEC = {"model": "mock", "goal": "add numbers", "tools": ["calculate"]}
RUNNING = {"phase": "Running", "usage": {"steps": 3}, "conditions": [{"type": "Admitted"}]}
ENDED = {"phase": "Failed", "terminalReason": "cancelled"}


def run_object(
    annotations: dict[str, str] | None = None,
    *,
    status: dict[str, Any] | None = None,
    uid: str = "u-1",
    labels: dict[str, str] | None = None,
) -> kopf.Body:
    """An AgentRun as the API server sends it: managed fields, spec and status included."""
    metadata: dict[str, Any] = {
        "name": "r",
        "namespace": "default",
        "uid": uid,
        "resourceVersion": "42",
        "annotations": annotations or {},
        "managedFields": [{"manager": "agentrun", "subresource": "status", "fieldsV1": {}}],
    }
    if labels is not None:
        metadata["labels"] = labels
    raw: dict[str, Any] = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": metadata,
        "spec": SPEC,
    }
    if status is not None:
        raw["status"] = status
    return kopf.Body(raw)


def reason(storage: handlers.RunDiffBaseStorage, body: kopf.Body, *, initial: bool) -> str:
    """The cause kopf detects for ``body`` with ``storage`` (its own ``detect_changing_cause``
    over the essences, as its processing builds them)."""
    old, new = storage.fetch(body=body), storage.build(body=body)
    cause = causes.detect_changing_cause(
        finalizer="unused",
        raw_event={"type": "MODIFIED", "object": dict(body)},  # type: ignore[typeddict-item]
        body=body,
        old=old,
        new=new,
        diff=diffs.diff(old, new),
        initial=initial,
        resource=None,
        indices=None,
        logger=None,
        patch=kopf.Patch(),
        memo=None,
    )
    return str(cause.reason.value)


def handled(storage: handlers.RunDiffBaseStorage, body: kopf.Body) -> kopf.Patch:
    """kopf's step after the handlers of ``body``'s cause are done: store its essence."""
    patch = kopf.Patch()
    storage.store(body=body, patch=patch, essence=storage.build(body=body))
    return patch


def test_the_essence_is_the_action_annotations_alone() -> None:
    body = run_object(
        {
            "kubectl.kubernetes.io/last-applied-configuration": json.dumps({"spec": SPEC}),
            "agentrun.dev/admitted-uid": "u-1",
            "kopf.agentrun.dev/last-handled-configuration": "{}",
            "kopf.agentrun.dev/admit_run": "{}",
            runs.CANCEL_ANNOTATION: "true",
            runs.APPROVE_ANNOTATION: "sha256:abc",
            "agentrun.dev/reviewer": "ann",
            "team.example/owner": "a",
        },
        status=RUNNING,
        labels={"team": "a"},
    )
    assert handlers.RunDiffBaseStorage(HandledActions()).build(body=body) == {
        "metadata": {
            "annotations": {runs.CANCEL_ANNOTATION: "true", runs.APPROVE_ANNOTATION: "sha256:abc"}
        }
    }
    assert (
        handlers.RunDiffBaseStorage(HandledActions()).build(body=run_object(status=RUNNING)) == {}
    )
    assert set(ACTIONS) == {
        runs.CANCEL_ANNOTATION,
        runs.APPROVE_ANNOTATION,
        runs.DENY_ANNOTATION,
        runs.RERUN_ANNOTATION,
    }


def storage() -> handlers.RunDiffBaseStorage:
    return handlers.RunDiffBaseStorage(HandledActions())


def test_a_new_run_is_a_creation_once_and_nothing_is_written_to_it() -> None:
    kept = storage()
    new = run_object()
    assert kept.fetch(body=new) is None
    assert reason(kept, new, initial=False) == "create"
    assert reason(kept, new, initial=True) == "create"  # listed before its first status
    assert not handled(kept, new)  # no annotation, no patch
    assert reason(kept, run_object(), initial=False) == "noop"  # e.g. its admission record
    assert len(kept.handled) == 1
    shown = run_object(status=RUNNING)
    assert reason(kept, shown, initial=False) == "noop"
    assert len(kept.handled) == 0  # its status says as much now


def test_an_admission_that_failed_after_writing_a_status_without_a_phase_is_tried_again() -> None:
    """``resolve_run`` records ``status.resolvedSpec`` before the AgentModel is read; if that
    read fails, kopf retries the creation, which a status must not turn into nothing to do."""
    kept = storage()
    resolved = run_object(status={"resolvedSpec": SPEC, "agent": {"name": "a"}})
    assert reason(kept, resolved, initial=False) == "create"
    handled(kept, resolved)  # the retry admitted it
    assert reason(kept, resolved, initial=False) == "noop"
    assert len(kept.handled) == 1  # kept until a phase shows


def test_an_admitted_run_this_process_never_handled_is_resumed_at_a_listing() -> None:
    """A restart, or a run admitted by another process: a phase, no essence remembered."""
    kept = storage()
    body = run_object({"agentrun.dev/admitted-uid": "u-1"}, status=RUNNING)
    assert reason(kept, body, initial=True) == "resume"
    assert reason(kept, body, initial=False) == "noop"
    assert len(kept.handled) == 0


@pytest.mark.parametrize("action", ACTIONS)
def test_an_action_set_while_this_process_did_not_watch_is_an_update(action: str) -> None:
    """Set while no operator ran (or while another process owned the run): kopf runs its
    handler (and, at a listing, the resume handler with it)."""
    kept = storage()
    body = run_object({action: "true"}, status=RUNNING)
    assert reason(kept, body, initial=True) == "update"
    assert reason(kept, body, initial=False) == "update"


def test_an_action_handled_here_is_not_handled_again_until_it_changes() -> None:
    kept = storage()
    cancelled = run_object({runs.CANCEL_ANNOTATION: "true"}, status=RUNNING)
    assert reason(kept, cancelled, initial=False) == "update"
    assert not handled(kept, cancelled)
    assert reason(kept, cancelled, initial=False) == "noop"  # its next status writes
    asked = run_object({runs.CANCEL_ANNOTATION: "true", runs.DENY_ANNOTATION: "d"}, status=RUNNING)
    assert reason(kept, asked, initial=False) == "update"
    handled(kept, asked)
    removed = run_object({runs.CANCEL_ANNOTATION: "true"}, status=RUNNING)  # review_run's patch
    assert reason(kept, removed, initial=False) == "update"  # no handler matches it
    handled(kept, removed)
    assert reason(kept, removed, initial=False) == "noop"
    assert len(kept.handled) == 1


def test_an_ended_runs_cancel_is_handled_and_the_run_never_kept() -> None:
    """A cancelled run keeps its annotation: at every listing it is resumed (one handler, no
    progress written), not updated; a rerun asked of it is an update."""
    kept = storage()
    handled(kept, run_object({runs.CANCEL_ANNOTATION: "true"}, status=RUNNING))
    ended = run_object({runs.CANCEL_ANNOTATION: "true"}, status=ENDED)
    assert reason(kept, ended, initial=False) == "noop"
    assert len(kept.handled) == 0
    assert reason(kept, ended, initial=False) == "noop"
    assert reason(kept, ended, initial=True) == "resume"
    handled(kept, ended)
    assert len(kept.handled) == 0
    rerun = run_object(
        {runs.CANCEL_ANNOTATION: "true", runs.RERUN_ANNOTATION: "true"}, status=ENDED
    )
    assert reason(kept, rerun, initial=False) == "update"
    assert (
        reason(storage(), run_object({runs.APPROVE_ANNOTATION: "d"}, status=ENDED), initial=False)
        == "update"
    )


def test_runs_are_remembered_by_uid_and_forgotten_when_deleted() -> None:
    """A run deleted and applied again under its name is another object: a creation."""
    kept = storage()
    handled(kept, run_object(uid="u-1"))
    assert reason(kept, run_object(uid="u-2"), initial=False) == "create"
    handled(kept, run_object({runs.CANCEL_ANNOTATION: "true"}, uid="u-3", status=RUNNING))
    kept.handled.forget("u-1")
    kept.handled.forget("u-3")
    assert len(kept.handled) == 0


def test_a_field_asked_for_by_a_handler_is_refused_not_left_out() -> None:
    with pytest.raises(ValueError, match=r"status\.phase"):
        storage().build(body=run_object(status=RUNNING), extra_fields=["status.phase"])
