"""The worker's cache of runs is bounded by what they weigh, not only by their count: a run's
state holds its whole conversation, and one tenant's runs at the event cap (8 MiB of events,
25 MiB parsed when made of small tool results) cached 1,024 at a time would hold some 25 GiB
of a worker limited to 1 GiB. Measured before: 40 such runs all stayed cached (a gigabyte)."""

from __future__ import annotations

import dataclasses
import gc
import tracemalloc

from seals_support import VERIFIER, sealed

from agentrun import kernel
from agentrun.protocol import ModelConfig, RunConfig, RunEvent
from agentrun.worker import history

EVENT_CAP = 8 * 2**20
"""``AGENTRUN_RUN_EVENT_MAX_BYTES``'s default."""
HEAVY_MESSAGES = 26_001
"""Messages of a run at the event cap made of 64 results of 60 bytes a turn (400 turns)."""


def config(uid: str) -> RunConfig:
    limits = kernel.Limits(max_steps=10_000, max_tool_calls=1_000_000)
    model = ModelConfig("m", "http://model.example/v1", "m", kernel.Pricing(), 32000, 100)
    return RunConfig(uid, "ns", uid, "goal", "", ("calculate",), limits, model, 4e9)


def heavy_run(uid: str) -> history.LoadedRun:
    """A run at the event cap with the messages of one (every message the same small dict:
    the test's own memory stays small; the cache cannot tell)."""
    message = {"role": "tool", "tool_call_id": "call", "content": "x" * 60}
    state = kernel.RunState(messages=(message,) * HEAVY_MESSAGES)
    return history.LoadedRun(config(uid), state, seq=401, stored=EVENT_CAP)


def light_run(uid: str) -> history.LoadedRun:
    cfg = config(uid)
    return history.LoadedRun(cfg, kernel.initial_state(goal=cfg.goal), seq=1, stored=600)


def test_one_tenant_s_heavy_runs_are_cached_within_the_byte_bound() -> None:
    cache = history.RunCache()
    for index in range(40):
        cache.put(heavy_run(f"uid-{index}"))
    assert cache.weight <= history.RUN_CACHE_BYTES == 128 * 2**20
    each = EVENT_CAP + 1024 * HEAVY_MESSAGES
    assert len(cache) == history.RUN_CACHE_BYTES // each == 3
    assert cache.get("uid-0") is None  # the least recently used went first
    assert cache.get("uid-39") is not None


def test_a_run_heavier_than_the_whole_cache_is_not_cached_and_others_stay() -> None:
    cache = history.RunCache(capacity=16 * 2**20)
    cache.put(light_run("light"))
    cache.put(heavy_run("heavy"))  # 34.6 MB counted: over the capacity
    assert cache.get("heavy") is None
    assert cache.get("light") is not None
    cache.put(dataclasses.replace(heavy_run("light"), config=config("light")))
    assert cache.get("light") is None  # its older, lighter state is not served either


def test_light_runs_are_still_cached_a_thousand_and_twenty_four_at_most() -> None:
    cache = history.RunCache()
    for index in range(1100):
        cache.put(light_run(f"uid-{index}"))
    assert len(cache) == 1024
    assert cache.get("uid-75") is None and cache.get("uid-76") is not None


def folded_run(
    *, turns: int, calls: int, size: int, uid: str = "measured"
) -> tuple[list[RunEvent], RunConfig]:
    """A run's events as read from the stream: its sealed admission, then ``turns`` turns of
    ``calls`` calls each answered ``size`` characters."""
    cfg = config(uid)
    state = kernel.initial_state(goal=cfg.goal)
    admitted = sealed(RunEvent("admitted", cfg.uid, state.summary(), config=cfg, time=1.0))
    payloads = [admitted.encode()]
    for turn in range(turns):
        ids = [f"call{turn:04d}{n:03d}" for n in range(calls)]
        record = kernel.Answered(
            turn,
            kernel.decision.ToolCalls(
                tuple(kernel.decision.ToolCall(i, "calculate", "{}") for i in ids), None
            ),
            kernel.Usage(1, 1),
            tuple(kernel.CheckedCall(i, "calculate", {"expression": "1"}) for i in ids),
            tuple(kernel.ToolResult(i, "calculate", f"{i}-" + "r" * size) for i in ids),
        )
        state = kernel.advance(state, record, cfg.limits)
        payloads.append(RunEvent("turn", cfg.uid, state.summary(), record=record).encode())
    events, stored = [], 0
    for seq, payload in enumerate(payloads, start=1):
        event = RunEvent.decode(payload, seq=seq)
        events.append(dataclasses.replace(event, stored_before=stored))
        stored += len(payload)
    return events, cfg


def test_a_run_s_weight_counts_at_least_what_its_state_holds() -> None:
    """The weight is checked against what Python holds for the folded run, measured: small
    results (a message's dicts dominate) and large ones (their text does)."""
    for turns, calls, size in ((60, 64, 48), (16, 8, 16_000)):
        tracemalloc.start()
        try:
            events, cfg = folded_run(turns=turns, calls=calls, size=size)
            loaded = history.fold(events, run_uid=cfg.uid, seals=VERIFIER)
            assert loaded is not None
            del events
            gc.collect()
            held, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert held <= history.weight(loaded) <= 2 * held, (turns, calls, size)
