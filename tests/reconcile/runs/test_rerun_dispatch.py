"""``Dispatcher.prepare_rerun`` and ``project_restored`` on a real nats-server: before a run is
admitted again from turn 0 (``agentrun.dev/rerun``), its subject is emptied, it is no longer
followed, its status is forgotten, and its next end is counted again; a copy restored from a
backup shows its original's end when the original's sealed events are still there and ended
it, and nothing otherwise."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from agentrun import kernel, protocol
from agentrun.bus import Bus, BusSettings
from agentrun.operator.runs import RunKey
from agentrun.worker.effects import EffectLedger
from agentrun_dev import natsserver

from .test_dispatch import admitted, config, dispatcher


@pytest.fixture
async def bus(own_nats_server: natsserver.NatsServer) -> AsyncIterator[Bus]:
    settings = BusSettings(own_nats_server.url, auth=own_nats_server.auth())
    connected = await Bus.connect(settings, name="rerun")
    try:
        yield connected
    finally:
        await connected.close()


async def test_a_rerun_starts_from_an_empty_subject_and_its_end_counts_again(bus: Bus) -> None:
    cfg = config()
    run, writer, _, _ = dispatcher(bus)
    forgotten: list[RunKey] = []
    writer.forget = forgotten.append  # type: ignore[method-assign]
    await admitted(bus, run, cfg)
    assert await run.end(cfg.namespace, cfg.name, cfg.uid, kernel.Phase.CANCELLED, "stop")
    stop = (await bus.read_events(cfg.namespace, cfg.name))[-1]
    await run.on_event(protocol.event_subject(cfg.namespace, cfg.name), stop)
    for end in writer.ends:
        end()
    assert not run.count_end(cfg.uid, stop.state(), tenant="acme")  # counted once already

    await run.prepare_rerun(cfg.namespace, cfg.name, cfg.uid)
    assert await bus.read_events(cfg.namespace, cfg.name) == []
    assert not run.is_tracked(cfg.uid)
    assert forgotten == [RunKey(cfg.namespace, cfg.name, cfg.uid)]
    assert not await run.recover(cfg.namespace, cfg.name, cfg.uid, generation=1)

    again = await admitted(bus, run, cfg)
    assert (again.kind, again.summary.turn, again.summary.steps) == ("admitted", 0, 0)
    assert run.is_tracked(cfg.uid)
    assert await run.end(cfg.namespace, cfg.name, cfg.uid, kernel.Phase.CANCELLED, "again")
    assert run.count_end(cfg.uid, stop.state(), tenant="acme")  # the rerun's end counts


async def test_a_restored_copy_shows_the_end_its_originals_events_hold(bus: Bus) -> None:
    cfg = config()
    run, writer, _, _ = dispatcher(bus)
    await admitted(bus, run, cfg)
    assert not await run.project_restored(
        cfg.namespace, cfg.name, "uid-copy", original=cfg.uid, generation=1
    )  # not ended yet
    assert not await run.project_restored(
        cfg.namespace, cfg.name, "uid-copy", original="uid-other", generation=1
    )  # another run's events
    assert await run.end(cfg.namespace, cfg.name, cfg.uid, kernel.Phase.CANCELLED, "stop")
    stop = (await bus.read_events(cfg.namespace, cfg.name))[-1]
    writer.bodies.clear()
    assert await run.project_restored(
        cfg.namespace, cfg.name, "uid-copy", original=cfg.uid, generation=1
    )
    assert writer.bodies == [(stop.seq, "Cancelled", True)]
    assert not run.is_tracked("uid-copy")
    await run.prepare_rerun(cfg.namespace, cfg.name, cfg.uid)
    assert not await run.project_restored(
        cfg.namespace, cfg.name, "uid-copy", original=cfg.uid, generation=1
    )  # nothing left


async def test_a_rerun_runs_its_effects_again_and_leaves_other_runs_records(bus: Bus) -> None:
    """A rerun keeps the run's uid, and its model may key its calls as the first life's did (a
    call without an id, or with one reused, is keyed ``<turn>:<tool>:<ordinal>``): the first
    life's effect records are gone with its events, so the rerun's write call is sent again
    (not answered with the first life's result), and one with other arguments under that key
    is not an ``effect_unknown`` ending the rerun. Another run's records stay."""
    cfg = config()
    run, _, _, _ = dispatcher(bus)
    effects = await EffectLedger.open(bus.js)
    call = kernel.CheckedCall(id="0:write_file:0", name="write_file", arguments={"path": "a"})
    result = kernel.ToolResult(call.id, call.name, "written", False)
    for uid in (cfg.uid, "uid-other"):
        assert await effects.claim(uid, call) is None
        await effects.done(uid, call, result)
    await admitted(bus, run, cfg)
    assert await run.end(cfg.namespace, cfg.name, cfg.uid, kernel.Phase.CANCELLED, "stop")
    await run.prepare_rerun(cfg.namespace, cfg.name, cfg.uid)
    assert await effects.claim(cfg.uid, call) is None  # the rerun sends it
    other = kernel.CheckedCall(id="0:write_file:1", name="write_file", arguments={"path": "b"})
    assert await effects.claim(cfg.uid, other) is None
    assert await effects.claim("uid-other", call) == result  # not the rerun's to forget
