"""An AgentRun's identity and the annotations a person sets on it.

What belongs here: the ``RunKey`` every part of the operator names a run by, the AgentRun's
plural, the control annotations' names. Nothing here does I/O.
"""

from __future__ import annotations

import dataclasses

from agentrun import kube

from ..platform.kubeapi import Ref

RUNS = kube.RUNS
"""The plural of ``AgentRun``."""
CANCEL_ANNOTATION = "agentrun.dev/cancel"
"""Set to ``"true"`` to end the run ``cancelled`` (a queued run leaves its queue)."""
APPROVE_ANNOTATION = "agentrun.dev/approve"
"""Set to the digest in ``.status.pendingApproval`` to approve that held call."""
DENY_ANNOTATION = "agentrun.dev/deny"
"""Set to the digest in ``.status.pendingApproval`` to deny that held call."""
RERUN_ANNOTATION = "agentrun.dev/rerun"
"""Set to ``"true"`` to run the AgentRun again from turn 0 as a new run (new events, its budget
charged again): honoured on a run that ended, whatever its reason, and on one the operator would
not resume because its checkpoint is gone or it was restored from a backup (``recovery``);
removed once read (ignored, with a Warning Event, on a run still going)."""
ADMITTED_UID_ANNOTATION = "agentrun.dev/admitted-uid"
"""Written by the operator when it admits the run, or sees it ended: the object's uid. It
survives a backup and restore of the object (annotations do; the uid does not), so a restored
copy, whose uid is new, is recognised and not executed again by accident (``recovery``)."""
HOLD_ANNOTATION = "agentrun.dev/hold"
"""Set by the object that created the run and still has to read its end — an AgentEval
(``grading``: the case's grade, read from the run's events) or a CronAgentRun (``schedule``:
its last success and history) — and removed once what it read is in that object's status:
while it is set, no ``ttlSecondsAfterFinished`` (the run's own, or its tenant's default)
deletes the finished run (``lifecycle.due_time``)."""
HOLD_GRADING = "grading"
"""``HOLD_ANNOTATION``'s value on an AgentEval's case run."""
HOLD_SCHEDULE = "schedule"
"""``HOLD_ANNOTATION``'s value on a CronAgentRun's run."""
REVIEWER_ANNOTATION = "agentrun.dev/reviewer"
"""Set with ``approve``/``deny`` to the deciding user's Kubernetes name: the chart's admission
policy (``agentrun-approval``) refuses a value other than the requesting user's and a caller
without the ``approve`` verb on ``agentruns/approval``; the operator records it as the
reviewer."""


@dataclasses.dataclass(frozen=True, slots=True)
class RunKey:
    """Which AgentRun object: namespace, name and uid (names are reused, uids never)."""

    namespace: str
    name: str
    uid: str

    @property
    def ref(self) -> Ref:
        """The AgentRun object, for the API server (``platform.kubeapi``)."""
        return Ref(RUNS, self.name, self.namespace)
