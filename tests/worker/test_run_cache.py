"""The worker's cache of runs is bounded by what they weigh, not only by their count: a run's
state holds its whole conversation, and one tenant's runs at the event cap (8 MiB of events,
25 MiB parsed when made of small tool results) cached 1,024 at a time would hold some 25 GiB
of a worker limited to 1 GiB. Measured before: 40 such runs all stayed cached (a gigabyte)."""

from __future__ import annotations

import dataclasses
import gc
import tracemalloc
from collections.abc import AsyncGenerator, Callable
from typing import Any

from seals_support import VERIFIER, sealed

from agentrun import kernel
from agentrun.protocol import ModelConfig, RunConfig, RunEvent, TurnRequest
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


def of_tenant(run: history.LoadedRun, tenant: str) -> history.LoadedRun:
    return dataclasses.replace(run, config=dataclasses.replace(run.config, tenant=tenant))


def test_a_tenant_s_heavy_runs_push_out_its_own_runs_not_another_tenant_s() -> None:
    """Measured before: 4 heavy runs of one tenant pushed out 100 light runs of another."""
    cache = history.RunCache()
    for index in range(100):
        cache.put(of_tenant(light_run(f"light-{index}"), "quiet"))
    quiet = cache.tenant_weight("quiet")
    for index in range(40):
        cache.put(of_tenant(heavy_run(f"heavy-{index}"), "hostile"))
    assert all(cache.get(f"light-{index}") is not None for index in range(100))
    assert cache.tenant_weight("quiet") == quiet
    assert cache.weight <= history.RUN_CACHE_BYTES
    assert cache.get("heavy-39") is not None and cache.get("heavy-0") is None


def test_a_light_tenant_s_run_takes_room_from_a_tenant_over_its_fair_part() -> None:
    cache = history.RunCache()
    for index in range(3):  # alone, a tenant uses the whole cache
        cache.put(of_tenant(heavy_run(f"heavy-{index}"), "hostile"))
    assert len(cache) == 3
    for index in range(300):  # 39 MB: more than the room left
        cache.put(of_tenant(light_run(f"light-{index}"), "quiet"))
    assert all(cache.get(f"light-{index}") is not None for index in range(300))
    assert cache.get("heavy-0") is None  # the over-its-part tenant's least recently used
    assert cache.get("heavy-1") is not None and cache.get("heavy-2") is not None


def test_two_heavy_tenants_end_up_with_about_half_each() -> None:
    cache = history.RunCache(capacity=8 * 2**20, runs=64)
    for index in range(200):  # runs of 64 messages, turn about: a, b, a, b…
        tenant = "ab"[index % 2] if index < 100 else "a"
        run = light_run(f"{tenant}-{index}")
        cache.put(of_tenant(dataclasses.replace(run, stored=100 * 1024), tenant))
    assert abs(cache.tenant_weight("a") - cache.tenant_weight("b")) <= 200 * 1024
    assert cache.weight <= 8 * 2**20


def test_a_run_heavier_than_what_its_tenant_may_take_is_not_cached() -> None:
    """A tenant's run that would make it the heaviest with none of its own runs to let go
    (its share is what the others leave) is read again at its next turn, not cached by
    pushing out another tenant's runs."""
    cache = history.RunCache(capacity=40 * 2**20)
    for index in range(4):
        cache.put(of_tenant(dataclasses.replace(light_run(f"q-{index}"), stored=9 * 2**20), "q"))
    cache.put(of_tenant(heavy_run("heavy"), "hostile"))  # 35 MB beside 36 MiB of another's
    assert cache.get("heavy") is None
    assert all(cache.get(f"q-{index}") is not None for index in range(4))


def test_the_room_of_tenants_gone_quiet_is_taken_back_after_the_protected_time() -> None:
    """7 tenants' ended runs fill the cache; then one tenant cycles 100 runs: within
    ``PROTECTED_SECONDS`` it has what the others leave, after it the whole cache again (the
    review's case: with the heaviest tenant always let go first, it kept 16 MiB for ever and
    read every run again at each turn)."""
    now = [0.0]
    cache = history.RunCache(clock=lambda: now[0])
    mib = dataclasses.replace(light_run("x"), stored=2**20)
    for tenant in range(7):
        for index in range(20):
            cache.put(
                of_tenant(
                    dataclasses.replace(mib, config=config(f"t{tenant}-{index}")), f"t{tenant}"
                )
            )
    now[0] = history.PROTECTED_SECONDS
    misses = 0
    for _ in range(3):
        for index in range(100):
            uid = f"b-{index}"
            if cache.get(uid) is None:
                misses += 1
                cache.put(of_tenant(dataclasses.replace(mib, config=config(uid)), "b"))
            now[0] += 0.01
    assert misses == 100  # read once each: every later turn found its run cached
    assert cache.tenant_weight("b") >= 100 * 2**20
    assert cache.weight <= history.RUN_CACHE_BYTES


def test_runs_in_use_are_kept_for_their_tenant_and_let_go_once_unused() -> None:
    now = [0.0]
    cache = history.RunCache(capacity=5 * 2**19, clock=lambda: now[0])  # two runs of 1 MiB

    def put(uid: str, tenant: str) -> None:
        run = dataclasses.replace(light_run(uid), stored=2**20)
        cache.put(of_tenant(run, tenant))
        now[0] += 1.0

    put("quiet", "quiet")
    put("h-a", "h")
    put("h-b", "h")  # quiet's run in use, its tenant within its fair part: h's own goes
    assert cache.get("quiet") is not None and cache.get("h-a") is None
    now[0] += history.PROTECTED_SECONDS
    cache.get("h-b")
    put("h-c", "h")  # quiet's run unused for the protected time: let go in its turn
    assert cache.get("quiet") is None
    assert cache.get("h-b") is not None and cache.get("h-c") is not None


def calls_answered(turn: int, ids: list[str], text: Callable[[str], str]) -> kernel.Answered:
    """Turn ``turn``'s record: the model asked ``calculate`` once per id in ``ids``, each call
    answered ``text(id)``."""
    return kernel.Answered(
        turn,
        kernel.decision.ToolCalls(
            tuple(kernel.decision.ToolCall(i, "calculate", "{}") for i in ids), None
        ),
        kernel.Usage(1, 1),
        tuple(kernel.CheckedCall(i, "calculate", {"expression": "1"}) for i in ids),
        tuple(kernel.ToolResult(i, "calculate", text(i)) for i in ids),
    )


def run_payloads(
    *, turns: int, calls: int, size: int, uid: str = "measured"
) -> tuple[list[bytes], RunConfig]:
    """A run's events as stored: its sealed admission, then ``turns`` turns of ``calls``
    calls each answered ``size`` characters, each naming the bytes stored before it."""
    cfg = config(uid)
    state = kernel.initial_state(goal=cfg.goal)
    admitted = sealed(RunEvent("admitted", cfg.uid, state.summary(), config=cfg, time=1.0))
    payloads = [admitted.encode()]
    for turn in range(turns):
        ids = [f"call{turn:04d}{n:03d}" for n in range(calls)]
        record = calls_answered(turn, ids, lambda i: f"{i}-" + "r" * size)
        state = kernel.advance(state, record, cfg.limits)
        stored = sum(map(len, payloads))
        event = RunEvent("turn", cfg.uid, state.summary(), record=record, stored_before=stored)
        payloads.append(event.encode())
    return payloads, cfg


def folded_run(
    *, turns: int, calls: int, size: int, uid: str = "measured"
) -> tuple[list[RunEvent], RunConfig]:
    """``run_payloads``, read: decoded with their stream sequences."""
    payloads, cfg = run_payloads(turns=turns, calls=calls, size=size, uid=uid)
    return [RunEvent.decode(p, seq=seq) for seq, p in enumerate(payloads, start=1)], cfg


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


class StoredRun:
    """A run's subject as NATS serves it to ``history.load``: each event decoded as it is
    read (``Bus.iter_events``)."""

    def __init__(self, payloads: list[bytes]) -> None:
        self.payloads = payloads

    async def iter_events(
        self, namespace: str, name: str, *, after_seq: int = 0
    ) -> AsyncGenerator[RunEvent, None]:
        for seq, payload in enumerate(self.payloads, start=1):
            if seq > after_seq:
                yield RunEvent.decode(payload, seq=seq)

    async def read_events(self, namespace: str, name: str, *, after_seq: int = 0) -> Any:
        return [e async for e in self.iter_events(namespace, name, after_seq=after_seq)]


TURNS = 240
"""Turns of the run loaded: 3.8 MB of events."""


async def test_a_load_holds_the_run_s_state_and_a_megabyte_of_its_events_at_most() -> None:
    """The events are folded into the state a megabyte at a time (``history.FOLD_BYTES``),
    each let go once folded: the load's peak is 3.6 MiB above the state it leaves. Before, the
    run's events were read whole, then folded: 10.1 MiB above, growing with the run."""
    payloads, cfg = run_payloads(turns=TURNS, calls=64, size=48)
    request = TurnRequest(cfg.uid, "ns", cfg.name, TURNS, len(payloads))
    tracemalloc.start()
    try:
        loaded = await history.load(
            StoredRun(payloads),  # type: ignore[arg-type]
            history.RunCache(),
            request,
            seals=VERIFIER,
        )
        gc.collect()
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert loaded is not None and (loaded.seq, loaded.state.turn) == (len(payloads), TURNS)
    assert loaded.stored == sum(map(len, payloads))
    assert peak - held < 5 * 2**20, (held, peak)
