"""The operator follows a run only through the config it sealed for that run's subject: a
forged admission (on a new subject, or appended to a running run), a forged decision and an
unsealed run the API server does not vouch for are refused — the run ends
``checkpoint_failed``, a ``MessageRefused`` Warning Event tells it, the metric counts it — and a
run admitted before seals existed is re-sealed and goes on."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kube_support import FakeKube
from prometheus_client import REGISTRY
from seals_support import SIGNER, VERIFIER, sealed

from agentrun import kernel, protocol
from agentrun.bus import CommitConflict
from agentrun.operator.admission.queue import QueueBoard
from agentrun.operator.platform.events import EventRecorder, Throttle
from agentrun.operator.runs import RunKey
from agentrun.operator.runs.dispatch import DispatchDeps, Dispatcher
from agentrun.operator.runs.seals import RunSeals
from agentrun.operator.runs.writer import StatusWriter
from agentrun.protocol import ModelConfig, RunConfig, RunEvent, SecretRef, TurnRequest

from .test_orphans import NoCaps

NAMESPACE = "team-b"
LIMITS = kernel.Limits(context_window=32000, max_output_tokens=100)
"""The limits a config has once read back (its model's window and output cap)."""


class WireBus:
    """Run subjects in memory, every event stored as its bytes and read back decoded (as a
    reader on NATS gets it)."""

    def __init__(self) -> None:
        self.subjects: dict[str, list[tuple[int, bytes]]] = {}
        self.seq = 0
        self.published: list[TurnRequest] = []
        self.cancelled: list[str] = []

    def _events(self, namespace: str, name: str) -> list[tuple[int, bytes]]:
        return self.subjects.setdefault(protocol.event_subject(namespace, name), [])

    async def append_event(
        self, namespace: str, name: str, event: RunEvent, *, expected_seq: int | None
    ) -> int:
        events = self._events(namespace, name)
        last = events[-1][0] if events else 0
        if expected_seq is not None and expected_seq != last:
            raise CommitConflict(f"expected {expected_seq}, last is {last}")
        self.seq += 1
        events.append((self.seq, event.encode()))
        return self.seq

    def forge(self, namespace: str, name: str, payload: bytes) -> RunEvent:
        """Append raw bytes, as an attacker with a worker's credentials can."""
        self.seq += 1
        self._events(namespace, name).append((self.seq, payload))
        return RunEvent.decode(payload, seq=self.seq)

    async def read_events(self, namespace: str, name: str, *, after_seq: int = 0) -> list[RunEvent]:
        return [
            RunEvent.decode(data, seq=seq)
            for seq, data in self._events(namespace, name)
            if seq > after_seq
        ]

    async def first_event(self, namespace: str, name: str) -> RunEvent | None:
        events = await self.read_events(namespace, name)
        return events[0] if events else None

    async def last_event(self, namespace: str, name: str) -> RunEvent | None:
        events = await self.read_events(namespace, name)
        return events[-1] if events else None

    async def purge_run(self, namespace: str, name: str, *, through: int = 0) -> None:
        events = self._events(namespace, name)
        events[:] = [e for e in events if through and e[0] > through]

    async def publish_turn(self, request: TurnRequest, *, tenant: str, attempt: int = 0) -> int:
        self.published.append(request)
        return len(self.published)

    async def purge_effects(self, run_uid: str) -> None:
        pass

    async def broadcast_cancel(self, run_uid: str) -> None:
        self.cancelled.append(run_uid)


class Ends:
    def __init__(self) -> None:
        self.settled: list[str] = []

    async def settle_ended_run(
        self, event: RunEvent, *, tenant: str, uid: str, life: int | None = None
    ) -> None:
        self.settled.append(uid)


@dataclasses.dataclass
class Stack:
    bus: WireBus
    api: FakeKube
    events: EventRecorder
    dispatcher: Dispatcher
    ends: Ends

    async def consume(self, name: str) -> None:
        """Hand the dispatcher every event of run ``name`` it has not seen, in order."""
        for event in await self.bus.read_events(NAMESPACE, name):
            await self.dispatcher.on_event(protocol.event_subject(NAMESPACE, name), event)

    async def warnings(self) -> list[dict[str, Any]]:
        await self.events.drain()
        return [e for e in self.api.events if e.get("reason") == "MessageRefused"]


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    bus, api, ends = WireBus(), FakeKube(), Ends()
    events = EventRecorder(api, throttle=Throttle(repeat_after=0, rate=1000, burst=1000))
    seals = RunSeals(SIGNER, VERIFIER, streams=bus, api=api, events=events)
    dispatcher = Dispatcher(
        bus,  # type: ignore[arg-type]
        StatusWriter(api),
        DispatchDeps(ends=ends, queues=QueueBoard(), events=events, seals=seals, caps=NoCaps()),
    )
    try:
        yield Stack(bus, api, events, dispatcher, ends)
    finally:
        await dispatcher.cancel_timers()


def config(name: str, **changes: Any) -> RunConfig:
    base = RunConfig(
        uid=f"uid-{name}",
        namespace=NAMESPACE,
        name=name,
        goal="tenant B's private goal",
        instructions="",
        tools=("kubernetes_get",),
        limits=LIMITS,
        model=ModelConfig(
            "m",
            "https://models.example/v1",
            "m",
            kernel.Pricing(),
            32000,
            100,
            SecretRef("provider-key", NAMESPACE),
        ),
        deadline=4_000_000_000.0,
        tenant="tenant-b",
    )
    return dataclasses.replace(base, **changes)


def admission(cfg: RunConfig, *, seal: bool) -> RunEvent:
    state = kernel.initial_state(goal=cfg.goal, instructions=cfg.instructions)
    event = RunEvent("admitted", cfg.uid, state.summary(), config=cfg, time=1.0)
    return sealed(event) if seal else event


def attacker(cfg: RunConfig) -> RunConfig:
    """B's config with the model pointed at an attacker's server, B's Secret as the key, and
    an unknown tenant."""
    model = dataclasses.replace(cfg.model, base_url="http://attacker.example/v1")
    return dataclasses.replace(cfg, model=model, tenant="unknown")


def refused(reason: str) -> float:
    value = REGISTRY.get_sample_value("agentrun_messages_refused_total", {"reason": reason})
    return value or 0.0


async def test_a_forged_admission_on_a_new_subject_is_refused_and_ended(stack: Stack) -> None:
    before = refused("unsigned")
    forged = admission(attacker(config("forged")), seal=False)
    stack.bus.forge(NAMESPACE, "forged", forged.encode())
    await stack.consume("forged")
    assert stack.bus.published == []  # no TurnRequest: no worker is asked
    last = await stack.bus.last_event(NAMESPACE, "forged")
    assert last is not None and last.kind == "stop"
    assert last.phase is kernel.Phase.CHECKPOINT_FAILED
    assert "carries no seal of the operator" in last.summary.message
    assert refused("unsigned") == before + 1
    (warning,) = await stack.warnings()
    assert warning["type"] == "Warning" and warning["involvedObject"]["name"] == "forged"
    await stack.consume("forged")  # its stop, and the forgery again: refused once
    assert refused("unsigned") == before + 1 and stack.bus.published == []


async def test_a_copied_seal_over_a_changed_config_is_refused(stack: Stack) -> None:
    """B's sealed admission with its model URL changed, the seal kept."""
    real = admission(config("b"), seal=True)
    forged = dataclasses.replace(admission(attacker(config("b")), seal=False), seal=real.seal)
    before = refused("bad_signature")
    stack.bus.forge(NAMESPACE, "b", forged.encode())
    await stack.consume("b")
    assert stack.bus.published == [] and refused("bad_signature") == before + 1


async def test_a_forged_second_admission_of_a_running_run_ends_it(stack: Stack) -> None:
    cfg = config("b")
    await stack.dispatcher.start_run(cfg, start_time=1.0, generation=1)
    await stack.consume("b")
    assert len(stack.bus.published) == 1  # turn 0
    before = refused("unsigned")
    stack.bus.forge(NAMESPACE, "b", admission(attacker(cfg), seal=False).encode())
    await stack.consume("b")
    assert len(stack.bus.published) == 1  # nothing dispatched on the forgery
    assert refused("unsigned") == before + 1
    last = await stack.bus.last_event(NAMESPACE, "b")
    assert last is not None and last.phase is kernel.Phase.CHECKPOINT_FAILED
    await stack.consume("b")  # the refusal's stop: the run ends, its ledger entry settles
    assert stack.ends.settled == [cfg.uid] and not stack.dispatcher.is_tracked(cfg.uid)
    (warning,) = await stack.warnings()
    assert warning["involvedObject"]["uid"] == cfg.uid


async def test_a_sealed_admission_of_another_config_is_refused_as_changed(stack: Stack) -> None:
    cfg = config("b")
    await stack.dispatcher.start_run(cfg, start_time=1.0, generation=1)
    other = sealed(admission(dataclasses.replace(cfg, goal="something else"), seal=False))
    before = refused("changed_config")
    stack.bus.forge(NAMESPACE, "b", other.encode())
    await stack.consume("b")
    assert refused("changed_config") == before + 1


async def test_a_forged_decision_ends_the_run(stack: Stack) -> None:
    cfg = config("b")
    await stack.dispatcher.start_run(cfg, start_time=1.0, generation=1)
    await stack.consume("b")
    state = kernel.initial_state(goal=cfg.goal)
    approval = RunEvent(
        "approval", cfg.uid, state.summary(), approval=protocol.Approval("d" * 64, True)
    )
    before = refused("unsigned")
    stack.bus.forge(NAMESPACE, "b", approval.encode())
    await stack.consume("b")
    assert refused("unsigned") == before + 1 and len(stack.bus.published) == 1


async def test_an_admission_pre_empting_a_queued_run_is_purged_and_the_run_admitted(
    stack: Stack,
) -> None:
    """A forgery written under a queued run's own uid before the operator admits it."""
    cfg = config("queued")
    stack.bus.forge(NAMESPACE, "queued", admission(attacker(cfg), seal=False).encode())
    before = refused("unsigned")
    await stack.dispatcher.start_run(cfg, start_time=1.0, generation=1)
    (first,) = await stack.bus.read_events(NAMESPACE, "queued")
    assert first.config == cfg and first.seal is not None
    assert refused("unsigned") == before + 1


def vouching(stack: Stack, cfg: RunConfig, *, phase: str, seen: int, tenant: str) -> None:
    stack.api.put(
        "agentruns",
        {
            "metadata": {"name": cfg.name, "namespace": NAMESPACE, "uid": cfg.uid},
            "status": {"phase": phase, "lastEventSequence": seen, "tenant": tenant},
        },
    )


async def test_a_run_admitted_before_seals_is_resealed_when_its_status_vouches(
    stack: Stack,
) -> None:
    cfg = config("legacy")
    seq = await stack.bus.append_event(
        NAMESPACE, "legacy", admission(cfg, seal=False), expected_seq=0
    )
    vouching(stack, cfg, phase="Running", seen=seq, tenant=cfg.tenant)
    assert await stack.dispatcher.recover(NAMESPACE, "legacy", cfg.uid, generation=1)
    events = await stack.bus.read_events(NAMESPACE, "legacy")
    assert [e.kind for e in events] == ["admitted", "admitted"]
    assert events[1].seal is not None and events[1].config == cfg
    await stack.consume("legacy")  # the re-seal: followed, turn dispatched on top of it
    assert [r.expected_seq for r in stack.bus.published] == [events[1].seq]
    assert await stack.warnings() == []


@pytest.mark.parametrize(
    ("phase", "seen", "tenant"),
    [("Pending", 1, "tenant-b"), ("Running", 0, "tenant-b"), ("Running", 1, "other")],
    ids=["not-admitted", "no-events-seen", "another-tenant"],
)
async def test_an_unsealed_run_its_status_does_not_vouch_for_is_refused(
    stack: Stack, phase: str, seen: int, tenant: str
) -> None:
    cfg = config("legacy")
    await stack.bus.append_event(NAMESPACE, "legacy", admission(cfg, seal=False), expected_seq=0)
    vouching(stack, cfg, phase=phase, seen=seen, tenant=tenant)
    before = refused("unsigned")
    assert await stack.dispatcher.recover(NAMESPACE, "legacy", cfg.uid, generation=1)
    assert refused("unsigned") == before + 1 and stack.bus.published == []
    last = await stack.bus.last_event(NAMESPACE, "legacy")
    assert last is not None and last.phase is kernel.Phase.CHECKPOINT_FAILED


async def held_run(stack: Stack) -> tuple[RunConfig, kernel.RunState]:
    """Run ``held`` admitted (event 1) and waiting for a person on turn 0's call (event 2,
    committed by ``delivery-1``)."""
    cfg = config(
        "held",
        tools=("calculate",),
        limits=dataclasses.replace(LIMITS, approval_tools=frozenset({"calculate"})),
    )
    await stack.dispatcher.start_run(cfg, start_time=1.0, generation=1)
    state = kernel.initial_state(goal=cfg.goal)
    call = kernel.CheckedCall("call00001", "calculate", {"expression": "1+1"})
    record = kernel.Answered(
        0,
        kernel.decision.ToolCalls(
            (kernel.decision.ToolCall("call00001", "calculate", "{}"),), None
        ),
        kernel.Usage(1, 1),
        (call,),
        (),
        ("call00001",),
        None,
    )
    after = kernel.advance(state, record, cfg.limits)
    await stack.bus.append_event(
        NAMESPACE,
        "held",
        RunEvent("turn", cfg.uid, after.summary(), record=record, owner="delivery-1"),
        expected_seq=1,
    )
    return cfg, after


async def test_a_decision_the_operator_applies_is_sealed_and_names_the_turns_committer(
    stack: Stack,
) -> None:
    cfg, after = await held_run(stack)
    held = after.summary().pending_approval
    assert held is not None
    assert (
        await stack.dispatcher.decide(
            NAMESPACE, "held", cfg.uid, digest=held.digest, approved=True, reviewer="alice"
        )
        is None
    )
    last = await stack.bus.last_event(NAMESPACE, "held")
    assert last is not None and last.kind == "approval"
    assert last.approval is not None and last.approval.reviewer == "alice"
    assert VERIFIER.event_fault(last) is None
    # it names the last turn's committer, as a stop built on it will: the run's close resolves
    # that turn's holds by it
    assert last.owner == "delivery-1"
    stop = last.stopped(kernel.stop(last.state(), kernel.Phase.CANCELLED, "x"), time=2.0)
    assert stop.owner == "delivery-1"


async def test_the_run_key_of_a_refusal_names_the_subject_not_the_config() -> None:
    """A config naming team-a read on team-b's subject is refused as another run's."""
    seals = RunSeals(SIGNER, VERIFIER, streams=WireBus(), api=FakeKube(), events=None)  # type: ignore[arg-type]
    event = RunEvent.decode(admission(config("b", namespace="team-a"), seal=True).encode(), seq=1)
    assert seals.fault(event, key=RunKey(NAMESPACE, "b", "uid-b")) == "wrong_run"


async def test_a_sealed_decision_copied_from_elsewhere_in_the_run_ends_it(stack: Stack) -> None:
    """A decision the operator sealed on another event (a copy from an earlier batch of the
    run, or from the run's first life before a rerun) appended after this held turn: its seal
    verifies, its place does not; the run ends ``checkpoint_failed`` and nothing runs."""
    cfg, after = await held_run(stack)
    await stack.consume("held")
    held = after.summary().pending_approval
    assert held is not None
    state = kernel.resolve_approval(after, digest=held.digest, approved=True, reviewer="alice")
    copied = sealed(
        RunEvent(
            "approval",
            cfg.uid,
            state.summary(),
            approval=protocol.Approval(held.digest, True, "alice", after=7),
        )
    )
    before, published = refused("replayed"), len(stack.bus.published)
    stack.bus.forge(NAMESPACE, "held", copied.encode())
    await stack.consume("held")
    assert refused("replayed") == before + 1
    assert len(stack.bus.published) == published  # no resume turn asked for
    last = await stack.bus.last_event(NAMESPACE, "held")
    assert last is not None and last.phase is kernel.Phase.CHECKPOINT_FAILED


async def first_life_copied(stack: Stack, name: str) -> tuple[RunConfig, bytes]:
    """Run ``name``'s first life admitted, cancelled and its subject purged for a rerun (its
    object now showing ``status.reruns`` 1, as the rerun handler writes it before the purge),
    with a copy of the first life's sealed admission appended again, as a holder of a
    worker's credential can while the rerun waits in its tenant's queue."""
    first_life = config(name)
    await stack.dispatcher.start_run(first_life, start_time=1.0, generation=1)
    await stack.consume(name)
    await stack.dispatcher.end(NAMESPACE, name, first_life.uid, kernel.Phase.CANCELLED, "x")
    await stack.consume(name)
    copy = stack.bus.subjects[protocol.event_subject(NAMESPACE, name)][0][1]
    stack.api.put(
        "agentruns",
        {
            "metadata": {"name": name, "namespace": NAMESPACE, "uid": first_life.uid},
            "status": {"phase": "Pending", "reruns": 1},
        },
    )
    await stack.dispatcher.prepare_rerun(NAMESPACE, name, first_life.uid)
    stack.bus.forge(NAMESPACE, name, copy)
    return first_life, copy


async def test_a_copy_of_a_reruns_first_admission_is_not_followed(stack: Stack) -> None:
    """A rerun keeps the run's uid: its first life's admission, sealed for that uid, copied
    and appended after the rerun purged the subject, while the rerun waits to be admitted
    (under a model, tools and tenant that may have changed since), is not the rerun's: no
    turn is asked for under it, and the refusal is counted and told. The rerun's own
    admission then purges it and goes on under its own config."""
    first_life, _ = await first_life_copied(stack, "again")
    published, before = len(stack.bus.published), refused("replayed")
    await stack.consume("again")
    assert stack.bus.published[published:] == []
    assert refused("replayed") == before + 1
    warning = (await stack.warnings())[-1]
    assert "sealed for another turn, event or life of the run" in warning["message"]
    assert not await stack.dispatcher.recover(
        NAMESPACE, "again", first_life.uid, generation=1, reruns=1
    )
    assert stack.bus.published[published:] == []

    rerun = dataclasses.replace(first_life, reruns=1, goal="the rerun's goal")
    await stack.dispatcher.start_run(rerun, start_time=2.0, generation=1)
    (first,) = await stack.bus.read_events(NAMESPACE, "again")
    assert first.config is not None and first.config.reruns == 1  # the copy purged
    assert first.config.goal == "the rerun's goal"
    await stack.consume("again")
    (turn0,) = stack.bus.published[published:]
    assert (turn0.turn, turn0.expected_seq) == (0, first.seq)


async def test_an_admission_of_a_later_life_than_the_status_shows_is_followed(
    stack: Stack,
) -> None:
    """A status lags its run's events (its rerun's status write lost with a backup, say): an
    admission of a later life than ``status.reruns`` is the run's own."""
    cfg = config("later", reruns=2)
    stack.bus.forge(NAMESPACE, "later", admission(cfg, seal=True).encode())
    assert await stack.dispatcher.recover(NAMESPACE, "later", cfg.uid, generation=1, reruns=1)
    (turn0,) = stack.bus.published
    assert turn0.turn == 0


async def test_a_subject_started_by_anything_but_an_admission_is_purged_at_admission(
    stack: Stack,
) -> None:
    """A run's subject holding, first, an event of it that is no admission (a turn appended
    by a holder of a worker's credential before the run was admitted) is not taken for its
    admission: ``start_run`` refuses it, purges it and appends its own."""
    cfg = config("early")
    state = kernel.initial_state(goal=cfg.goal, instructions=cfg.instructions)
    stack.bus.forge(NAMESPACE, "early", RunEvent("turn", cfg.uid, state.summary()).encode())
    before = refused("unsigned")
    await stack.dispatcher.start_run(cfg, start_time=1.0, generation=1)
    (first,) = await stack.bus.read_events(NAMESPACE, "early")
    assert first.kind == "admitted" and refused("unsigned") == before + 1
    await stack.consume("early")
    assert [r.turn for r in stack.bus.published] == [0]
