"""A deleted run's effect records (its write and idempotent calls' results, in
``KV_AGENTRUN_EFFECTS``) go with its events. Kept for a week and counted against no tenant, a
tenant that ran write calls and deleted its runs (freeing its event storage) filled the
JetStream storage every tenant's events share."""

from __future__ import annotations

from kube_support import FakeKube
from seals_support import SIGNER, VERIFIER

from agentrun.operator.admission.queue import QueueBoard
from agentrun.operator.platform.events import EventRecorder, Throttle
from agentrun.operator.runs.dispatch import DispatchDeps, Dispatcher
from agentrun.operator.runs.seals import RunSeals
from agentrun.operator.runs.writer import StatusWriter

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
