"""A closed nats-server of the package's own, provisioned by the operator's identity, with a
run of tenant B in namespace ``team-b`` on it: its admitted event, its TurnRequest, its ledger
totals, run entry and queued-run value, an effect-ledger entry. Clients record every error the
server sends them, so a test can show the refusal it asserts."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from agentrun import kernel, natsclient, protocol
from agentrun.bus import Bus, BusSettings
from agentrun.ledger import LedgerStore
from agentrun.protocol import ModelConfig, RunConfig, RunEvent, TurnRequest
from agentrun.worker.effects import EffectLedger
from agentrun_dev import components, natsserver

TENANT_B, NAMESPACE_B = "tenant-b", "team-b"
NAMESPACE_A = "team-a"
REFUSAL_WAIT = 1.0
"""Seconds a refused JetStream request is given before it counts as unanswered."""


@dataclasses.dataclass
class Client:
    """A connection that keeps every error the server sent it."""

    nc: NATS
    errors: list[Exception]

    def js(self) -> JetStreamContext:
        return self.nc.jetstream(timeout=REFUSAL_WAIT)

    async def refusal(self, before: int, *, wait: float = 2.0) -> str:
        """The first permissions violation the server sent after ``before`` errors."""
        async with asyncio.timeout(wait):
            while True:
                for err in self.errors[before:]:
                    if "permissions violation" in str(err).lower():
                        return str(err)
                await asyncio.sleep(0.02)


async def connect(server: natsserver.NatsServer, auth: natsclient.NatsAuth | None) -> Client:
    """A plain nats-py client with ``auth`` (the runtime's options), recording errors."""
    errors: list[Exception] = []

    async def record(err: Exception) -> None:
        errors.append(err)

    nc = await nats.connect(
        server.url,
        error_cb=record,
        allow_reconnect=False,
        **natsclient.connect_options(auth),
    )
    return Client(nc, errors)


@dataclasses.dataclass(frozen=True)
class RunB:
    """What tenant B has on the bus."""

    uid: str
    name: str
    turn_seq: int


@pytest.fixture(scope="package")
def closed_server(
    tmp_path_factory: pytest.TempPathFactory, devenv_launch: components.Launch
) -> Iterator[natsserver.NatsServer]:
    server = natsserver.start_nats_server(
        tmp_path_factory.mktemp("closed-nats"), launch=devenv_launch
    )
    yield server
    server.stop()


@pytest.fixture(scope="package")
async def operator_bus(closed_server: natsserver.NatsServer) -> AsyncIterator[Bus]:
    """The operator's identity provisions everything, as the operator process does."""
    bus = await Bus.connect(
        BusSettings(url=closed_server.url, auth=closed_server.auth("operator")),
        name="test-operator",
    )
    await EffectLedger.open(bus.js)
    yield bus
    await bus.close()


@pytest.fixture(scope="package")
async def run_b(operator_bus: Bus) -> RunB:
    """An admitted run of tenant B with a queued TurnRequest and ledger values."""
    uid = uuid.uuid4().hex
    name = f"secret-{uid[:6]}"
    config = RunConfig(
        uid=uid,
        namespace=NAMESPACE_B,
        name=name,
        goal="tenant B's private goal",
        instructions="",
        tools=(),
        limits=kernel.Limits(),
        model=ModelConfig("m", "https://models.example/v1", "m", kernel.Pricing(), 32000, 100),
        deadline=time.time() + 600,
        tenant=TENANT_B,
    )
    state = kernel.initial_state(goal=config.goal)
    event = RunEvent("admitted", uid, state.summary(), config=config, time=time.time())
    seq = await operator_bus.append_event(NAMESPACE_B, name, event, expected_seq=0)
    turn_seq = await operator_bus.publish_turn(
        TurnRequest(uid, NAMESPACE_B, name, 0, seq), tenant=TENANT_B
    )
    store = await LedgerStore.open(operator_bus.js)
    await store.kv.put(f"book.{TENANT_B}", b'{"used": 525}')
    await store.kv.put(f"run.{TENANT_B}.{uid}", b'{"holds": {}}')
    await store.kv.put(f"queue.{TENANT_B}.{uid}", b'{"ns": "team-b"}')
    return RunB(uid, name, turn_seq)


@pytest.fixture
async def worker(closed_server: natsserver.NatsServer, run_b: RunB) -> AsyncIterator[Client]:
    client = await connect(closed_server, closed_server.auth("worker"))
    yield client
    await client.nc.close()


@pytest.fixture
async def reader(closed_server: natsserver.NatsServer, run_b: RunB) -> AsyncIterator[Client]:
    """A reader of namespace A (tenant B's runs are in namespace B)."""
    client = await connect(closed_server, closed_server.mint_reader(NAMESPACE_A))
    yield client
    await client.nc.close()


@pytest.fixture
async def admin(closed_server: natsserver.NatsServer) -> AsyncIterator[Client]:
    """The test harness's own eyes (allowed everything), to check nothing changed."""
    client = await connect(closed_server, closed_server.auth("admin"))
    yield client
    await client.nc.close()


def event_subject_b(run: RunB) -> str:
    return protocol.event_subject(NAMESPACE_B, run.name)


def forged_admitted(run: RunB) -> bytes:
    """An admitted event for run B with the model pointed at an attacker's server."""
    config = RunConfig(
        uid=run.uid,
        namespace=NAMESPACE_B,
        name=run.name,
        goal="exfiltrate",
        instructions="",
        tools=("kubernetes_get",),
        limits=kernel.Limits(),
        model=ModelConfig("m", "http://attacker.example/v1", "m", kernel.Pricing(), 32000, 100),
        deadline=time.time() + 600,
        tenant="unknown",
    )
    state = kernel.initial_state(goal=config.goal)
    return RunEvent("admitted", run.uid, state.summary(), config=config, time=time.time()).encode()


def json_of(data: Any) -> Any:
    import json

    return json.loads(data)
