"""What this operator process last handled of each AgentRun's control annotations: kopf's
"last handled" state of a run, kept in memory instead of on the object (pure, no I/O).

kopf tells a creation (nothing handled yet) from an update (the control annotations changed
since) from nothing to do by comparing a run's control annotations with the ones it last
handled. An AgentRun's spec is immutable (CEL ``self == oldSelf``) and its changing handlers
react only to ``ACTIONS``, so those are all that is compared. ``HandledActions`` answers for
every run, also one this process never handled (it restarted, or became the run's owner), from
the object itself:

- no ``status.phase``: never admitted (every admission, queueing and rejection shows a phase;
  an admission that failed part-way may have written ``status.resolvedSpec`` alone), so
  nothing handled: a creation;
- a phase: admitted, by this process or an earlier one; none of its control annotations
  handled, so one set while no process watched is acted on. The handlers are idempotent (a
  run already ended is not ended again; an approval already applied is refused by the
  kernel's digest check and removed), so one an earlier process had acted on costs a no-op;
- ended (``status.terminalReason``): its ``agentrun.dev/cancel`` counts as handled (a cancelled
  run keeps it, and it has nothing left to do); ``rerun`` (which an ended run honours),
  ``approve`` and ``deny`` read as above.

Memory: a run is remembered from its creation here until its status shows a phase, and from an
action handled here until it ends or is deleted (``forget``).

What does not belong here: kopf's storage interface (``handlers.startup.RunDiffBaseStorage``,
the adapter over this), the handlers themselves.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .keys import APPROVE_ANNOTATION, CANCEL_ANNOTATION, DENY_ANNOTATION, RERUN_ANNOTATION

ACTIONS = (CANCEL_ANNOTATION, APPROVE_ANNOTATION, DENY_ANNOTATION, RERUN_ANNOTATION)
"""The control annotations an AgentRun's changing handlers act on (kopf ``on.update``
filters), in the order they are compared."""

Actions = dict[str, str]
"""A run's control annotations (``ACTIONS``) by name, their values as set."""


def actions_of(annotations: Mapping[str, Any]) -> Actions:
    """The ``ACTIONS`` among ``annotations`` (an object's ``metadata.annotations``)."""
    return {key: str(annotations[key]) for key in ACTIONS if key in annotations}


class HandledActions:
    """The control annotations last handled per AgentRun uid (see the module's rules)."""

    def __init__(self) -> None:
        self._by_uid: dict[str, Actions] = {}

    def last(
        self, uid: str, *, status: Mapping[str, Any], annotations: Mapping[str, Any]
    ) -> Actions | None:
        """The control annotations last handled of run ``uid``, whose object now shows
        ``status`` and ``annotations``; ``None`` if its creation was never handled. Forgets
        what the object's status now says as much as (an ended run; an admitted run with no
        action handled)."""
        remembered = self._by_uid.get(uid)
        admitted, ended = bool(status.get("phase")), bool(status.get("terminalReason"))
        if remembered is not None and (ended or (admitted and not remembered)):
            del self._by_uid[uid]
        if ended:
            cancel = annotations.get(CANCEL_ANNOTATION)
            return {CANCEL_ANNOTATION: str(cancel)} if cancel is not None else {}
        if remembered is not None:
            return dict(remembered)
        return {} if admitted else None

    def handled(self, uid: str, *, status: Mapping[str, Any], actions: Actions) -> None:
        """Run ``uid`` (showing ``status``) was handled with ``actions`` set; an ended run is
        not remembered (``last`` answers for it from the object)."""
        if status.get("terminalReason"):
            self._by_uid.pop(uid, None)
            return
        self._by_uid[uid] = dict(actions)

    def forget(self, uid: str) -> None:
        """Run ``uid`` was deleted."""
        self._by_uid.pop(uid, None)

    def __len__(self) -> int:
        """Runs remembered."""
        return len(self._by_uid)
