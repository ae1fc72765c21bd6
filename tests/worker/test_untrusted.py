"""A worker acts on no run config the operator did not seal for that run: given a TurnRequest
for a forged admission — unsealed, a copied seal over a changed model URL, B's sealed config
on another run's subject, a forged decision — it makes no model request, reads no Secret,
commits nothing, and counts the refusal; a sealed run on the same worker runs as usual."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from prometheus_client import REGISTRY
from seals_support import VERIFIER, sealed

from agentrun import kernel, protocol
from agentrun.bus import Bus, BusSettings
from agentrun.protocol import ModelConfig, RunConfig, RunEvent, SecretRef, TurnRequest
from agentrun.testing import MockLLM, parse_scenarios
from agentrun.tools import default_catalog
from agentrun.worker.consumer import ConsumerSettings, TurnConsumer
from agentrun.worker.model import ModelClient, RetryPolicy
from agentrun.worker.turn import TurnDeps
from agentrun_dev import natsserver

SCRIPT = """
scenarios:
  - name: answer
    turns:
      - content: "done"
        usage: {prompt_tokens: 10, completion_tokens: 2}
"""


class Secrets:
    """Records every Secret the worker asks for."""

    def __init__(self) -> None:
        self.read: list[SecretRef] = []

    async def api_key(self, ref: SecretRef) -> str:
        self.read.append(ref)
        return "tenant-b-provider-key"


@dataclasses.dataclass
class Worker:
    bus: Bus
    model: MockLLM
    attacker: MockLLM
    secrets: Secrets

    def config(self, name: str, url: str) -> RunConfig:
        return RunConfig(
            uid=uuid.uuid4().hex,
            namespace="team-b",
            name=name,
            goal="tenant B's goal",
            instructions="",
            tools=(),
            limits=kernel.Limits(),
            model=ModelConfig(
                "m", url, "scripted", kernel.Pricing(), 32000, 100, SecretRef("key", "team-b")
            ),
            deadline=time.time() + 120,
            tenant="tenant-b",
        )

    async def append(self, name: str, event: RunEvent | bytes) -> int:
        payload = event if isinstance(event, bytes) else event.encode()
        ack = await self.bus.js.publish(protocol.event_subject("team-b", name), payload)
        return int(ack.seq)


@pytest.fixture
async def worker(own_nats_server: natsserver.NatsServer) -> AsyncIterator[Worker]:
    bus = await Bus.connect(
        BusSettings(url=own_nats_server.url, auth=own_nats_server.auth()), name="test-untrusted"
    )
    secrets = Secrets()
    async with (
        MockLLM(parse_scenarios(SCRIPT)) as model,
        MockLLM(parse_scenarios(SCRIPT)) as attacker,
    ):
        deps = TurnDeps(
            model=ModelClient(RetryPolicy(max_retries=0)),
            catalog=default_catalog(),
            secrets=secrets,
        )
        consumer = TurnConsumer(bus, deps, ConsumerSettings(heartbeat=1.0), seals=VERIFIER)
        serving = asyncio.create_task(consumer.run())
        try:
            yield Worker(bus, model, attacker, secrets)
        finally:
            consumer.stop()
            await serving
            await deps.model.close()
            await bus.close()


def refused(reason: str) -> float:
    return REGISTRY.get_sample_value("agentrun_messages_refused_total", {"reason": reason}) or 0.0


async def dispatch_refused(w: Worker, cfg: RunConfig, *, seq: int, reason: str) -> None:
    """Publish turn 0 of ``cfg`` on top of ``seq`` and wait until the worker refused it."""
    before = refused(reason)
    await w.bus.publish_turn(TurnRequest(cfg.uid, "team-b", cfg.name, 0, seq), tenant="tenant-b")
    async with asyncio.timeout(30):
        while refused(reason) == before:
            await asyncio.sleep(0.05)
    assert refused(reason) == before + 1
    last = await w.bus.last_event("team-b", cfg.name)
    assert last is not None and last.seq == seq  # the worker committed nothing


def admission(cfg: RunConfig) -> RunEvent:
    state = kernel.initial_state(goal=cfg.goal)
    return RunEvent("admitted", cfg.uid, state.summary(), config=cfg, time=time.time())


def attacker_of(w: Worker, cfg: RunConfig) -> RunConfig:
    model = dataclasses.replace(cfg.model, base_url=w.attacker.base_url)
    return dataclasses.replace(cfg, model=model, tenant="unknown")


async def test_an_unsealed_admission_makes_no_call_and_reads_no_secret(worker: Worker) -> None:
    cfg = attacker_of(worker, worker.config("forged", worker.model.base_url))
    seq = await worker.append(cfg.name, admission(cfg))
    await dispatch_refused(worker, cfg, seq=seq, reason="unsigned")
    assert len(worker.attacker.state.requests) == 0 and worker.secrets.read == []


async def test_a_copied_seal_over_another_model_url_is_refused(worker: Worker) -> None:
    real = worker.config("b", worker.model.base_url)
    forged = dataclasses.replace(
        admission(attacker_of(worker, real)), seal=sealed(admission(real)).seal
    )
    seq = await worker.append(real.name, forged)
    await dispatch_refused(worker, real, seq=seq, reason="bad_signature")
    assert len(worker.attacker.state.requests) == 0 and worker.secrets.read == []


async def test_another_runs_sealed_config_on_this_subject_is_refused(worker: Worker) -> None:
    """B's sealed admission copied to a subject of the attacker's choosing."""
    real = worker.config("b2", worker.model.base_url)
    seq = await worker.append("copy", sealed(admission(real)))
    copy = dataclasses.replace(real, name="copy")
    await dispatch_refused(worker, copy, seq=seq, reason="wrong_run")
    assert len(worker.model.state.requests) == 0 and worker.secrets.read == []


async def test_a_forged_decision_after_a_sealed_admission_is_refused(worker: Worker) -> None:
    cfg = worker.config("held", worker.model.base_url)
    await worker.append(cfg.name, sealed(admission(cfg)))
    state = kernel.initial_state(goal=cfg.goal)
    forged = RunEvent(
        "approval", cfg.uid, state.summary(), approval=protocol.Approval("0" * 64, True)
    )
    seq = await worker.append(cfg.name, forged)
    await dispatch_refused(worker, cfg, seq=seq, reason="unsigned")
    assert len(worker.model.state.requests) == 0 and worker.secrets.read == []


async def test_a_sealed_run_on_the_same_worker_runs(worker: Worker) -> None:
    cfg = worker.config("sealed", worker.model.base_url)
    seq = await worker.append(cfg.name, sealed(admission(cfg)))
    await worker.bus.publish_turn(TurnRequest(cfg.uid, "team-b", cfg.name, 0, seq), tenant="t")
    async with asyncio.timeout(30):
        while (last := await worker.bus.last_event("team-b", cfg.name)) is None or last.seq == seq:
            await asyncio.sleep(0.05)
    assert last.kind == "turn" and last.phase is kernel.Phase.COMPLETED
    assert len(worker.model.state.requests) == 1
    assert worker.secrets.read == [SecretRef("key", "team-b")]
