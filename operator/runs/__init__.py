"""AgentRun: a run's identity, spec, status projection, live views, dispatch and end of life.

Inside: ``keys`` (``RunKey``, the control annotations), ``spec`` (``AgentRun.spec``, pure),
``status`` (events → ``.status`` body, pure), ``views`` (the live view of a run, private to
``dispatch``), ``news`` (a run's Kubernetes Events), ``writer`` (coalesced, monotonic status
patches), ``dispatch`` (the event consumer: next TurnRequest or the end; the one owner of the
live views), ``orphans`` (lost TurnRequests), ``lifecycle`` (TTL deletion, purging the events of
deleted runs), ``recovery`` (create/resume: admit, recover, rerun, or end a run whose checkpoint
is gone, pure), ``handled`` (what kopf last handled of each run's control annotations, in
memory, pure), ``ports`` (``LiveRuns``, what other kinds may ask of the live runs).

This module is the kind's port: other kinds import what is re-exported here and nothing from
the modules inside (the import contracts check it); the handlers and the wiring may import the
modules directly.
"""

from .keys import (
    ADMITTED_UID_ANNOTATION,
    APPROVE_ANNOTATION,
    CANCEL_ANNOTATION,
    DENY_ANNOTATION,
    HOLD_ANNOTATION,
    HOLD_GRADING,
    HOLD_SCHEDULE,
    RERUN_ANNOTATION,
    RUNS,
    RunKey,
)
from .lifecycle import release_hold
from .news import involved, record_end
from .ports import LiveRuns
from .recovery import admitted_patch
from .spec import IMPLICIT_BUDGET, AgentRefSpec, AgentRunSpec, RunBudgetSpec, RunObject
from .status import handed_over as handed_over_status
from .status import queued as queued_status
from .status import rejected as rejected_status

__all__ = [
    "ADMITTED_UID_ANNOTATION",
    "APPROVE_ANNOTATION",
    "CANCEL_ANNOTATION",
    "DENY_ANNOTATION",
    "HOLD_ANNOTATION",
    "HOLD_GRADING",
    "HOLD_SCHEDULE",
    "IMPLICIT_BUDGET",
    "RERUN_ANNOTATION",
    "RUNS",
    "AgentRefSpec",
    "AgentRunSpec",
    "LiveRuns",
    "RunBudgetSpec",
    "RunKey",
    "RunObject",
    "admitted_patch",
    "handed_over_status",
    "involved",
    "queued_status",
    "record_end",
    "rejected_status",
    "release_hold",
]
