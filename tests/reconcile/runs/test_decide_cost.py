"""A reviewer's decision that cannot apply costs the operator one read of the run's last event,
not a replay of the whole run, and what it tells of the digest is bounded.

A namespace's reviewer (its admins may approve) can set ``agentrun.dev/approve`` again and
again on any of its runs, running or ended, with any value (an annotation of up to 256 KiB).
Before: each one read and replayed every event of the run on the operator — 0.7 s of its CPU
for a run of 7.3 MB of events made of small tool results, the GIL held — and quoted the digest
whole in the refusal, in kopf's log line and in the throttle's key, which remembers 10,000
keys (2.5 GiB of such digests)."""

from __future__ import annotations

import dataclasses
from typing import Any

from kube_support import FakeKube

from agentrun import kernel, protocol
from agentrun.operator.handlers import runs as run_handlers
from agentrun.operator.platform.events import EventRecorder, Involved, Throttle
from agentrun.operator.runs.keys import RunKey
from agentrun.protocol import RunEvent

from .test_seals import LIMITS, NAMESPACE, Stack, config, held_run
from .test_seals import stack as stack  # the dispatcher on a stream in memory

LONG_DIGEST = "sha256:" + "f" * 262_000
"""An annotation's value near the API server's 256 KiB of annotations."""


class Reads:
    """Counts the whole-run reads of a `WireBus` (``whole``: from its first event; ``after``:
    from a later one); its ``last_event`` reads one event, as NATS's direct get does: not
    counted."""

    def __init__(self, stack: Stack) -> None:
        self.whole = self.after = 0
        read = stack.bus.read_events

        async def counted(namespace: str, name: str, *, after_seq: int = 0) -> Any:
            if after_seq:
                self.after += 1
            else:
                self.whole += 1
            return await read(namespace, name, after_seq=after_seq)

        async def last(namespace: str, name: str) -> Any:
            events = await read(namespace, name)
            return events[-1] if events else None

        stack.bus.read_events = counted  # type: ignore[method-assign]
        stack.bus.last_event = last  # type: ignore[method-assign]
        self.stack, self.read = stack, read

    async def consume(self, name: str) -> None:
        """``Stack.consume``, its own read not counted."""
        for event in await self.read(NAMESPACE, name):
            subject = protocol.event_subject(NAMESPACE, name)
            await self.stack.dispatcher.on_event(subject, event)


async def test_a_decision_on_a_run_not_waiting_for_a_person_replays_nothing(stack: Stack) -> None:
    cfg = config("busy")
    await stack.dispatcher.start_run(cfg, start_time=1.0, generation=1)
    reads = Reads(stack)
    refused = await stack.dispatcher.decide(
        NAMESPACE, "busy", cfg.uid, digest=LONG_DIGEST, approved=True, reviewer="alice"
    )
    assert refused == "the run is running, not waiting for an approval"
    assert reads.whole == 0


async def test_a_decision_on_a_run_without_events_replays_nothing(stack: Stack) -> None:
    reads = Reads(stack)
    refused = await stack.dispatcher.decide(
        NAMESPACE, "none", "uid-none", digest="sha256:00", approved=False, reviewer="alice"
    )
    assert refused == "the run has no events" and reads.whole == 0


async def test_another_call_s_digest_is_refused_unreplayed_quoting_80_characters_of_it(
    stack: Stack,
) -> None:
    cfg, after = await held_run(stack)
    held = after.summary().pending_approval
    assert held is not None
    reads = Reads(stack)
    refused = await stack.dispatcher.decide(
        NAMESPACE, "held", cfg.uid, digest=LONG_DIGEST, approved=True, reviewer="alice"
    )
    quoted = "sha256:" + "f" * 72 + "…"
    assert refused == (
        f"digest {quoted!r} does not match the pending call call00001 ({held.digest})"
    )
    assert reads.whole == 0
    assert (
        await stack.dispatcher.decide(
            NAMESPACE, "held", cfg.uid, digest=held.digest, approved=True, reviewer="alice"
        )
        is None
    )
    assert reads.whole == 1  # the decision that applies is checked on the replayed run
    last = await stack.bus.last_event(NAMESPACE, "held")
    assert last is not None and last.kind == "approval"
    assert last.phase is kernel.Phase.RUNNING


async def test_a_refused_decision_s_event_quotes_and_keys_a_bounded_digest() -> None:
    api = FakeKube()
    events = EventRecorder(api, throttle=Throttle(repeat_after=60, rate=1000, burst=1000))
    involved = Involved("AgentRun", "held", NAMESPACE, "uid-held")
    for tail in "ab":
        run_handlers._record_decision(
            events,
            involved,
            key="agentrun.dev/approve",
            digest=LONG_DIGEST + tail,
            reviewer="alice",
            refused="the run is running, not waiting for an approval",
        )
    await events.drain()
    (event,) = api.events  # the two digests differ past what is told apart: one occasion
    assert event["message"] == (
        "agentrun.dev/approve=sha256:" + "f" * 72 + "… not applied: the run is running, not "
        "waiting for an approval"
    )
    (remembered,) = events.throttle._last.keys()
    assert len(remembered[2]) == 80


async def test_the_decisions_of_a_batch_replay_the_run_once(stack: Stack) -> None:
    """Each decision of a batch of held calls, and its event as the operator follows it
    (``RunSeals.misplaced``), replays the run from the last replay on, not from its start.
    Before: two whole replays a call, 1.4 s of the operator's CPU each for a run of 6.7 MB of
    small results: 178 s for the 128 calls one model reply may hold."""
    limits = dataclasses.replace(LIMITS, approval_tools=frozenset({"calculate"}))
    cfg = config("batch", tools=("calculate",), limits=limits)
    await stack.dispatcher.start_run(cfg, start_time=1.0, generation=1)
    ids = [f"call{n:05d}" for n in range(3)]
    record = kernel.Answered(
        0,
        kernel.decision.ToolCalls(
            tuple(kernel.decision.ToolCall(i, "calculate", "{}") for i in ids), None
        ),
        kernel.Usage(1, 1),
        tuple(kernel.CheckedCall(i, "calculate", {"expression": i}) for i in ids),
        (),
        tuple(ids),
    )
    after = kernel.advance(kernel.initial_state(goal=cfg.goal), record, cfg.limits)
    event = RunEvent("turn", cfg.uid, after.summary(), record=record, owner="delivery-1")
    await stack.bus.append_event(NAMESPACE, "batch", event, expected_seq=1)
    await stack.consume("batch")
    reads = Reads(stack)
    for _ in ids:
        last = await stack.bus.last_event(NAMESPACE, "batch")
        assert last is not None and last.summary.pending_approval is not None
        digest = last.summary.pending_approval.digest
        refused = await stack.dispatcher.decide(
            NAMESPACE, "batch", cfg.uid, digest=digest, approved=True, reviewer="alice"
        )
        assert refused is None
        await reads.consume("batch")  # the decision's event, judged as it is followed
    assert (reads.whole, reads.after) == (1, 5)  # then each replay reads what came after it
    last = await stack.bus.last_event(NAMESPACE, "batch")
    assert last is not None and last.phase is kernel.Phase.RUNNING
    assert await stack.warnings() == []  # every decision was taken for the operator's


async def test_a_kept_replay_is_not_built_on_once_the_run_is_admitted_again(stack: Stack) -> None:
    """A rerun purges the run's events and admits it again from turn 0, a later life: the
    replay the operator kept of the earlier life is not folded on (its turns would count in
    the new life's, and a decision be judged against them), the run is replayed afresh."""
    cfg = config("again")
    await stack.dispatcher.start_run(cfg, start_time=1.0, generation=1)
    record = kernel.Answered(0, kernel.decision.Final("done"), kernel.Usage(1, 1))
    after = kernel.advance(kernel.initial_state(goal=cfg.goal), record, cfg.limits)
    event = RunEvent("turn", cfg.uid, after.summary(), record=record, owner="delivery-1")
    await stack.bus.append_event(NAMESPACE, "again", event, expected_seq=1)
    key = RunKey(NAMESPACE, "again", cfg.uid)
    first = await stack.dispatcher.seals.replay(key)
    assert first is not None and first.seq == 2 and first.state.turn == 1
    await stack.dispatcher.prepare_rerun(NAMESPACE, "again", cfg.uid)
    await stack.dispatcher.start_run(
        dataclasses.replace(cfg, reruns=1), start_time=2.0, generation=1
    )
    reads = Reads(stack)
    again = await stack.dispatcher.seals.replay(key)
    assert again is not None and again.seq == 3
    assert (again.state.turn, again.config.reruns) == (0, 1)
    assert reads.whole == 1  # read again from the start once the admission was seen
