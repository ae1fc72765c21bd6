"""A deleted run's effect records (its write and idempotent calls' results, in
``KV_AGENTRUN_EFFECTS``) go with its events. Kept for a week and counted against no tenant, a
tenant that ran write calls and deleted its runs (freeing its event storage) filled the
JetStream storage every tenant's events share."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from kube_support import FakeKube
from seals_support import SIGNER, VERIFIER

from agentrun import protocol
from agentrun.operator.admission.queue import QueueBoard
from agentrun.operator.platform.events import EventRecorder, Throttle
from agentrun.operator.runs import lifecycle
from agentrun.operator.runs.dispatch import DispatchDeps, Dispatcher
from agentrun.operator.runs.seals import RunSeals
from agentrun.operator.runs.writer import StatusWriter
from agentrun.protocol import RunEvent

from .test_orphans import NoCaps
from .test_seals import NAMESPACE, Ends, WireBus, admission, config


class EffectsBus(WireBus):
    """``WireBus`` noting whose effect records were purged."""

    def __init__(self) -> None:
        super().__init__()
        self.purged_effects: list[str] = []

    async def purge_effects(self, run_uid: str) -> None:
        self.purged_effects.append(run_uid)


def dispatcher_on(bus: EffectsBus) -> Dispatcher:
    api = FakeKube()
    events = EventRecorder(api, throttle=Throttle(repeat_after=0, rate=1000, burst=1000))
    seals = RunSeals(SIGNER, VERIFIER, streams=bus, api=api, events=events)
    deps = DispatchDeps(ends=Ends(), queues=QueueBoard(), events=events, seals=seals, caps=NoCaps())
    return Dispatcher(bus, StatusWriter(api), deps)  # type: ignore[arg-type]


async def test_a_finished_run_deleted_has_its_effect_records_purged() -> None:
    bus = EffectsBus()
    cfg = config("done")
    await bus.append_event(NAMESPACE, "done", admission(cfg, seal=True), expected_seq=None)
    dispatcher = dispatcher_on(bus)
    await dispatcher.purge_deleted(NAMESPACE, "done", cfg.uid)
    assert bus.purged_effects == [cfg.uid]


async def test_a_going_run_deleted_has_its_effect_records_purged() -> None:
    bus = EffectsBus()
    cfg = config("going")
    await bus.append_event(NAMESPACE, "going", admission(cfg, seal=True), expected_seq=None)
    dispatcher = dispatcher_on(bus)
    try:
        await dispatcher.forget(NAMESPACE, "going", cfg.uid)
    finally:
        await dispatcher.cancel_timers()
    assert bus.purged_effects == [cfg.uid]


async def test_a_deleted_run_whose_subject_a_newer_run_took_has_its_own_records_purged() -> None:
    """The subject holds a new AgentRun of the same name: its events stay, the deleted run's
    effect records (keyed by its own uid) go."""
    bus = EffectsBus()
    newer = config("same", uid="uid-newer")
    await bus.append_event(NAMESPACE, "same", admission(newer, seal=True), expected_seq=None)
    dispatcher = dispatcher_on(bus)
    await dispatcher.purge_deleted(NAMESPACE, "same", "uid-older")
    assert bus.purged_effects == ["uid-older"]
    assert await bus.first_event(NAMESPACE, "same") is not None


class OrphanBus(EffectsBus):
    """``EffectsBus`` listing its subjects as the events stream does (only those holding
    events), for the orphan purge."""

    async def event_subjects(self) -> list[str]:
        return sorted(subject for subject, events in self.subjects.items() if events)


async def purge_orphans_on(bus: OrphanBus, *, existing: set[tuple[str, str]]) -> list[Any]:
    """The orphan purge as a new leader runs it: the AgentRuns that exist, and the seals of
    the dispatcher (``wiring._purge_orphans``)."""
    seals = dispatcher_on(bus).seals

    async def runs() -> set[tuple[str, str]]:
        return existing

    return await lifecycle.purge_orphans(
        bus, list_runs=runs, sealed=lambda event, key: seals.fault(event, key=key) is None
    )


async def test_a_run_deleted_while_no_operator_ran_has_its_effect_records_purged() -> None:
    """The orphan purge (a subject whose AgentRun is gone) purges the records of the run its
    sealed admission names, then its events; a run that still exists keeps both."""
    bus = OrphanBus()
    gone, kept = config("gone", uid="uid-gone"), config("kept", uid="uid-kept")
    await bus.append_event(NAMESPACE, "gone", admission(gone, seal=True), expected_seq=None)
    await bus.append_event(NAMESPACE, "kept", admission(kept, seal=True), expected_seq=None)
    assert await purge_orphans_on(bus, existing={(NAMESPACE, "kept")}) == [(NAMESPACE, "gone")]
    assert bus.purged_effects == ["uid-gone"]
    assert await bus.first_event(NAMESPACE, "gone") is None
    assert await bus.first_event(NAMESPACE, "kept") is not None


@pytest.mark.parametrize("first", ["copied", "unsealed", "garbage", "turn"])
async def test_an_orphan_subject_not_begun_by_its_own_sealed_admission_purges_no_run_s_records(
    first: str,
) -> None:
    """A worker credential can append anything to a subject of a name no AgentRun has: a copy
    of a live run's sealed admission, an unsealed one naming a live run's uid, bytes that do
    not decode, or a turn event. The purge takes the subject's events, but no effect records:
    the uid such an event names may be a live run's, whose write calls' records keep them
    from being sent twice."""
    bus = OrphanBus()
    live = config("live", uid="uid-live")
    await bus.append_event(NAMESPACE, "live", admission(live, seal=True), expected_seq=None)
    if first == "copied":
        bus.forge(NAMESPACE, "fake", admission(live, seal=True).encode())
    elif first == "unsealed":
        forged = dataclasses.replace(live, name="fake")
        bus.forge(NAMESPACE, "fake", admission(forged, seal=False).encode())
    elif first == "garbage":
        bus.subjects[protocol.event_subject(NAMESPACE, "fake")] = [(99, b"{not json")]
    else:
        turn = RunEvent("turn", "uid-live", admission(live, seal=False).summary, time=2.0)
        bus.forge(NAMESPACE, "fake", turn.encode())
    assert await purge_orphans_on(bus, existing={(NAMESPACE, "live")}) == [(NAMESPACE, "fake")]
    assert bus.purged_effects == []
    assert bus.subjects[protocol.event_subject(NAMESPACE, "fake")] == []
