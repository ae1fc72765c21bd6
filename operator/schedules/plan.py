"""CronAgentRun planning: given a schedule, its time zone, what ran and the time, what to do.

What belongs here, all pure (``now`` is passed in, epoch seconds): parsing a schedule and its
time zone (``Schedule``; the cron arithmetic is the ``cronsim`` library's), the planning rule
(``plan``), the history rule (``prune``) and the deterministic name of a scheduled run
(``run_name``). What does not: reading or writing objects, Events, timers (``controller``); the
spec's pydantic model (``spec``).

The rule is CronJob's:

- The schedule times due are those after the last scheduled time (else the object's creation)
  up to ``now``. Only the most recent is started; the older ones are missed. With
  ``startingDeadlineSeconds`` a time more than that many seconds ago is not started at all
  (``MissSchedule``); more than ``TOO_MANY_MISSED`` missed times warn (``TooManyMissedTimes``).
- ``Allow`` starts it next to running runs, ``Replace`` cancels the running ones and starts it,
  ``Forbid`` skips it while one runs. A skipped time is not recorded as scheduled, so when the
  running run ends before the next time (and within the deadline, if one is set) it starts
  then, late, as a CronJob's does.
- ``Allow`` skips a time as ``Forbid`` does while ``MAX_ACTIVE_RUNS`` runs of the schedule
  have not ended (``Skip.full``): runs that queue for ever (the tenant's quota) do not pile up
  one per schedule time without end.
- ``suspend`` starts nothing; after resuming, the same rule applies to the times passed
  meanwhile (set a deadline to drop them).

Time zones follow Debian cron (cronsim's reading): a daily time that does not exist on the day
clocks spring forward runs once at the first moment after the gap, one that exists twice on the
day clocks fall back runs once (the first); expressions with a ``*`` in the minute or hour
field, and six-field expressions, count real time through either change.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import zoneinfo
from collections.abc import Iterator, Sequence

import cronsim

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
"""The macros a CronJob's ``schedule`` accepts, as the expressions they stand for."""
TOO_MANY_MISSED = 100
"""More missed schedule times than this warn (CronJob's threshold); counting stops there."""
UTC = datetime.UTC
MAX_ACTIVE_RUNS = 1000
"""Runs of one schedule that have not ended, at most (``status.active``'s bound): under
``Allow`` a time due with this many is skipped (``Skip.full``); ``Forbid`` skips at one,
``Replace`` cancels them."""
MAX_HISTORY = 1000
"""Finished runs of each kind (succeeded; failed or cancelled) a schedule keeps, at most,
whatever its history limits say (the CRD's ``maximum``; this bound for objects stored
before it)."""


class ScheduleError(ValueError):
    """A schedule or time zone that cannot be used; the message names the field."""


class ConcurrencyPolicy(enum.StrEnum):
    """``spec.concurrencyPolicy``: a schedule time comes while a run of the schedule runs..."""

    ALLOW = "Allow"
    """...start another beside it."""
    FORBID = "Forbid"
    """...skip this time (it starts late if the running one ends in time)."""
    REPLACE = "Replace"
    """...cancel the running ones (as ``kubectl agentrun cancel`` does) and start it."""


@dataclasses.dataclass(frozen=True, slots=True)
class Schedule:
    """A parsed ``spec.schedule`` in its ``spec.timeZone``. Build with ``Schedule.parse``."""

    written: str
    """As written (a macro stays a macro)."""
    expression: str
    """Five fields (minute to weekday) or six (a seconds field first)."""
    zone: zoneinfo.ZoneInfo

    @classmethod
    def parse(cls, schedule: str, *, time_zone: str | None) -> Schedule:
        """Raises ``ScheduleError`` naming ``spec.schedule`` (one that matches no time from
        now on too: ``next_after`` could not answer) or ``spec.timeZone``."""
        zone = parse_zone(time_zone)
        written = schedule.strip()
        if "TZ=" in written:
            raise ScheduleError(
                f"spec.schedule: {schedule!r} sets a time zone; use spec.timeZone instead"
            )
        expression = MACROS.get(written.lower(), written)
        if expression.startswith("@"):
            raise ScheduleError(
                f"spec.schedule: unknown macro {written!r} (known: {', '.join(MACROS)})"
            )
        try:
            times = cronsim.CronSim(expression, datetime.datetime.now(zone))
        except cronsim.CronSimError as err:
            raise ScheduleError(
                f"spec.schedule: {schedule!r} is not a cron schedule ({err}); five fields "
                "(minute hour day-of-month month day-of-week), six with seconds first, or a "
                "macro such as @hourly"
            ) from None
        if next(times, None) is None:  # cronsim looks 50 years ahead
            raise ScheduleError(
                f"spec.schedule: {schedule!r} matches no time in the next 50 years (when the "
                "day-of-month or the day-of-week field starts with *, a day must match both)"
            )
        return cls(written, expression, zone)

    def _iterate(self, start: float, *, reverse: bool = False) -> Iterator[float]:
        moment = datetime.datetime.fromtimestamp(start, UTC).astimezone(self.zone)
        for found in cronsim.CronSim(self.expression, moment, reverse=reverse):
            yield found.timestamp()

    def next_after(self, moment: float) -> float:
        """The first schedule time strictly after ``moment`` (epoch seconds)."""
        return next(self._iterate(moment))

    def latest_until(self, moment: float) -> float | None:
        """The last schedule time at or before ``moment``, or ``None`` when there is none."""
        return next(self._iterate(float(int(moment) + 1), reverse=True), None)

    def due(self, after: float, until: float, *, limit: int) -> tuple[list[float], bool]:
        """Schedule times in ``(after, until]``, at most ``limit`` of them; the flag says
        whether there are more (then the last listed one is not the most recent)."""
        found: list[float] = []
        for moment in self._iterate(after):
            if moment > until:
                return found, False
            if len(found) == limit:
                return found, True
            found.append(moment)
        return found, False


def parse_zone(time_zone: str | None) -> zoneinfo.ZoneInfo:
    """``spec.timeZone`` (an IANA name; ``None``: UTC); raises ``ScheduleError``."""
    if time_zone is None:
        return zoneinfo.ZoneInfo("UTC")
    try:
        return zoneinfo.ZoneInfo(time_zone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(
            f"spec.timeZone: {time_zone!r} is not a time zone of the IANA database "
            "(e.g. Europe/Berlin, America/New_York, UTC)"
        ) from None


@dataclasses.dataclass(frozen=True, slots=True)
class Policy:
    """What ``spec`` says about starting runs."""

    concurrency: ConcurrencyPolicy = ConcurrencyPolicy.ALLOW
    starting_deadline: float | None = None
    """``startingDeadlineSeconds``; ``None``: a due time may start however late."""
    suspend: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class ActiveRun:
    """A run of the schedule that has not ended."""

    name: str
    uid: str
    scheduled: float
    """The schedule time it was created for (epoch seconds)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Missed:
    """Schedule times that passed and get no run."""

    count: int
    """How many (at most ``TOO_MANY_MISSED + 1``: counting stops)."""
    latest: float
    """The most recent of them."""
    past_deadline: bool
    """Whether the most recent due time was already past ``startingDeadlineSeconds``."""

    @property
    def too_many(self) -> bool:
        """More than ``TOO_MANY_MISSED``."""
        return self.count > TOO_MANY_MISSED


@dataclasses.dataclass(frozen=True, slots=True)
class Wait:
    """Nothing to start now; look again at ``wake``."""

    wake: float
    missed: Missed | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Suspended:
    """``spec.suspend``: nothing starts; nothing to wake for."""


@dataclasses.dataclass(frozen=True, slots=True)
class Start:
    """Create the run for ``scheduled`` (after cancelling ``cancel``); look again at ``wake``."""

    scheduled: float
    wake: float
    cancel: tuple[ActiveRun, ...] = ()
    missed: Missed | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Skip:
    """``Forbid`` (or ``Allow`` at ``MAX_ACTIVE_RUNS``): ``scheduled`` is due but ``running``
    still run; look again at ``wake`` (or when a run ends)."""

    scheduled: float
    wake: float
    running: tuple[ActiveRun, ...]
    missed: Missed | None = None
    full: bool = False
    """Skipped for ``MAX_ACTIVE_RUNS`` runs not ended (``Allow``), not for ``Forbid``."""


Plan = Wait | Suspended | Start | Skip


def plan(
    schedule: Schedule,
    *,
    policy: Policy,
    last: float,
    now: float,
    active: Sequence[ActiveRun],
) -> Plan:
    """What to do at ``now`` (epoch seconds).

    ``last``: the last time a run was scheduled for, else when the object was created;
    ``active``: its runs that have not ended.
    """
    if policy.suspend:
        return Suspended()
    wake = schedule.next_after(now)
    due, more = schedule.due(last, now, limit=TOO_MANY_MISSED + 1)
    if not due:
        return Wait(wake)
    latest = schedule.latest_until(now) if more else due[-1]
    assert latest is not None  # at least one time is due
    deadline = policy.starting_deadline
    if deadline is not None and latest + deadline < now:
        return Wait(wake, Missed(len(due), latest, past_deadline=True))
    missed = None
    if more:  # the listed ones all passed; counting stopped there
        missed = Missed(len(due), due[-1], past_deadline=False)
    elif len(due) > 1:
        missed = Missed(len(due) - 1, due[-2], past_deadline=False)
    if active and policy.concurrency is ConcurrencyPolicy.FORBID:
        return Skip(latest, wake, tuple(active), missed)
    if len(active) >= MAX_ACTIVE_RUNS and policy.concurrency is ConcurrencyPolicy.ALLOW:
        return Skip(latest, wake, tuple(active), missed, full=True)
    cancel = tuple(active) if policy.concurrency is ConcurrencyPolicy.REPLACE else ()
    return Start(latest, wake, cancel, missed)


def run_name(cron: str, scheduled: float) -> str:
    """``<cron name>-<scheduled unix seconds>``: the same time always names the same run, so a
    second attempt (a restart, a failover) meets AlreadyExists instead of a double."""
    return f"{cron}-{int(scheduled)}"


@dataclasses.dataclass(frozen=True, slots=True)
class FinishedRun:
    """A run of the schedule that has ended."""

    name: str
    scheduled: float
    succeeded: bool


def prune(
    finished: Sequence[FinishedRun], *, successful_limit: int, failed_limit: int
) -> tuple[str, ...]:
    """The names of finished runs beyond the history limits: the oldest (by schedule time)
    successful runs past ``successful_limit`` and failed (or cancelled) ones past
    ``failed_limit``, each limit at most ``MAX_HISTORY``."""
    doomed: list[str] = []
    for succeeded, limit in ((True, successful_limit), (False, failed_limit)):
        kind = sorted(
            (run for run in finished if run.succeeded is succeeded),
            key=lambda run: (run.scheduled, run.name),
            reverse=True,
        )
        doomed.extend(run.name for run in kind[min(max(limit, 0), MAX_HISTORY) :])
    return tuple(sorted(doomed))
