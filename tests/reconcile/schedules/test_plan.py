"""CronAgentRun planning with a fake clock: which schedule time starts, what is skipped,
cancelled or missed, and when to wake (pure)."""

from __future__ import annotations

import datetime
import zoneinfo
from typing import Any

import pytest

from agentrun.operator import runs
from agentrun.operator.schedules import plan as cronplan
from agentrun.operator.schedules import spec as cronspec
from agentrun.operator.schedules.plan import (
    ActiveRun,
    ConcurrencyPolicy,
    FinishedRun,
    Policy,
    Schedule,
    Skip,
    Start,
    Suspended,
    Wait,
)

UTC = datetime.UTC


def at(text: str, zone: str = "UTC") -> float:
    """Epoch seconds of a wall-clock time in ``zone`` (``2026-03-29 02:30``; an ambiguous
    time is its first occurrence)."""
    local = datetime.datetime.fromisoformat(text).replace(tzinfo=zoneinfo.ZoneInfo(zone))
    return local.timestamp()


def utc(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S")


HOURLY = Schedule.parse("@hourly", time_zone=None)
RUNNING = (ActiveRun("daily-1", "uid-1", at("2026-11-30 09:00")),)


# --- parsing ----------------------------------------------------------------------------------

MACROS = pytest.mark.parametrize(
    ("macro", "expression"),
    [
        ("@hourly", "0 * * * *"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@weekly", "0 0 * * 0"),
        ("@monthly", "0 0 1 * *"),
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
    ],
)


@MACROS
def test_a_macro_stands_for_the_cronjob_expression(macro: str, expression: str) -> None:
    schedule = Schedule.parse(macro, time_zone=None)
    assert (schedule.written, schedule.expression) == (macro, expression)


BAD_SCHEDULES = pytest.mark.parametrize(
    ("schedule", "words"),
    [
        pytest.param("61 * * * *", "not a cron schedule", id="minute-out-of-range"),
        pytest.param("* * *", "not a cron schedule", id="three-fields"),
        pytest.param("@fortnightly", "unknown macro", id="unknown-macro"),
        pytest.param("CRON_TZ=Europe/Berlin 0 6 * * *", "use spec.timeZone", id="tz-inline"),
        # the 1st or the 21st, and the month's last Sunday (never after the 21st): never
        pytest.param("0 0 */20 * 7L", "matches no time", id="never"),
        pytest.param("30 0 0 */20 * 7L", "matches no time", id="never-with-seconds"),
    ],
)


@BAD_SCHEDULES
def test_an_invalid_schedule_is_refused_naming_the_field(schedule: str, words: str) -> None:
    with pytest.raises(cronplan.ScheduleError) as caught:
        Schedule.parse(schedule, time_zone=None)
    assert str(caught.value).startswith("spec.schedule: ") and words in str(caught.value)


def test_an_unknown_time_zone_is_refused_naming_the_field() -> None:
    with pytest.raises(cronplan.ScheduleError, match=r"^spec\.timeZone: 'Mars/Olympus'"):
        Schedule.parse("@daily", time_zone="Mars/Olympus")


def test_six_fields_are_a_seconds_granular_schedule() -> None:
    every_ten = Schedule.parse("*/10 * * * * *", time_zone=None)
    assert every_ten.next_after(at("2026-11-30 10:00:03")) == at("2026-11-30 10:00:10")


# --- the planning rule ------------------------------------------------------------------------


def test_nothing_is_due_before_the_first_schedule_time() -> None:
    step = cronplan.plan(
        HOURLY, policy=Policy(), last=at("2026-11-30 09:10"), now=at("2026-11-30 09:59"), active=()
    )
    assert step == Wait(at("2026-11-30 10:00"))


def test_a_due_time_starts_and_the_next_time_is_the_wake_up() -> None:
    step = cronplan.plan(
        HOURLY,
        policy=Policy(),
        last=at("2026-11-30 09:00"),
        now=at("2026-11-30 10:00:01"),
        active=(),
    )
    assert step == Start(at("2026-11-30 10:00"), wake=at("2026-11-30 11:00"))


POLICIES = pytest.mark.parametrize(
    ("policy", "expected"),
    [
        pytest.param(
            ConcurrencyPolicy.ALLOW,
            Start(at("2026-11-30 10:00"), wake=at("2026-11-30 11:00")),
            id="allow-starts-beside-it",
        ),
        pytest.param(
            ConcurrencyPolicy.FORBID,
            Skip(at("2026-11-30 10:00"), wake=at("2026-11-30 11:00"), running=RUNNING),
            id="forbid-skips",
        ),
        pytest.param(
            ConcurrencyPolicy.REPLACE,
            Start(at("2026-11-30 10:00"), wake=at("2026-11-30 11:00"), cancel=RUNNING),
            id="replace-cancels-and-starts",
        ),
    ],
)


@POLICIES
def test_a_due_time_while_a_run_still_runs_follows_the_concurrency_policy(
    policy: ConcurrencyPolicy, expected: cronplan.Plan
) -> None:
    step = cronplan.plan(
        HOURLY,
        policy=Policy(concurrency=policy),
        last=at("2026-11-30 09:00"),
        now=at("2026-11-30 10:00:02"),
        active=RUNNING,
    )
    assert step == expected


def test_a_forbidden_time_starts_late_once_the_running_run_ended_before_the_next() -> None:
    forbid = Policy(concurrency=ConcurrencyPolicy.FORBID)
    last = at("2026-11-30 09:00")
    skipped = cronplan.plan(
        HOURLY, policy=forbid, last=last, now=at("2026-11-30 10:00"), active=RUNNING
    )
    assert isinstance(skipped, Skip)
    later = cronplan.plan(HOURLY, policy=forbid, last=last, now=at("2026-11-30 10:20"), active=())
    assert later == Start(at("2026-11-30 10:00"), wake=at("2026-11-30 11:00"))


def test_a_forbidden_time_past_the_starting_deadline_does_not_start_late() -> None:
    forbid = Policy(concurrency=ConcurrencyPolicy.FORBID, starting_deadline=300)
    step = cronplan.plan(
        HOURLY, policy=forbid, last=at("2026-11-30 09:00"), now=at("2026-11-30 10:20"), active=()
    )
    assert step == Wait(
        at("2026-11-30 11:00"), cronplan.Missed(1, at("2026-11-30 10:00"), past_deadline=True)
    )


def test_suspended_starts_nothing_and_needs_no_wake_up() -> None:
    step = cronplan.plan(
        HOURLY,
        policy=Policy(suspend=True),
        last=at("2026-11-30 06:00"),
        now=at("2026-11-30 10:30"),
        active=(),
    )
    assert step == Suspended()


def test_after_resuming_only_the_most_recent_missed_time_starts() -> None:
    step = cronplan.plan(
        HOURLY, policy=Policy(), last=at("2026-11-30 06:00"), now=at("2026-11-30 10:30"), active=()
    )
    assert step == Start(
        at("2026-11-30 10:00"),
        wake=at("2026-11-30 11:00"),
        missed=cronplan.Missed(3, at("2026-11-30 09:00"), past_deadline=False),
    )


@pytest.mark.parametrize(
    ("now", "starts"),
    [
        pytest.param("2026-11-30 10:04:59", True, id="within-the-deadline"),
        pytest.param("2026-11-30 10:05:00", True, id="at-the-deadline"),
        pytest.param("2026-11-30 10:05:01", False, id="past-the-deadline"),
    ],
)
def test_a_restart_starts_the_most_recent_missed_time_only_within_the_deadline(
    now: str, starts: bool
) -> None:
    step = cronplan.plan(
        HOURLY,
        policy=Policy(starting_deadline=300),
        last=at("2026-11-30 08:00"),
        now=at(now),
        active=(),
    )
    assert isinstance(step, Start) is starts
    assert step.missed is not None and step.missed.past_deadline is not starts  # type: ignore[union-attr]


def test_more_than_a_hundred_missed_times_are_counted_to_the_threshold_only() -> None:
    every_second = Schedule.parse("* * * * * *", time_zone=None)
    now = at("2026-11-30 12:00:00")
    step = cronplan.plan(every_second, policy=Policy(), last=now - 86_400, now=now, active=())
    assert isinstance(step, Start) and step.scheduled == now
    assert step.missed is not None and step.missed.too_many


def test_a_run_is_named_by_its_schedule_time() -> None:
    assert cronplan.run_name("nightly", at("2026-11-30 10:00")) == "nightly-1796032800"


# --- time zones -------------------------------------------------------------------------------


def times(schedule: Schedule, start: str, count: int) -> list[str]:
    """The ``count`` schedule times after ``start`` (wall clock in the schedule's zone), in
    UTC."""
    moment, found = at(start, schedule.zone.key), []
    for _ in range(count):
        moment = schedule.next_after(moment)
        found.append(utc(moment))
    return found


def test_a_daily_time_is_read_in_the_time_zone() -> None:
    six = Schedule.parse("0 6 * * *", time_zone="America/New_York")
    assert times(six, "2026-11-30 00:00", 1) == ["2026-11-30 11:00:00"]


def test_a_time_that_clocks_skip_in_spring_runs_once_right_after_the_gap() -> None:
    # Europe/Berlin, 2026-03-29: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist that day
    half_past_two = Schedule.parse("30 2 * * *", time_zone="Europe/Berlin")
    assert times(half_past_two, "2026-03-28 12:00", 3) == [
        "2026-03-29 01:00:00",  # 03:00 CEST, the first moment after the gap
        "2026-03-30 00:30:00",  # 02:30 CEST
        "2026-03-31 00:30:00",
    ]


def test_a_time_that_happens_twice_in_autumn_runs_once() -> None:
    # Europe/Berlin, 2026-10-25: 03:00 CEST falls back to 02:00 CET; 02:30 happens twice
    half_past_two = Schedule.parse("30 2 * * *", time_zone="Europe/Berlin")
    assert times(half_past_two, "2026-10-24 12:00", 2) == [
        "2026-10-25 00:30:00",  # 02:30 CEST, the first of the two
        "2026-10-26 01:30:00",  # 02:30 CET
    ]


def test_an_every_half_hour_schedule_counts_real_time_through_the_repeated_hour() -> None:
    half_hourly = Schedule.parse("*/30 * * * *", time_zone="Europe/Berlin")
    assert times(half_hourly, "2026-10-25 01:50", 4) == [
        "2026-10-25 00:00:00",  # 02:00 CEST
        "2026-10-25 00:30:00",  # 02:30 CEST
        "2026-10-25 01:00:00",  # 02:00 CET
        "2026-10-25 01:30:00",  # 02:30 CET
    ]


def test_the_plan_over_a_dst_change_starts_the_time_in_local_clock_terms() -> None:
    daily = Schedule.parse("30 2 * * *", time_zone="Europe/Berlin")
    step = cronplan.plan(
        daily,
        policy=Policy(),
        last=at("2026-03-28 02:30", "Europe/Berlin"),
        now=at("2026-03-29 03:00:05", "Europe/Berlin"),
        active=(),
    )
    assert step == Start(
        at("2026-03-29 03:00", "Europe/Berlin"), wake=at("2026-03-30 02:30", "Europe/Berlin")
    )


# --- history ----------------------------------------------------------------------------------


def test_history_limits_delete_the_oldest_finished_runs_of_each_kind() -> None:
    finished = [
        FinishedRun("r-1", 1, True),
        FinishedRun("r-2", 2, False),
        FinishedRun("r-3", 3, True),
        FinishedRun("r-4", 4, True),
        FinishedRun("r-5", 5, False),
        FinishedRun("r-6", 6, True),
    ]
    assert cronplan.prune(finished, successful_limit=2, failed_limit=1) == ("r-1", "r-2", "r-3")
    assert cronplan.prune(finished, successful_limit=0, failed_limit=0) == tuple(
        f"r-{i}" for i in range(1, 7)
    )
    assert cronplan.prune(finished, successful_limit=3, failed_limit=1) == ("r-1", "r-2")


# --- the spec ---------------------------------------------------------------------------------


def cron_spec(**fields: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedule": "*/5 * * * * *",
        "runTemplate": {"spec": {"agentRef": {"name": "calc"}, "goal": "report"}},
    }
    spec.update(fields)
    return spec


def template_meta(**metadata: dict[str, str]) -> dict[str, Any]:
    """A spec's fields whose run template has ``metadata`` (labels, annotations)."""
    spec = {"agentRef": {"name": "calc"}, "goal": "report"}
    return {"runTemplate": {"metadata": metadata, "spec": spec}}


INVALID_SPECS = pytest.mark.parametrize(
    ("fields", "reason", "message"),
    [
        pytest.param(
            {"schedule": "99 * * * *"}, "InvalidSchedule", "spec.schedule: ", id="schedule"
        ),
        pytest.param({"timeZone": "Nowhere/Land"}, "InvalidTimeZone", "spec.timeZone: ", id="zone"),
        pytest.param(
            {"runTemplate": {"spec": {"agentRef": {"name": "calc"}}}},
            "InvalidRunTemplate",
            "spec.runTemplate.spec.goal: ",
            id="no-goal",
        ),
        pytest.param(
            {"runTemplate": {"spec": {"goal": "g", "budget": {"maxCostUSD": "lots"}}}},
            "InvalidRunTemplate",
            "spec.runTemplate.spec.budget.maxCostUSD: ",
            id="bad-budget",
        ),
        pytest.param(
            {"runTemplate": {"spec": {"goal": "g"}}},
            "InvalidRunTemplate",
            "set exactly one of model",
            id="neither-model-nor-agent",
        ),
        pytest.param(
            {"concurrencyPolicy": "Sometimes"}, "InvalidSpec", "concurrencyPolicy", id="policy"
        ),
        *(
            pytest.param(
                template_meta(**{part: meta}),
                "InvalidRunTemplate",
                f"spec.runTemplate.metadata.{said}",
                id=name,
            )
            for name, part, meta, said in [
                ("label-value", "labels", {"team": "a b"}, "labels['team']: 'a b' is not a label"),
                ("label-64", "labels", {"team": "a" * 64}, "labels['team']: "),
                ("label-key", "labels", {"my team!": "x"}, "labels: key 'my team!' is not a Kub"),
                ("annotation-key", "annotations", {"bad key": "x"}, "annotations: key 'bad key'"),
                (
                    "annotations-over-256KiB",
                    "annotations",
                    {f"n{i}": "x" * 60_000 for i in range(5)},
                    "annotations: 300082 bytes with agentrun.dev/scheduled-time",
                ),
            ]
        ),
    ],
)


@INVALID_SPECS
def test_an_invalid_spec_is_not_ready_with_a_reason_naming_the_field(
    fields: dict[str, Any], reason: str, message: str
) -> None:
    with pytest.raises(cronspec.Invalid) as caught:
        cronspec.check(cron_spec(**fields))
    assert caught.value.reason == reason and message in str(caught.value)


def test_a_scheduled_run_is_owned_labelled_and_named_by_its_time() -> None:
    cron = {
        "metadata": {"name": "nightly", "namespace": "team-a", "uid": "u-1"},
        "spec": cron_spec(
            runTemplate={
                "metadata": {"labels": {"team": "a"}, "annotations": {"note": "n"}},
                "spec": {"agentRef": {"name": "calc"}, "goal": "report"},
            }
        ),
    }
    checked = cronspec.check(cron["spec"])
    run = cronspec.run_manifest(cron, checked, scheduled=at("2026-11-30 10:00"))
    meta = run["metadata"]
    assert (meta["name"], meta["namespace"]) == ("nightly-1796032800", "team-a")
    assert meta["labels"] == {"team": "a", cronspec.CRON_LABEL: "nightly"}
    assert meta["annotations"] == {
        "note": "n",
        cronspec.SCHEDULED_ANNOTATION: "2026-11-30T10:00:00Z",
        "agentrun.dev/hold": "schedule",  # until its end is in the schedule's status
    }
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "agentrun.dev/v1alpha1",
            "kind": "CronAgentRun",
            "name": "nightly",
            "uid": "u-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert run["spec"] == {"agentRef": {"name": "calc"}, "goal": "report"}


def test_allow_skips_a_time_while_the_most_runs_of_the_schedule_have_not_ended() -> None:
    """Runs queued for ever (the tenant's limits) no longer pile up one per schedule time:
    each was one more object for the API server and one more for every pass to list."""
    queued = tuple(
        ActiveRun(f"report-{i}", f"uid-{i}", at("2026-11-30 09:00") - 3600 * i)
        for i in range(cronplan.MAX_ACTIVE_RUNS)
    )
    due = {"last": at("2026-11-30 09:00"), "now": at("2026-11-30 10:00:02")}
    step = cronplan.plan(HOURLY, policy=Policy(), active=queued, **due)
    assert step == Skip(
        at("2026-11-30 10:00"), wake=at("2026-11-30 11:00"), running=queued, full=True
    )
    fewer = cronplan.plan(HOURLY, policy=Policy(), active=queued[1:], **due)
    assert fewer == Start(at("2026-11-30 10:00"), wake=at("2026-11-30 11:00"))
    replace = Policy(concurrency=ConcurrencyPolicy.REPLACE)
    replaced = cronplan.plan(HOURLY, policy=replace, active=queued, **due)
    assert isinstance(replaced, Start) and replaced.cancel == queued


def test_history_limits_keep_at_most_the_most_finished_runs_of_each_kind() -> None:
    """A limit stored before the CRD bounded it (2^31 - 1, say) kept every finished run of an
    every-second schedule: 86,400 more objects a day, each listed by every pass."""
    most = cronplan.MAX_HISTORY
    finished = [FinishedRun(f"r-{i:05d}", i, i % 2 == 0) for i in range(2 * most + 10)]
    doomed = cronplan.prune(finished, successful_limit=2**31 - 1, failed_limit=2**31 - 1)
    assert doomed == tuple(f"r-{i:05d}" for i in range(10))  # the oldest ten, 5 of each


def test_template_metadata_kubernetes_allows_is_accepted() -> None:
    labels = {"example.com/team": "", "a.b_c-D": "A.b_c", "x": "y" * 63}
    annotations = {"example.com/note": "any text at all, spaces and all", "n": "x" * 200_000}
    cronspec.check(cron_spec(**template_meta(labels=labels, annotations=annotations)))


def test_template_annotation_keys_are_checked_lower_cased_as_kubernetes_does() -> None:
    """A run's annotation ``Example.COM/Note`` is accepted by the API server (it checks the
    key lower-cased): a schedule carrying it is no invalid one; a label's prefix still is."""
    cronspec.check(cron_spec(**template_meta(annotations={"Example.COM/Note": "x"})))
    folded = {"example.com/\u212aey": "x", "\u0130d": "x"}  # Go's ToLower: 'k', 'i'
    cronspec.check(cron_spec(**template_meta(annotations=folded)))
    with pytest.raises(cronspec.Invalid, match=r"labels: key 'Example.COM/Note'"):
        cronspec.check(cron_spec(**template_meta(labels={"Example.COM/Note": "x"})))


def test_template_annotations_leave_room_for_those_a_run_is_given_later() -> None:
    """Annotations filling Kubernetes' 262,144 bytes with the schedule's own were accepted,
    and every later annotation of the run was refused (HTTP 422): its admission's
    ``agentrun.dev/admitted-uid``, ``Replace``'s ``agentrun.dev/cancel``, a reviewer's
    ``agentrun.dev/approve`` (the held call never approved), kopf's progress."""
    own = len("agentrun.dev/scheduled-time2026-01-01T00:00:00Z") + len("agentrun.dev/holdschedule")
    later = {
        runs.ADMITTED_UID_ANNOTATION: "0" * 36,
        runs.CANCEL_ANNOTATION: "true",
        runs.APPROVE_ANNOTATION: "sha256:" + "0" * 64,
        "agentrun.dev/reviewer": "system:serviceaccount:team-a:a-reviewer-of-this-run",
    }
    needed = sum(len(k) + len(v) for k, v in later.items())
    room = cronspec.RUN_ANNOTATIONS_ROOM
    assert needed + 1000 < room  # and a kopf progress record quoting an error
    fill = cronspec.ANNOTATIONS_MAX_BYTES - own - room - len("n")
    cronspec.check(cron_spec(**template_meta(annotations={"n": "x" * fill})))
    with pytest.raises(cronspec.Invalid, match=f"annotations: {fill + own + 2} bytes"):
        cronspec.check(cron_spec(**template_meta(annotations={"n": "x" * (fill + 1)})))
