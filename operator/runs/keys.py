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
