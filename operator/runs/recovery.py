"""What an AgentRun seen on create or on an operator's resume becomes: admitted, picked up
from its events, started again from turn 0 because a person asked, or ended
``checkpoint_failed`` because the operator cannot know what it already did. Pure: no I/O.

The run's event stream is its checkpoint (DESIGN §5). A run that was admitted before — its
status shows it (``startTime``, an ``Admitted=True`` condition, an event sequence), or the
operator's ``agentrun.dev/admitted-uid`` annotation names its uid — but whose stream holds none
of its events lost its checkpoint (NATS data lost, the stream purged). Admitting it again from
turn 0 would spend its budget a second time and could repeat its write tools, so it is not: it
ends ``checkpoint_failed`` saying so (``Admission.LOST``). An object whose recorded uid is not
its own is a copy of another object — a restore from a backup (e.g. Velero, which keeps
annotations and gives the object a new uid) — and ends the same way (``Admission.RESTORED``),
unless the original's events are still there and ended it: the copy then shows that end
(``Dispatcher.project_restored``). Either starts fresh only when a person asks:
``agentrun.dev/rerun: "true"`` (``RERUN``), also honoured on a run that ended for any reason.

What does not belong here: acting on the decision (``handlers.admission``), reading the events
(``dispatch.Dispatcher.recover``).
"""

from __future__ import annotations

import contextlib
import datetime
import enum
from collections.abc import Mapping
from typing import Any

from agentrun import kernel

from ..platform.conditions import condition
from .keys import ADMITTED_UID_ANNOTATION, RERUN_ANNOTATION, RunKey

RERUN_REASON = "Rerun"
"""The ``Admitted=False`` condition's reason while a rerun is being queued."""


class Admission(enum.StrEnum):
    """What becomes of an AgentRun on create or resume."""

    SKIP = "skip"
    """It ended and no rerun is asked: nothing to do."""
    RECOVER = "recover"
    """Its events are there: picked up where they left off (``Dispatcher.recover``)."""
    ADMIT = "admit"
    """Never admitted: validated and queued."""
    RERUN = "rerun"
    """A person asked (``agentrun.dev/rerun``): admitted again from turn 0 as a new run."""
    LOST = "lost"
    """Admitted before, its events are gone: ends ``checkpoint_failed``."""
    RESTORED = "restored"
    """A copy of another object (its recorded uid is not its own): shows its original's end,
    or ends ``checkpoint_failed``."""


def admitted_before(status: Mapping[str, Any]) -> bool:
    """Whether ``status`` (an AgentRun's ``.status``) shows the run admitted: a ``startTime``,
    an event sequence, or an ``Admitted`` condition that is ``True``."""
    if status.get("startTime") or status.get("lastEventSequence"):
        return True
    return any(
        c.get("type") == "Admitted" and c.get("status") == "True"
        for c in status.get("conditions") or []
        if isinstance(c, Mapping)
    )


def not_resumed(annotations: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    """Whether a run that is not followed and has not ended is one the operator does not
    resume on its own (``LOST`` or ``RESTORED`` once seen on create or resume): admitted
    before, by its ``status`` or a recorded uid in its ``annotations``."""
    return bool(annotations.get(ADMITTED_UID_ANNOTATION)) or admitted_before(status)


def rerun_started(status: Mapping[str, Any]) -> bool:
    """Whether ``status`` is the one ``rerun_status`` writes: a rerun began (and, while
    ``agentrun.dev/rerun`` is still set, has not been queued yet)."""
    return status.get("phase") == kernel.ResourcePhase.PENDING.value and any(
        c.get("type") == "Admitted" and c.get("reason") == RERUN_REASON
        for c in status.get("conditions") or []
        if isinstance(c, Mapping)
    )


def queued_since(created: float, status: Mapping[str, Any]) -> float:
    """When the run whose object was created at ``created`` (epoch seconds) and shows
    ``status`` joined its tenant's admission queue, epoch seconds: its creation in its first
    life; in a later one, when its rerun began — the ``lastTransitionTime`` of its
    ``Admitted=False`` condition, which ``rerun_status`` writes at the rerun's start and the
    queue's status writes (``Queued``, handed to another shard) carry on, the condition having
    been False since — so that a rerun queues after the runs created before it and its wait
    counts from the rerun, not from the object's creation. ``created`` when no such condition
    can be read."""
    if not status.get("reruns"):
        return created
    for found in status.get("conditions") or []:
        if (
            isinstance(found, Mapping)
            and found.get("type") == "Admitted"
            and found.get("status") == "False"
        ):
            with contextlib.suppress(TypeError, ValueError):
                stamp = str(found.get("lastTransitionTime"))
                return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    return created


def rerun_asked(annotations: Mapping[str, Any]) -> bool:
    """Whether ``agentrun.dev/rerun`` is ``"true"`` (any other value asks nothing)."""
    return annotations.get(RERUN_ANNOTATION) == "true"


def decide(
    *, uid: str, annotations: Mapping[str, Any], status: Mapping[str, Any], has_events: bool
) -> Admission:
    """The decision for the AgentRun with ``uid``, ``annotations`` and ``status``;
    ``has_events``: its stream holds its own (sealed) admission. Rules, in order: an ended run
    reruns if asked, else is left alone; a run with its events is recovered (a rerun asked of
    it is ignored: it is still going); a rerun asked is honoured; a recorded uid that is not
    ``uid`` is a restored copy; a recorded uid or a status showing it admitted is a lost
    checkpoint; anything else is admitted."""
    rerun = rerun_asked(annotations)
    if status.get("terminalReason"):
        return Admission.RERUN if rerun else Admission.SKIP
    if has_events:
        return Admission.RECOVER
    if rerun:
        return Admission.RERUN
    recorded = annotations.get(ADMITTED_UID_ANNOTATION)
    if recorded and recorded != uid:
        return Admission.RESTORED
    if recorded == uid or admitted_before(status):
        return Admission.LOST
    return Admission.ADMIT


def admitted_patch(uid: str) -> dict[str, Any]:
    """The merge patch recording that the object with ``uid`` was admitted; it carries the
    uid, which the API server does not let a patch change (422), so it never lands on a newer
    object of the same name."""
    return {"metadata": {"uid": uid, "annotations": {ADMITTED_UID_ANNOTATION: uid}}}


def end_message(action: Admission, key: RunKey, *, annotations: Mapping[str, Any]) -> str:
    """The ``checkpoint_failed`` message of a ``LOST`` or ``RESTORED`` run ``key``: what
    happened and how to start it fresh. Raises ``ValueError`` for another decision."""
    rerun = (
        f"to run it again from turn 0 as a new run (its budget charged again), set "
        f'{RERUN_ANNOTATION}: "true": kubectl annotate agentrun {key.name} -n {key.namespace} '
        f"{RERUN_ANNOTATION}=true"
    )
    if action is Admission.LOST:
        return (
            "not resumed: this run was admitted before, but its checkpoint (its event stream "
            f"in AGENTRUN_EVENTS) holds none of its events (NATS data lost or purged?); it is "
            "not restarted from turn 0 on its own, which would spend its budget again and "
            f"could repeat its write tools; {rerun}"
        )
    if action is Admission.RESTORED:
        return (
            "not executed: this object was restored from a backup (its "
            f"{ADMITTED_UID_ANNOTATION} {annotations.get(ADMITTED_UID_ANNOTATION)!s} is another "
            f"object's uid; its own is {key.uid}); running it again could repeat what the "
            f"original run did; {rerun}"
        )
    raise ValueError(f"no end for {action.value}")


def rerun_status(*, at: float, generation: int, reruns: int) -> dict[str, Any]:
    """The ``.status`` merge patch that starts a rerun afresh: the previous run's end, usage,
    admitted caps, times and event sequence removed (``None``), ``Pending`` until it is queued, and
    ``reruns``, the life it starts (the one its admission seals); ``at`` is epoch seconds."""
    message = f"{RERUN_ANNOTATION}: admitted again from turn 0 as a new run"
    cleared = (
        "terminalReason",
        "outcome",
        "completionTime",
        "answer",
        "startTime",
        "lastEventSequence",
        "usage",
        "budget",
        "pendingApproval",
        "queuePosition",
    )
    return {
        **dict.fromkeys(cleared),
        "phase": kernel.ResourcePhase.PENDING.value,
        "message": message,
        "observedGeneration": generation,
        "reruns": reruns,
        "conditions": [
            condition(
                "Admitted",
                status=False,
                reason=RERUN_REASON,
                message=message,
                at=at,
                generation=generation,
            )
        ],
    }
