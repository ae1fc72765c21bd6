"""The end of a finished run's life: Job-like ttlSecondsAfterFinished and the purge of events
whose AgentRun is gone."""

from __future__ import annotations

import pytest
from kube_support import FakeKube

from agentrun.operator.platform.kubeapi import ApiError, Ref
from agentrun.operator.runs import RunKey, lifecycle

DONE = {"terminalReason": "completed", "completionTime": "2026-11-30T12:00:00Z"}
DONE_AT = 1796040000.0  # 2026-11-30T12:00:00Z


@pytest.mark.parametrize(
    ("spec", "status", "due"),
    [
        ({}, DONE, None),
        ({"ttlSecondsAfterFinished": 30}, {"phase": "Running"}, None),
        ({"ttlSecondsAfterFinished": 30}, DONE, DONE_AT + 30),
        ({"ttlSecondsAfterFinished": 0}, DONE, DONE_AT),
    ],
    ids=["no-ttl-kept", "running-not-due", "due-after-ttl", "zero-at-once"],
)
def test_due_time_follows_the_job_field(
    spec: dict[str, int], status: dict[str, str], due: float | None
) -> None:
    assert lifecycle.due_time(spec, status) == due


class Deleter(FakeKube):
    """The API server port, keeping the runs it deleted (with the uid precondition given)."""

    def __init__(self) -> None:
        super().__init__()
        self.deleted: list[RunKey] = []

    async def delete(self, ref: Ref, *, uid: str = "") -> None:
        await super().delete(ref, uid=uid)
        self.deleted.append(RunKey(ref.namespace, ref.name, uid))


class Clock:
    now = DONE_AT

    def __call__(self) -> float:
        return self.now


async def test_the_reaper_deletes_each_run_when_due_and_only_then() -> None:
    deleter, clock = Deleter(), Clock()
    reaper = lifecycle.Reaper(deleter, clock=clock)
    soon, later, kept = RunKey("ns", "a", "1"), RunKey("ns", "b", "2"), RunKey("ns", "c", "3")
    reaper.observe(soon, spec={"ttlSecondsAfterFinished": 5}, status=DONE)
    reaper.observe(later, spec={"ttlSecondsAfterFinished": 60}, status=DONE)
    reaper.observe(kept, spec={}, status=DONE)
    assert await reaper.reap_due() == 5
    clock.now += 5
    assert await reaper.reap_due() == 55
    assert deleter.deleted == [soon]
    clock.now += 55
    await reaper.reap_due()
    assert deleter.deleted == [soon, later]


async def test_a_run_deleted_before_it_was_due_is_not_deleted_again() -> None:
    deleter, clock = Deleter(), Clock()
    reaper = lifecycle.Reaper(deleter, clock=clock)
    run = RunKey("ns", "a", "1")
    reaper.observe(run, spec={"ttlSecondsAfterFinished": 5}, status=DONE)
    reaper.forget(run)
    clock.now += 10
    await reaper.reap_due()
    assert deleter.deleted == []


async def test_a_failed_deletion_is_retried() -> None:
    deleter, clock = Deleter(), Clock()
    deleter.fail("delete", 503, "API server away")
    reaper = lifecycle.Reaper(deleter, clock=clock, retry=2.0)
    run = RunKey("ns", "a", "1")
    reaper.observe(run, spec={"ttlSecondsAfterFinished": 0}, status=DONE)
    assert await reaper.reap_due() == 2.0
    clock.now += 2
    await reaper.reap_due()
    assert deleter.deleted == [run]


class Rerun(Deleter):
    """A deletion that fails (the API server away) while, meanwhile, the run was rerun: its
    status no longer shows an end (``observe``d as running), or given a later due time."""

    def __init__(self, meanwhile: object) -> None:
        super().__init__()
        self.meanwhile = meanwhile

    async def delete(self, ref: Ref, *, uid: str = "") -> None:
        if self.meanwhile is None:  # the API server is back
            await super().delete(ref, uid=uid)
            return
        assert callable(self.meanwhile)
        self.meanwhile, meanwhile = None, self.meanwhile
        meanwhile()
        raise ApiError(503, "API server away")


@pytest.mark.parametrize(
    ("status", "ttl", "due"),
    [({"phase": "Running"}, 0, None), (DONE, 3600, DONE_AT + 3600)],
    ids=["rerun", "later-ttl"],
)
async def test_a_due_time_changed_while_a_deletion_failed_is_the_one_kept(
    status: dict[str, str], ttl: int, due: float | None
) -> None:
    clock, run = Clock(), RunKey("ns", "a", "1")
    spec = {"ttlSecondsAfterFinished": ttl}
    deleter = Rerun(lambda: reaper.observe(run, spec=spec, status=status))
    reaper = lifecycle.Reaper(deleter, clock=clock, retry=2.0)
    reaper.observe(run, spec={"ttlSecondsAfterFinished": 0}, status=DONE)
    await reaper.reap_due()  # fails, the run rerun (or its due time moved) meanwhile
    clock.now += 10  # past the failed deletion's retry
    await reaper.reap_due()
    assert deleter.deleted == []
    assert reaper.due.get(run) == due


class Events:
    def __init__(self, subjects: list[str]) -> None:
        self.subjects = subjects
        self.purged: list[tuple[str, str]] = []

    async def event_subjects(self) -> list[str]:
        return self.subjects

    async def purge_run(self, namespace: str, name: str, *, through: int = 0) -> None:
        self.purged.append((namespace, name))


async def test_events_of_runs_deleted_while_no_operator_ran_are_purged() -> None:
    events = Events(
        ["agentrun.event.team-a.kept", "agentrun.event.team-a.gone", "agentrun.event.team-b.kept"]
    )

    async def existing() -> set[tuple[str, str]]:
        return {("team-a", "kept"), ("team-b", "kept")}

    assert await lifecycle.purge_orphans(events, list_runs=existing) == [("team-a", "gone")]
    assert events.purged == [("team-a", "gone")]


def test_the_tenant_default_applies_only_to_runs_that_set_none() -> None:
    assert lifecycle.due_time({}, DONE, default_ttl=60) == DONE_AT + 60
    assert lifecycle.due_time({"ttlSecondsAfterFinished": 5}, DONE, default_ttl=60) == DONE_AT + 5
    assert lifecycle.due_time({}, {"phase": "Running"}, default_ttl=60) is None
