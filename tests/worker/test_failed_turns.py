"""A turn that raises: a deterministic failure ends the run ``checkpoint_failed`` on its second
delivery (each delivery would call the model again and fail the same way); a transient one
makes the turn wait, however many deliveries it takes. A real consumer's handler on a real
nats-server (JetStream events); the failure is raised where the turn reads the model's API key.
"""

from __future__ import annotations

import io
import logging
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from seals_support import VERIFIER, sealed

from agentrun import display, kernel, process, protocol
from agentrun.bus import Bus, BusSettings
from agentrun.protocol import ModelConfig, RunConfig, RunEvent, SecretRef, TurnRequest
from agentrun.tools import Calculate, Catalog
from agentrun.worker.consumer import ConsumerSettings, TurnConsumer
from agentrun.worker.model import ModelClient, RetryPolicy
from agentrun.worker.secrets import SecretUnavailable
from agentrun.worker.turn import TurnDeps
from agentrun_dev import natsserver


class Failing:
    """A Secret source that raises ``err`` on every read; counts the reads."""

    def __init__(self, err: Exception) -> None:
        self.err = err
        self.reads = 0

    async def api_key(self, ref: SecretRef) -> str:
        self.reads += 1
        raise self.err


class Delivery:
    """One delivery of a TurnRequest (the ``num_delivered``-th), as the handler sees it."""

    def __init__(self, request: TurnRequest, *, num_delivered: int) -> None:
        self.data = protocol.encode_turn_request(request)
        self.subject = protocol.turn_subject("acme")
        self.headers: dict[str, str] | None = None
        self.metadata = _Metadata(num_delivered)
        self.outcome: list[str] = []

    async def ack(self) -> None:
        self.outcome.append("ack")

    async def nak(self, delay: float | None = None) -> None:
        self.outcome.append(f"nak {delay}")

    async def term(self) -> None:
        self.outcome.append("term")

    async def in_progress(self) -> None:
        pass


class _Metadata:
    def __init__(self, num_delivered: int) -> None:
        self.num_delivered = num_delivered
        self.timestamp = None


@pytest.fixture
async def bus(own_nats_server: natsserver.NatsServer) -> AsyncIterator[Bus]:
    settings = BusSettings(own_nats_server.url, auth=own_nats_server.auth())
    connected = await Bus.connect(settings, name="failed-turns")
    try:
        yield connected
    finally:
        await connected.close()


async def admit(bus: Bus) -> TurnRequest:
    """A fresh run's admitted event (its model's key in a Secret); its turn 0's request."""
    uid = uuid.uuid4().hex
    config = RunConfig(
        uid=uid,
        namespace="ns",
        name=f"failing-{uid[:8]}",
        goal="what is 6*7?",
        instructions="",
        tools=("calculate",),
        limits=kernel.Limits(),
        model=ModelConfig(
            "mock",
            "http://127.0.0.1:9/v1",  # never called: the turn fails before
            "scripted",
            kernel.Pricing(),
            32000,
            100,
            SecretRef("key", "platform"),
        ),
        deadline=time.time() + 60,
    )
    state = kernel.initial_state(goal=config.goal)
    event = sealed(RunEvent("admitted", uid, state.summary(), config=config, time=time.time()))
    seq = await bus.append_event("ns", config.name, event, expected_seq=0)
    return TurnRequest(uid, "ns", config.name, 0, seq)


def worker(bus: Bus, secrets: Failing) -> TurnConsumer:
    deps = TurnDeps(
        model=ModelClient(RetryPolicy(max_retries=0)),
        catalog=Catalog([Calculate()]),
        secrets=secrets,
    )
    return TurnConsumer(bus, deps, ConsumerSettings(heartbeat=30.0), seals=VERIFIER)


async def deliver(consumer: TurnConsumer, request: TurnRequest, *, num_delivered: int) -> list[str]:
    delivery = Delivery(request, num_delivered=num_delivered)
    await consumer._handle(delivery)  # type: ignore[arg-type]
    return delivery.outcome


async def test_a_deterministic_failure_ends_the_run_checkpoint_failed_on_its_second_delivery(
    bus: Bus,
) -> None:
    secrets = Failing(RuntimeError("a bug"))
    consumer = worker(bus, secrets)
    request = await admit(bus)
    assert await deliver(consumer, request, num_delivered=1) == ["nak 1.0"]
    first = await bus.last_event("ns", request.name)
    assert first is not None and (first.kind, first.seq) == ("admitted", request.expected_seq)
    assert await deliver(consumer, request, num_delivered=2) == ["ack"]
    last = await bus.last_event("ns", request.name)
    assert last is not None and last.kind == "stop"
    assert last.phase is kernel.Phase.CHECKPOINT_FAILED
    assert last.summary.message == "turn 0 could not be committed: RuntimeError: a bug"
    assert secrets.reads == 2


async def test_a_transient_failure_makes_the_turn_wait_on_every_delivery(bus: Bus) -> None:
    secrets = Failing(SecretUnavailable("the API server answered HTTP 503"))
    consumer = worker(bus, secrets)
    request = await admit(bus)
    for delivered in (1, 2, 3, 10):
        assert await deliver(consumer, request, num_delivered=delivered) == ["nak 5.0"]
    last = await bus.last_event("ns", request.name)
    assert last is not None and (last.kind, last.phase) == ("admitted", kernel.Phase.RUNNING)
    assert secrets.reads == 4


class BehindBus(Bus):
    """A ``Bus`` whose first ``behind`` reads of a run's last event answer none, as a stream
    leader just elected may before it applied what was acknowledged (NATS ADR-53)."""

    behind = 0

    async def last_event(
        self, namespace: str, name: str, *, any_replica: bool = False
    ) -> RunEvent | None:
        if self.behind > 0:
            self.behind -= 1
            return None
        return await super().last_event(namespace, name, any_replica=any_replica)


async def test_a_failure_read_behind_the_request_is_read_again_and_still_ends_the_run(
    own_nats_server: natsserver.NatsServer,
) -> None:
    settings = BusSettings(own_nats_server.url, auth=own_nats_server.auth())
    bus = await BehindBus.connect(settings, name="failed-turns-behind")
    try:
        consumer = worker(bus, Failing(RuntimeError("a bug")))
        request = await admit(bus)
        assert await deliver(consumer, request, num_delivered=1) == ["nak 1.0"]
        bus.behind = 3
        assert await deliver(consumer, request, num_delivered=2) == ["ack"]
        assert bus.behind == 0
        last = await bus.last_event("ns", request.name)
        assert last is not None and last.phase is kernel.Phase.CHECKPOINT_FAILED
    finally:
        await bus.close()


async def test_a_failure_quoting_a_secret_the_worker_read_writes_it_redacted(
    bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever error class carries it, a secret the worker read (a model key, a tool
    server's header) that an error quotes reaches neither the run's status (nor so its
    Events) nor the worker's log."""
    key = "sk-tenant-b-0123456789abcdef"
    display.KNOWN.add(key)
    consumer = worker(bus, Failing(RuntimeError(f"gateway refused 'Bearer {key}'")))
    request = await admit(bus)
    handler = logging.StreamHandler(io.StringIO())
    handler.addFilter(process.RedactingFilter())
    logging.getLogger().addHandler(handler)
    try:
        for delivered in (1, 2):
            await deliver(consumer, request, num_delivered=delivered)
    finally:
        logging.getLogger().removeHandler(handler)
    last = await bus.last_event("ns", request.name)
    assert last is not None and last.phase is kernel.Phase.CHECKPOINT_FAILED
    assert last.summary.message == (
        "turn 0 could not be committed: RuntimeError: gateway refused 'Bearer [redacted]'"
    )
    written = handler.stream.getvalue()  # type: ignore[attr-defined]
    assert "gateway refused 'Bearer [redacted]'" in written and "Traceback" in written
    assert key not in written


def test_short_values_are_not_taken_for_secrets() -> None:
    known = display.Redactor()
    known.add("abc")
    known.add("s3cr3t-value")
    known.add("s3cr3t-value-longer")
    assert known.redact("abc s3cr3t-value-longer s3cr3t-value") == "abc [redacted] [redacted]"
    known.add("Bearer tok-0123456789")  # a header value: its token is echoed alone too
    assert known.redact("invalid credentials tok-0123456789") == "invalid credentials [redacted]"
