"""What an AgentRun seen on create or resume becomes (``runs.recovery``): a run whose
checkpoint is gone, or a copy restored from a backup, is never run again unless a person asks."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun.operator.runs import recovery
from agentrun.operator.runs import status as operator_status
from agentrun.operator.runs.keys import ADMITTED_UID_ANNOTATION, RERUN_ANNOTATION, RunKey
from agentrun.operator.runs.recovery import Admission

UID = "uid-now"
RUNNING = {
    "phase": "Running",
    "startTime": "2026-12-01T20:00:00Z",
    "lastEventSequence": 7,
    "tenant": "t",
}
ENDED = {"phase": "Succeeded", "terminalReason": "completed", "startTime": "2026-12-01T20:00:00Z"}
QUEUED = {"phase": "Queued", "queuePosition": 2, "tenant": "t"}
RERUN = {RERUN_ANNOTATION: "true"}
MINE = {ADMITTED_UID_ANNOTATION: UID}
OTHERS = {ADMITTED_UID_ANNOTATION: "uid-before-the-restore"}

DECISIONS = {
    "a new run is admitted": ({}, {}, False, Admission.ADMIT),
    "a queued run is admitted (its queue may be gone too)": ({}, QUEUED, False, Admission.ADMIT),
    "a run with its events is recovered": (MINE, RUNNING, True, Admission.RECOVER),
    "a run admitted before the annotation existed is recovered": (
        {},
        RUNNING,
        True,
        Admission.RECOVER,
    ),
    "a rerun asked of a run still going is not honoured": (
        {**MINE, **RERUN},
        RUNNING,
        True,
        Admission.RECOVER,
    ),
    "an ended run is left alone": (MINE, ENDED, False, Admission.SKIP),
    "an ended run with its events is left alone": (MINE, ENDED, True, Admission.SKIP),
    "an ended run reruns when asked": ({**MINE, **RERUN}, ENDED, True, Admission.RERUN),
    "a run whose status shows it admitted, without events, is lost": (
        {},
        RUNNING,
        False,
        Admission.LOST,
    ),
    "a run whose recorded uid is its own, without events, is lost": (
        MINE,
        {},
        False,
        Admission.LOST,
    ),
    "a lost run reruns when asked": ({**MINE, **RERUN}, RUNNING, False, Admission.RERUN),
    "a copy restored without status is restored": (OTHERS, {}, False, Admission.RESTORED),
    "a copy restored with its running status is restored": (
        OTHERS,
        {**RUNNING},
        False,
        Admission.RESTORED,
    ),
    "a restored copy reruns when asked": ({**OTHERS, **RERUN}, {}, False, Admission.RERUN),
    "a restored copy that ended is left alone": (OTHERS, ENDED, False, Admission.SKIP),
    "only the value true asks for a rerun": (
        {**MINE, RERUN_ANNOTATION: "yes"},
        RUNNING,
        False,
        Admission.LOST,
    ),
}


@pytest.mark.parametrize(
    ("annotations", "status", "has_events", "expected"),
    list(DECISIONS.values()),
    ids=list(DECISIONS),
)
def test_the_decision(
    annotations: dict[str, str], status: dict[str, Any], has_events: bool, expected: Admission
) -> None:
    got = recovery.decide(uid=UID, annotations=annotations, status=status, has_events=has_events)
    assert got is expected


ADMITTED = {
    "a start time": ({"startTime": "2026-12-01T20:00:00Z"}, True),
    "an event sequence": ({"lastEventSequence": 3}, True),
    "an Admitted=True condition": ({"conditions": [{"type": "Admitted", "status": "True"}]}, True),
    "an Admitted=False condition": (
        {"conditions": [{"type": "Admitted", "status": "False"}]},
        False,
    ),
    "a queued status": (QUEUED, False),
    "no status": ({}, False),
}


@pytest.mark.parametrize(("status", "expected"), list(ADMITTED.values()), ids=list(ADMITTED))
def test_what_shows_a_run_admitted(status: dict[str, Any], expected: bool) -> None:
    assert recovery.admitted_before(status) is expected


def test_the_lost_message_says_the_checkpoint_is_gone_and_how_to_rerun() -> None:
    message = recovery.end_message(Admission.LOST, RunKey("ns", "r", UID), annotations=MINE)
    assert "checkpoint" in message and "holds none of its events" in message
    assert "kubectl annotate agentrun r -n ns agentrun.dev/rerun=true" in message


def test_the_restored_message_names_both_uids_and_how_to_rerun() -> None:
    message = recovery.end_message(Admission.RESTORED, RunKey("ns", "r", UID), annotations=OTHERS)
    assert "restored from a backup" in message
    assert "uid-before-the-restore" in message and UID in message
    assert "agentrun.dev/rerun=true" in message


def test_only_a_lost_or_restored_run_has_an_end_message() -> None:
    with pytest.raises(ValueError, match="no end for admit"):
        recovery.end_message(Admission.ADMIT, RunKey("ns", "r", UID), annotations={})


def test_a_rerun_clears_the_previous_runs_end_usage_caps_and_times() -> None:
    """Its caps (``budget``) too: the new life's admission writes them again, and until then
    (Pending, Queued) it shows none, not the earlier life's."""
    body = recovery.rerun_status(at=0.0, generation=2, reruns=3)
    cleared_fields = ("terminalReason", "completionTime", "startTime", "lastEventSequence")
    for cleared in (*cleared_fields, "usage", "budget"):
        assert cleared in body and body[cleared] is None  # a merge patch removes it
    assert body["phase"] == "Pending" and body["observedGeneration"] == 2
    assert body["reruns"] == 3  # the life it starts, which its admission seals
    (admitted,) = body["conditions"]
    assert (admitted["type"], admitted["status"], admitted["reason"]) == (
        "Admitted",
        "False",
        "Rerun",
    )
    assert not recovery.admitted_before(body)


def test_the_admission_record_carries_the_uid_as_a_precondition() -> None:
    assert recovery.admitted_patch(UID) == {
        "metadata": {"uid": UID, "annotations": {ADMITTED_UID_ANNOTATION: UID}}
    }


NOT_RESUMED = {
    "a recorded uid": (MINE, {}, True),
    "a status showing it admitted": ({}, RUNNING, True),
    "a queued run": ({}, QUEUED, False),
    "a new run": ({}, {}, False),
}


@pytest.mark.parametrize(
    ("annotations", "status", "expected"), list(NOT_RESUMED.values()), ids=list(NOT_RESUMED)
)
def test_which_runs_not_followed_the_operator_does_not_resume(
    annotations: dict[str, str], status: dict[str, Any], expected: bool
) -> None:
    assert recovery.not_resumed(annotations, status) is expected


def test_a_rerun_being_queued_is_recognised_by_its_status() -> None:
    assert recovery.rerun_started(recovery.rerun_status(at=0.0, generation=1, reruns=1))
    assert not recovery.rerun_started(QUEUED)
    assert not recovery.rerun_started({"phase": "Pending"})
    assert not recovery.rerun_started(RUNNING)


CREATED = 1_764_000_000.0
"""An AgentRun's creationTimestamp (epoch seconds)."""


def test_a_first_life_joins_its_queue_at_its_creation() -> None:
    assert recovery.queued_since(CREATED, {}) == CREATED
    assert recovery.queued_since(CREATED, QUEUED) == CREATED


def test_a_rerun_joins_its_queue_when_it_began_not_at_the_objects_creation() -> None:
    """A rerun of a run made an hour ago queues after the runs made since (and its wait, the
    ``Admitted`` Event's and ``agentrun_run_admission_wait_seconds``, counts from the rerun):
    by its creation it went ahead of them all, and its wait read an hour."""
    began = CREATED + 3600.0
    status = recovery.rerun_status(at=began, generation=1, reruns=1)
    assert recovery.queued_since(CREATED, status) == began


def merged(status: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """``status`` after the merge patch ``patch`` (a list, ``conditions``, replaced whole)."""
    out = {**status, **patch}
    return {key: value for key, value in out.items() if value is not None}


def test_a_rerun_shown_queued_or_handed_over_still_says_when_it_began() -> None:
    """The queue's own status writes replace the rerun's condition (a merge patch replaces a
    list); their ``Admitted=False`` condition has been False since the rerun began and says
    so, so an operator that starts again, or the shard the run is handed to, queues it from
    then (before, from the object's creation: ahead of every run queued since)."""
    began = CREATED + 3600.0
    rerun = recovery.rerun_status(at=began, generation=1, reruns=1)
    waiting = operator_status.queued(
        tenant="t", reason="ConcurrencyLimit", message="m", position=3, at=began, generation=1
    )
    assert recovery.queued_since(CREATED, merged(rerun, waiting)) == began
    handed = operator_status.handed_over(tenant="u", message="m", at=began, generation=1)
    assert recovery.queued_since(CREATED, merged(merged(rerun, waiting), handed)) == began


@pytest.mark.parametrize(
    "conditions",
    [
        pytest.param([], id="no-condition"),
        pytest.param([{"type": "Admitted", "status": "False"}], id="no-time"),
        pytest.param(
            [{"type": "Admitted", "status": "False", "lastTransitionTime": "soon"}], id="bad-time"
        ),
        pytest.param(
            [{"type": "Admitted", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            id="admitted",
        ),
        pytest.param(["Admitted"], id="not-an-object"),
    ],
)
def test_a_rerun_whose_start_cannot_be_read_joins_at_its_creation(conditions: Any) -> None:
    assert recovery.queued_since(CREATED, {"reruns": 1, "conditions": conditions}) == CREATED
