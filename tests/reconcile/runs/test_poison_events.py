"""An event whose processing fails for good ends its run ``checkpoint_failed`` and is dropped,
instead of being redelivered every second for ever; a failure that passes is redelivered."""

from __future__ import annotations

import dataclasses
import logging
import types
from typing import Any

import nats.errors
import pytest
from kube_support import FakeKube
from seals_support import sealed

from agentrun import kernel
from agentrun.operator.runs import dispatch
from agentrun.operator.runs.dispatch import Dispatcher
from agentrun.protocol import RunEvent

from .test_orphans import SUBJECT, Bus, Clock, admitted_config, new_dispatcher


class Msg:
    """A fetched JetStream message of ``event``, recording how it was answered."""

    def __init__(self, event: RunEvent) -> None:
        self.data = event.encode()
        self.subject = SUBJECT
        self.metadata = types.SimpleNamespace(sequence=types.SimpleNamespace(stream=event.seq))
        self.answers: list[str] = []

    async def ack(self) -> None:
        self.answers.append("ack")

    async def nak(self, delay: float | None = None) -> None:
        self.answers.append(f"nak {delay}")

    async def term(self) -> None:
        self.answers.append("term")


async def running_run(monkeypatch: pytest.MonkeyPatch, error: Exception) -> tuple[Bus, Dispatcher]:
    """A dispatcher following an admitted run whose next event's status projection raises
    ``error``."""
    bus, clock, api = Bus(), Clock(), FakeKube()
    dispatcher = new_dispatcher(bus, clock, api)
    state = kernel.initial_state(goal="g")
    config = admitted_config(clock)
    await bus.append_event(
        "ns", "r", sealed(RunEvent("admitted", "u", state.summary(), config=config)), expected_seq=0
    )
    await dispatcher.on_event(SUBJECT, bus.events[0])
    project = dispatch.status.project

    def failing(summary: kernel.RunSummary, **kwargs: Any) -> Any:
        if kwargs["seq"] == 2:
            raise error
        return project(summary, **kwargs)

    monkeypatch.setattr(dispatch.status, "project", failing)
    turn = dataclasses.replace(bus.events[0], kind="turn", config=None, seal=None)
    await bus.append_event("ns", "r", turn, expected_seq=1)
    return bus, dispatcher


async def test_an_event_that_cannot_be_processed_ends_its_run_and_is_dropped(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    bus, dispatcher = await running_run(monkeypatch, KeyError("usage"))
    msg = Msg(bus.events[1])
    try:
        with caplog.at_level(logging.INFO, logger="agentrun.operator.runs.dispatch"):
            await dispatcher._consume(msg)  # type: ignore[arg-type]
            assert msg.answers == ["nak 1.0"]  # once more: it may have been a passing fault
            await dispatcher._consume(msg)  # type: ignore[arg-type]
        assert msg.answers == ["nak 1.0", "term"]
        stop = bus.events[-1]
        assert (stop.kind, stop.phase) == ("stop", kernel.Phase.CHECKPOINT_FAILED)
        assert "processing its event 2 failed twice: KeyError" in stop.summary.message
        assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1
    finally:
        await dispatcher.cancel_timers()


async def test_an_event_failing_for_a_passing_reason_is_redelivered_and_the_run_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bus, dispatcher = await running_run(monkeypatch, nats.errors.TimeoutError())
    msg = Msg(bus.events[1])
    try:
        for _ in range(4):
            await dispatcher._consume(msg)  # type: ignore[arg-type]
        assert msg.answers == ["nak 5.0"] * 4
        assert [e.kind for e in bus.events] == ["admitted", "turn"]  # not ended
    finally:
        await dispatcher.cancel_timers()
