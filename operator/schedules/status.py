"""A CronAgentRun's ``.status`` (pure): its runs as read back, the body a controller pass
writes, and whether the object already shows it.

What belongs here: the status fields (``lastScheduleTime``, ``lastSuccessfulTime``,
``nextScheduleTime``, ``active``/``activeRuns``, the ``Ready`` condition, ``observedGeneration``)
from the runs read back and the plan. What does not: deciding what runs (``plan``), writing
it (``store``).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from agentrun import kube

from .. import runs
from ..platform import conditions
from .spec import SCHEDULED_ANNOTATION, Checked

MAX_ACTIVE = 1000
"""References ``status.active`` lists at most (the CRD's ``maxItems``; ``plan.MAX_ACTIVE_RUNS``
keeps a schedule's unfinished runs within it under ``Allow``): the newest runs."""


def epoch(text: Any) -> float | None:
    """An RFC 3339 timestamp as epoch seconds; ``None`` for anything else."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class OwnedRun:
    """A run a CronAgentRun created, as read back."""

    name: str
    uid: str
    scheduled: float
    ended: bool
    succeeded: bool
    completed_at: float | None
    held: bool = False
    """It carries ``runs.HOLD_ANNOTATION``: no TTL deletes it until the schedule releases it."""

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> OwnedRun | None:
        """A run object as a dict; ``None`` if it lacks its schedule-time annotation."""
        meta = obj.get("metadata") or {}
        scheduled = epoch((meta.get("annotations") or {}).get(SCHEDULED_ANNOTATION))
        if scheduled is None:
            return None
        run_status = obj.get("status") or {}
        return cls(
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            scheduled=scheduled,
            ended=bool(run_status.get("terminalReason")),
            succeeded=run_status.get("phase") == "Succeeded",
            completed_at=epoch(run_status.get("completionTime")),
            held=runs.HOLD_ANNOTATION in (meta.get("annotations") or {}),
        )


def unchanged(old: Mapping[str, Any], body: Mapping[str, Any]) -> bool:
    """Whether the status ``old`` already holds every field of ``body`` (conditions compared
    without their transition time; ``None`` and an empty list mean absent)."""
    return all(_same(old.get(key), value) for key, value in body.items())


def _same(old: Any, new: Any) -> bool:
    if isinstance(old, list) and isinstance(new, list) and old and new:
        strip = [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in old]
        return strip == [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in new]
    return bool(old == new or (old in (None, []) and new in (None, [])))


def ready(flag: bool, reason: str, message: str, *, now: float, generation: int) -> dict[str, Any]:
    """``{"conditions": [Ready]}``."""
    condition = conditions.condition(
        "Ready", status=flag, reason=reason, message=message, at=now, generation=generation
    )
    return {"conditions": [condition]}


def schedule_ready(
    checked: Checked,
    old: Mapping[str, Any],
    *,
    wake: float | None,
    now: float,
    generation: int,
) -> dict[str, Any]:
    """The ``Ready=True`` condition of a usable CronAgentRun: ``Suspended``, or ``Scheduled``
    with the next time in the message; the transition time kept from ``old`` (its status)."""
    if checked.policy.suspend:
        found = ready(
            True, "Suspended", "spec.suspend: no runs are created", now=now, generation=generation
        )
    else:
        zone = checked.spec.time_zone or "UTC"
        next_at = conditions.rfc3339(wake) if wake is not None else "never"
        message = f"{checked.schedule.written} ({zone}): next run at {next_at}"
        found = ready(True, "Scheduled", message, now=now, generation=generation)
    before = next((c for c in old.get("conditions") or [] if c.get("type") == "Ready"), None)
    if before is not None and before.get("status") == "True":
        found["conditions"][0]["lastTransitionTime"] = before.get("lastTransitionTime")
    return found


def last_successful(owned: Sequence[OwnedRun], old: Mapping[str, Any]) -> dict[str, Any]:
    """``{"lastSuccessfulTime": ...}``: the latest completion of a Succeeded run of ``owned``
    or the one ``old`` (the status before) recorded (``None``: none ever)."""
    successes = [r.completed_at for r in owned if r.succeeded and r.completed_at is not None]
    last = max([*successes, epoch(old.get("lastSuccessfulTime")) or 0.0])
    return {"lastSuccessfulTime": conditions.rfc3339(last) if last else None}


def status_body(
    cron: Mapping[str, Any],
    owned: Sequence[OwnedRun],
    checked: Checked,
    *,
    wake: float | None,
    now: float,
    scheduled: float,
) -> dict[str, Any]:
    """The CronAgentRun's ``.status`` after a pass (``None`` values remove a field).

    ``owned``: its runs, those the history limits delete after this write too (their ends
    count); ``wake``: the next schedule time (``None``: suspended);
    ``scheduled``: the last schedule time this process created a run for (0: none).
    """
    meta = cron.get("metadata") or {}
    old: Mapping[str, Any] = cron.get("status") or {}
    generation = int(meta.get("generation") or 1)
    last = max(
        [scheduled, *(r.scheduled for r in owned), epoch(old.get("lastScheduleTime")) or 0.0]
    )
    active = [
        {
            "apiVersion": f"{kube.GROUP}/{kube.VERSION}",
            "kind": "AgentRun",
            "name": run.name,
            "namespace": str(meta.get("namespace", "")),
            **({"uid": run.uid} if run.uid else {}),
        }
        for run in sorted(owned, key=lambda r: (r.scheduled, r.name))
        if not run.ended
    ]
    return {
        "observedGeneration": generation,
        "lastScheduleTime": conditions.rfc3339(last) if last else None,
        **last_successful(owned, old),
        "nextScheduleTime": conditions.rfc3339(wake) if wake is not None else None,
        # the newest MAX_ACTIVE (the CRD's bound); activeRuns counts them all
        "active": active[-MAX_ACTIVE:] or None,
        "activeRuns": len(active),
        **schedule_ready(checked, old, wake=wake, now=now, generation=generation),
    }
