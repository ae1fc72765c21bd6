"""A reviewer's decision that cannot apply costs the operator one read of the run's last event,
not a replay of the whole run, and what it tells of the digest is bounded.

A namespace's reviewer (its admins may approve) can set ``agentrun.dev/approve`` again and
again on any of its runs, running or ended, with any value (an annotation of up to 256 KiB).
Before: each one read and replayed every event of the run on the operator — 0.7 s of its CPU
for a run of 7.3 MB of events made of small tool results, the GIL held — and quoted the digest
whole in the refusal, in kopf's log line and in the throttle's key, which remembers 10,000
keys (2.5 GiB of such digests)."""

from __future__ import annotations

from typing import Any

from kube_support import FakeKube

from agentrun import kernel
from agentrun.operator.handlers import runs as run_handlers
from agentrun.operator.platform.events import EventRecorder, Involved, Throttle

from .test_seals import NAMESPACE, Stack, config, held_run
from .test_seals import stack as stack  # the dispatcher on a stream in memory

LONG_DIGEST = "sha256:" + "f" * 262_000
"""An annotation's value near the API server's 256 KiB of annotations."""


class Reads:
    """Counts the whole-run reads of a `WireBus` (its ``last_event`` reads one event, as
    NATS's direct get does: not counted)."""

    def __init__(self, stack: Stack) -> None:
        self.whole = 0
        read = stack.bus.read_events

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.whole += 1
            return await read(*args, **kwargs)

        async def last(namespace: str, name: str) -> Any:
            events = await read(namespace, name)
            return events[-1] if events else None

        stack.bus.read_events = counted  # type: ignore[method-assign]
        stack.bus.last_event = last  # type: ignore[method-assign]


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
