"""The end of a finished run's life: Job-like ttlSecondsAfterFinished and the purge of events
whose AgentRun is gone."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
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


RUNS = [RunKey("ns", name, f"uid-{name}") for name in ("a", "b")]
TELLS = st.tuples(
    st.sampled_from(["observe", "observe", "forget"]),
    st.sampled_from(range(len(RUNS))),
    st.sampled_from([None, 0, 5]),
    st.booleans(),
)
"""Telling the reaper of a run: its object as seen (its TTL; ended or not), or its deletion."""
REAPER_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("tell"), TELLS),
        st.tuples(st.just("tick"), st.sampled_from([1, 3, 10])),
        st.tuples(st.just("reap"), st.tuples(st.booleans(), st.none() | TELLS)),
    ),
    max_size=40,
)
"""Tells, the clock moving on, and passes whose deletions fail or not, with a tell arriving
while a deletion is sent (or none)."""


class Model(Deleter):
    """The runs' due times as last told, checking every deletion against them; a deletion
    fails (the API server away) while ``failing``, and ``meanwhile`` is told as it is sent."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock
        self.due: dict[RunKey, float] = {}
        self.reaper = lifecycle.Reaper(self, clock=clock, retry=2.0)
        self.failing = False
        self.meanwhile: tuple[str, int, int | None, bool] | None = None
        self.early: list[RunKey] = []
        """Runs whose deletion was sent while they were not due."""

    def tell(self, what: str, index: int, ttl: int | None, ended: bool) -> None:
        run = RUNS[index]
        if run in self.deleted:
            return  # gone: nothing more is told of it
        due = DONE_AT + ttl if what == "observe" and ttl is not None and ended else None
        self.due.pop(run, None) if due is None else self.due.__setitem__(run, due)
        if what == "forget":
            self.reaper.forget(run)
        else:
            spec = {} if ttl is None else {"ttlSecondsAfterFinished": ttl}
            self.reaper.observe(run, spec=spec, status=DONE if ended else {"phase": "Running"})

    async def delete(self, ref: Ref, *, uid: str = "") -> None:
        run = RunKey(ref.namespace, ref.name, uid)
        if self.due.get(run, float("inf")) > self.clock():  # the reaper catches what we raise
            self.early.append(run)
        if self.meanwhile is not None:
            self.meanwhile, told = None, self.meanwhile
            self.tell(*told)
        if self.failing:
            raise ApiError(503, "API server away")
        self.deleted.append(run)


@settings(max_examples=500, deadline=None)
@given(REAPER_OPS)
@example([("tell", ("observe", 0, 0, True)), ("reap", (True, ("observe", 0, None, False)))])
def test_any_order_of_tells_and_passes_deletes_each_run_once_due_and_never_before(
    ops: list[tuple[str, Any]],
) -> None:
    """Whatever the order of what the reaper is told, of the clock and of its passes (their
    deletions failing or not, its runs told of while a deletion is sent): a run is deleted only
    while due as last told, and every run still due is deleted once its time came."""
    asyncio.run(reap_in_turn(ops))


async def reap_in_turn(ops: list[tuple[str, Any]]) -> None:
    clock = Clock()
    model = Model(clock)
    for op, arg in ops:
        if op == "tell":
            model.tell(*arg)
        elif op == "tick":
            clock.now += arg
        else:
            model.failing, model.meanwhile = arg
            await model.reaper.reap_due()
    model.failing, model.meanwhile = False, None
    clock.now += 3600
    await model.reaper.reap_due()
    assert model.early == []
    assert set(model.deleted) >= set(model.due) and len(model.deleted) == len(set(model.deleted))


class Events:
    def __init__(self, subjects: list[str]) -> None:
        self.subjects = subjects
        self.purged: list[tuple[str, str]] = []

    async def event_subjects(self) -> list[str]:
        return self.subjects

    async def first_event(self, namespace: str, name: str) -> None:
        return None  # events whose admission names no run (tests/.../test_deleted_effects.py)

    async def purge_run(self, namespace: str, name: str, *, through: int = 0) -> None:
        self.purged.append((namespace, name))

    async def purge_effects(self, run_uid: str) -> None:
        raise AssertionError("no run is named")


async def test_events_of_runs_deleted_while_no_operator_ran_are_purged() -> None:
    events = Events(
        ["agentrun.event.team-a.kept", "agentrun.event.team-a.gone", "agentrun.event.team-b.kept"]
    )

    async def existing() -> set[tuple[str, str]]:
        return {("team-a", "kept"), ("team-b", "kept")}

    purged = await lifecycle.purge_orphans(events, list_runs=existing, sealed=lambda *_: True)
    assert purged == [("team-a", "gone")]
    assert events.purged == [("team-a", "gone")]


def test_the_tenant_default_applies_only_to_runs_that_set_none() -> None:
    assert lifecycle.due_time({}, DONE, default_ttl=60) == DONE_AT + 60
    assert lifecycle.due_time({"ttlSecondsAfterFinished": 5}, DONE, default_ttl=60) == DONE_AT + 5
    assert lifecycle.due_time({}, {"phase": "Running"}, default_ttl=60) is None


async def test_a_run_held_for_grading_outlives_its_ttl_and_goes_once_released() -> None:
    deleter, clock = Deleter(), Clock()
    reaper = lifecycle.Reaper(deleter, clock=clock)
    run = RunKey("ns", "suite-case-1", "1")
    clock.now = DONE_AT + 60  # its TTL of 0 (the tenant's default) passed long ago
    reaper.observe(run, spec={}, status=DONE, default_ttl=0, held=True)
    assert await reaper.reap_due() == 3600.0 and deleter.deleted == []
    reaper.observe(run, spec={}, status=DONE, default_ttl=0)  # its grade is stored
    await reaper.reap_due()
    assert deleter.deleted == [run]
