"""``status.budget``, the caps a run was admitted with, on a real nats-server: every status
projected from the run's events carries them, as the ``admitted`` event's sealed config holds
them (its tenant's defaults and caps applied at admission), so the status that shows it
Running shows them with no write of their own, and a restarted operator, the run's end and a
copy restored from a backup show the same."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Mapping
from decimal import Decimal
from typing import Any

import pytest

from agentrun import kernel, protocol
from agentrun.bus import Bus, BusSettings
from agentrun.operator.runs import RunKey
from agentrun.protocol import RunConfig
from agentrun_dev import natsserver

from .test_dispatch import Submitted, config, dispatcher

CAPS = {
    "maxSteps": 20,
    "maxToolCalls": 7,
    "maxTokens": 1000,
    "maxCostUSD": "0.50",
    "timeout": "5m0s",
}
"""``status.budget`` of ``capped()``'s run, written out."""


class Kept(Submitted):
    """A status writer keeping every body it is given, by run uid."""

    def __init__(self) -> None:
        super().__init__()
        self.full: dict[str, list[dict[str, Any]]] = {}

    def submit(self, run: RunKey, body: Mapping[str, Any], **kwargs: Any) -> None:
        self.full.setdefault(run.uid, []).append(dict(body))
        super().submit(run, body, **kwargs)


@pytest.fixture
async def bus(own_nats_server: natsserver.NatsServer) -> AsyncIterator[Bus]:
    settings = BusSettings(own_nats_server.url, auth=own_nats_server.auth())
    connected = await Bus.connect(settings, name="budget")
    try:
        yield connected
    finally:
        await connected.close()


def capped(start: float) -> RunConfig:
    """A run admitted at ``start`` with 20 steps, 7 tool calls, 1000 tokens, 0.50 USD and a
    300 s deadline."""
    made = config(max_steps=20, max_tool_calls=7, max_tokens=1000, max_cost_usd=Decimal("0.50"))
    return dataclasses.replace(made, deadline=start + 300)


async def started(bus: Bus, cfg: RunConfig, *, start: float) -> tuple[Any, Kept]:
    """``cfg`` admitted at ``start`` and its ``admitted`` event seen by a dispatcher."""
    writer = Kept()
    run, _, _, _ = dispatcher(bus, writer)
    await run.start_run(cfg, start_time=start, generation=1)
    (event,) = await bus.read_events(cfg.namespace, cfg.name)
    await run.on_event(protocol.event_subject(cfg.namespace, cfg.name), event)
    return run, writer


async def test_the_status_that_shows_a_run_admitted_shows_the_caps_it_was_admitted_with(
    bus: Bus,
) -> None:
    start = time.time()
    cfg = capped(start)
    run, writer = await started(bus, cfg, start=start)
    (first,) = writer.full[cfg.uid]  # one write: the admission's own
    assert first["phase"] == "Running" and first["budget"] == CAPS
    await run.cancel_timers()


async def test_a_run_without_token_or_cost_caps_shows_none(bus: Bus) -> None:
    start = time.time()
    cfg = dataclasses.replace(config(), deadline=start + 90.5)
    run, writer = await started(bus, cfg, start=start)
    (first,) = writer.full[cfg.uid]
    assert first["budget"] == {"maxSteps": 20, "maxToolCalls": 50, "timeout": "1m30.5s"}
    await run.cancel_timers()


async def test_a_restarted_operator_its_end_and_a_restored_copy_show_the_same_caps(
    bus: Bus,
) -> None:
    start = time.time() - 30  # admitted a while ago: its deadline is still 300 s from then
    cfg = capped(start)
    first, _ = await started(bus, cfg, start=start)
    await first.cancel_timers()

    writer = Kept()
    restarted, _, _, _ = dispatcher(bus, writer)
    assert await restarted.recover(cfg.namespace, cfg.name, cfg.uid, generation=1)
    assert await restarted.end(cfg.namespace, cfg.name, cfg.uid, kernel.Phase.CANCELLED, "stop")
    stop = (await bus.read_events(cfg.namespace, cfg.name))[-1]
    await restarted.on_event(protocol.event_subject(cfg.namespace, cfg.name), stop)
    bodies = writer.full[cfg.uid]
    assert [b["phase"] for b in bodies] == ["Running", "Cancelled"]
    assert [b["budget"] for b in bodies] == [CAPS, CAPS]

    copy = "restored-copy-uid"
    assert await restarted.project_restored(
        cfg.namespace, cfg.name, copy, original=cfg.uid, generation=1
    )
    (restored,) = writer.full[copy]
    assert restored["terminalReason"] == "cancelled" and restored["budget"] == CAPS
    await restarted.cancel_timers()
