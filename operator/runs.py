"""An AgentRun's identity and the annotations a person sets on it to steer it.

What belongs here: the ``RunKey`` every operator module uses to name a run, and the control
annotations' names. Nothing here does I/O.
"""

from __future__ import annotations

import dataclasses

CANCEL_ANNOTATION = "agentrun.dev/cancel"
"""Set to ``"true"`` to end the run ``cancelled`` (a queued run leaves its queue)."""


@dataclasses.dataclass(frozen=True, slots=True)
class RunKey:
    """Which AgentRun object: namespace, name and uid (names are reused, uids never)."""

    namespace: str
    name: str
    uid: str
