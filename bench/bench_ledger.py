"""Ledger reserve+settle pairs per second, against a real nats-server (JetStream KV, file store).

Each reserver is one run doing what a worker does around every turn (``ledger.TurnHold``): reserve
the model call's worst case (1,100 tokens: a 1,000-token prompt estimate plus a 100-token
output allowance), then, if it fit, settle the run's growing cumulative usage (~120 tokens a
call) from a fake committed ``RunState``. No model call or tools run between the two: this
measures the ledger alone. Every run is admitted (``Book.admit``) first, so settlement charges.

Scenarios (64 reservers each; ``K`` LedgerStores, each on its own NATS connection, stand for
``K`` worker processes, all in this one Python process):

- contended: one tenant, 64 runs spread over ``K`` stores (K = 3, and K = 1). The tenant's
  tokens limit is sized from a one-second unlimited calibration round so that it is reached
  (used + holds) roughly ``--seconds`` in: from then on reserves are refused, each refused run
  ends (as ``TenantBudgetExhausted`` does), and the round ends when every run has ended.
  Pairs/s is over the whole round; the rate before the first refusal is reported too. At the
  end the tenant's book must show zero overspend: ``used ≤ limit``, ``used`` equal to the sum
  of every run's own cumulative usage (= what settlement charged per run), and no holds left;
  otherwise the benchmark exits 1.
- uncontended: 64 tenants with one run each, unlimited in effect, for ``--seconds``.

Figures: median pairs/s over ``--rounds`` rounds (a pair = one reserve that fit plus its
settle), refused reserves, p50/p99 of one reserve and of one settle (all rounds pooled),
compare-and-set conflicts (``LedgerStore.conflicts``) and the ratio to the target
(issue: ≥ 1,000 pairs/s uncontended, ≥ 300 pairs/s contended). With ``--profile`` (or when a
target is missed) it also prints where the time goes: entry encode/decode, KV round trips and
a cProfile of one contended round.

    cd bench && ../.venv/bin/python bench_ledger.py [--seconds 5] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import pstats
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import nats
from harness import median, percentile, write_result
from nats.aio.client import Client

from agentrun import kernel
from agentrun.ledger import (
    Book,
    Hold,
    LedgerStore,
    LedgerUnavailable,
    QueuedRun,
    TenantLimits,
    TurnRef,
    codec,
    worst_case,
)
from agentrun_dev import components, natsserver

RESERVERS = 64
TARGET_UNCONTENDED = 1000.0
TARGET_CONTENDED = 300.0
NAMESPACE = "bench"
PRICING = kernel.Pricing(Decimal("2.50"), Decimal("1.25"), Decimal("10.00"))
PROMPT_ESTIMATE, OUTPUT_ALLOWANCE = 1_000, 100
WORST_TOKENS, WORST_COST = worst_case(
    prompt_tokens=PROMPT_ESTIMATE, output_tokens=OUTPUT_ALLOWANCE, pricing=PRICING
)
AVG_CALL_TOKENS = 120
WINDOW_SECONDS = 1e9
"""A window that cannot roll during the benchmark (a roll zeroes ``used``)."""
UNLIMITED = TenantLimits(tokens=10**12, cost_usd=Decimal(10**6), window_seconds=WINDOW_SECONDS)
"""Limits that never refuse but are still checked on every reserve."""


def call_usage(turn: int) -> kernel.Usage:
    """What one model call used: ~120 tokens (104..136), 64 of the prompt from the cache."""
    input_tokens = 88 + (turn * 13) % 17 * 2
    output_tokens = 16 + turn % 3 * 4
    cost = PRICING.cost(
        input_tokens=input_tokens, cached_input_tokens=64, output_tokens=output_tokens
    )
    return kernel.Usage(input_tokens, output_tokens, 64, cost)


@dataclasses.dataclass
class Run:
    """One reserver: a run, its store (its "worker") and its state after committed turns."""

    store: LedgerStore
    tenant: str
    uid: str
    state: kernel.RunState


@dataclasses.dataclass
class Tally:
    """What the reservers of one round did."""

    pairs: int = 0
    refused: int = 0
    unavailable: int = 0
    """``LedgerUnavailable`` raised (the operation was retried, as a redelivery would)."""
    reserve_s: list[float] = dataclasses.field(default_factory=list)
    settle_s: list[float] = dataclasses.field(default_factory=list)
    first_refusal: float | None = None
    """perf_counter of the first refused reserve."""
    pairs_before_refusal: int = 0


async def reserver(run: Run, tally: Tally, *, until: float, end_on_refusal: bool) -> None:
    """Reserve → settle, turn after turn, until ``until`` or (optionally) a refusal."""
    clock = time.perf_counter
    while clock() < until:
        turn = run.state.turn
        ref = TurnRef(run.tenant, run.uid, NAMESPACE, run.uid, turn)
        async with run.store.turn_hold(ref) as hold:
            t0 = clock()
            try:
                refusal = await hold.reserve(tokens=WORST_TOKENS, cost_usd=WORST_COST)
            except LedgerUnavailable:
                tally.unavailable += 1
                continue
            t1 = clock()
            tally.reserve_s.append(t1 - t0)
            if refusal is not None:
                tally.refused += 1
                if tally.first_refusal is None:
                    tally.first_refusal, tally.pairs_before_refusal = t1, tally.pairs
                if end_on_refusal:
                    return  # the run ends: TenantBudgetExhausted
                continue
            # (the model call, the tools and the commit of the turn event would happen here)
            after = dataclasses.replace(
                run.state, usage=run.state.usage + call_usage(turn), turn=turn + 1
            )
            t2 = clock()
            while True:
                try:
                    await hold.settle(after)
                    break
                except LedgerUnavailable:
                    tally.unavailable += 1
            tally.settle_s.append(clock() - t2)
        run.state = after
        tally.pairs += 1


async def admit(runs: Sequence[Run], limits: TenantLimits) -> None:
    """Admit every run (concurrently: one tenant's admissions race like the operator's)."""

    async def one(run: Run) -> None:
        refusal = await run.store.admit_run(
            run.tenant,
            QueuedRun(run.uid, NAMESPACE, run.uid, time.time()),
            limits=limits,
            need=(0, Decimal(0)),
        )
        if refusal is not None:
            raise RuntimeError(f"{run.uid} not admitted: {refusal.message}")

    await asyncio.gather(*(one(run) for run in runs))


async def check_books(store: LedgerStore, runs: Sequence[Run]) -> list[str]:
    """Zero overspend, per tenant: used ≤ limit, used = Σ runs' usage = Σ charged, no holds."""
    problems = []
    by_tenant: dict[str, list[Run]] = {}
    for run in runs:
        by_tenant.setdefault(run.tenant, []).append(run)
    for tenant, own in by_tenant.items():
        book = await store.read(tenant)
        if book is None:
            problems.append(f"{tenant}: no book")
            continue
        tokens = sum(run.state.usage.total_tokens for run in own)
        cost = sum((run.state.usage.cost_usd for run in own), Decimal(0))
        charged = sum(a.tokens for a in book.active.values())
        limit = book.limits.tokens
        if limit is not None and book.used_tokens > limit:
            problems.append(f"{tenant}: OVERSPENT {book.used_tokens} tokens of {limit}")
        if book.used_tokens != tokens or book.used_tokens != charged:
            problems.append(
                f"{tenant}: used {book.used_tokens} tokens, runs used {tokens}, "
                f"charged per run {charged}"
            )
        if book.used_cost != cost:
            problems.append(f"{tenant}: used {book.used_cost} USD, runs used {cost}")
        if book.holds:
            problems.append(f"{tenant}: {len(book.holds)} holds left: {sorted(book.holds)}")
    return problems


def make_runs(stores: Sequence[LedgerStore], tenants: Sequence[str], label: str) -> list[Run]:
    """64 runs over ``tenants`` (round-robin) and over ``stores`` (round-robin)."""
    state = kernel.initial_state(goal="benchmark the ledger")
    return [
        Run(stores[i % len(stores)], tenants[i % len(tenants)], f"{label}-run{i}", state)
        for i in range(RESERVERS)
    ]


async def one_round(
    stores: Sequence[LedgerStore],
    *,
    label: str,
    contended: bool,
    seconds: float,
    limits: TenantLimits,
    until_refused: bool = False,
) -> dict[str, Any]:
    """One round: ``seconds`` long, or with ``until_refused`` until every run has been refused
    once (bounded by ``3 * seconds + 10``). Returns its figures (and the raw latency samples
    under ``_samples``)."""
    tenants = [label] if contended else [f"{label}-t{i}" for i in range(RESERVERS)]
    runs = make_runs(stores, tenants, label)
    await admit(runs, limits)
    conflicts_before = sum(store.conflicts for store in stores)
    tally = Tally()
    start = time.perf_counter()
    until = start + (3 * seconds + 10 if until_refused else seconds)
    await asyncio.gather(
        *(reserver(run, tally, until=until, end_on_refusal=until_refused) for run in runs)
    )
    elapsed = time.perf_counter() - start
    problems = await check_books(stores[0], runs)
    book = await stores[0].read(tenants[0])
    assert book is not None
    stored = await stores[0].kv.get(f"book.{tenants[0]}")  # what every change rewrites
    figures: dict[str, Any] = {
        "pairs": tally.pairs,
        "refused": tally.refused,
        "unavailable": tally.unavailable,
        "seconds": round(elapsed, 3),
        "pairs_per_s": round(tally.pairs / elapsed, 1),
        "conflicts": sum(store.conflicts for store in stores) - conflicts_before,
        "entry_bytes": len(stored.value or b""),
        "problems": problems,
    }
    if contended:
        figures["tokens_limit"] = limits.tokens
        figures["used_tokens"] = book.used_tokens
        if tally.first_refusal is not None and tally.first_refusal > start:
            before = tally.first_refusal - start
            figures["first_refusal_s"] = round(before, 3)
            figures["pairs_per_s_before_refusal"] = round(tally.pairs_before_refusal / before, 1)
    figures["_samples"] = (tally.reserve_s, tally.settle_s)
    return figures


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    contended: bool
    workers: int
    target: float
    headline: bool = True


SCENARIOS = (
    Scenario("contended_k3", True, 3, TARGET_CONTENDED),
    Scenario("contended_k1", True, 1, TARGET_CONTENDED, headline=False),
    Scenario("uncontended_k3", False, 3, TARGET_UNCONTENDED),
    Scenario("uncontended_k1", False, 1, TARGET_UNCONTENDED, headline=False),
)


async def run_scenario(
    clients: Sequence[Client], scenario: Scenario, *, seconds: float, rounds: int
) -> dict[str, Any]:
    """Calibrate (contended), then ``rounds`` rounds on fresh tenants; medians and pooled
    percentiles."""
    stores = [await LedgerStore.open(c.jetstream()) for c in clients[: scenario.workers]]
    limits, calibration_problems = UNLIMITED, []
    if scenario.contended:  # an unlimited second, to size the limit
        calibration = await one_round(
            stores, label=f"{scenario.name}-cal", contended=True, seconds=1.0, limits=limits
        )
        rate = calibration["pairs_per_s"]
        calibration_problems = calibration["problems"]
        # what ``seconds`` of pairs use, plus room for half the runs' holds: refusals start
        # once used + holds reach the limit, then the runs end one by one as they are refused
        tokens = int(rate * seconds * AVG_CALL_TOKENS) + RESERVERS * WORST_TOKENS // 2
        limits = dataclasses.replace(UNLIMITED, tokens=tokens)
    results = []
    for index in range(rounds):
        results.append(
            await one_round(
                stores,
                label=f"{scenario.name}-r{index}",
                contended=scenario.contended,
                seconds=seconds,
                limits=limits,
                until_refused=scenario.contended,
            )
        )
    samples = [r.pop("_samples") for r in results]
    reserve = [s for reserves, _ in samples for s in reserves]
    settle = [s for _, settles in samples for s in settles]
    rate = median(r["pairs_per_s"] for r in results)
    figures: dict[str, Any] = {
        "tenants": 1 if scenario.contended else RESERVERS,
        "reservers": RESERVERS,
        "stores": scenario.workers,
        "median_pairs_per_s": rate,
        "target_pairs_per_s": scenario.target,
        "ratio_to_target": round(rate / scenario.target, 2),
        "target_met": rate >= scenario.target,
        "reserve_ms_p50": round(percentile(reserve, 0.5) * 1000, 2),
        "reserve_ms_p99": round(percentile(reserve, 0.99) * 1000, 2),
        "settle_ms_p50": round(percentile(settle, 0.5) * 1000, 2),
        "settle_ms_p99": round(percentile(settle, 0.99) * 1000, 2),
        "median_conflicts": median(r["conflicts"] for r in results),
        "median_refused": median(r["refused"] for r in results),
        "unavailable": sum(r["unavailable"] for r in results),
        "entry_bytes_max": max(r.pop("entry_bytes") for r in results),
        "problems": calibration_problems + [p for r in results for p in r.pop("problems")],
        "rounds": results,
    }
    if scenario.contended:
        before = [r["pairs_per_s_before_refusal"] for r in results if "first_refusal_s" in r]
        figures["median_pairs_per_s_before_first_refusal"] = median(before) if before else None
        figures["tokens_limit"] = limits.tokens
        figures["limit_reached_every_round"] = all(r["refused"] > 0 for r in results)
        if not figures["limit_reached_every_round"]:
            print(f"{scenario.name}: the tokens limit was not reached in some round")
    return figures


# --- where the time goes -----------------------------------------------------------------------


def contended_book() -> Book:
    """A contended tenant's entry mid-round: 64 active runs, 32 holds."""
    book = Book.new("bench", dataclasses.replace(UNLIMITED, tokens=10**7), now=time.time())
    now = time.time()
    for i in range(RESERVERS):
        book.admit(f"contended-run{i}", NAMESPACE, f"contended-run{i}", now=now)
        book.settle(f"contended-run{i}", turn=7, tokens=900, cost_usd=Decimal("0.00123"), now=now)
    for i in range(RESERVERS // 2):
        hold = Hold(f"contended-run{i}", 8, WORST_TOKENS, WORST_COST, now + 60, "0" * 16)
        book.reserve(f"contended-run{i}:8", hold, now=now)
    return book


def time_us(fn: Any, repeats: int = 2000) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return round(median(samples) * 1e6, 1)


class TimedKV:
    """A ``KeyValue`` proxy that sums the time spent awaiting ``get`` and ``update``."""

    def __init__(self, kv: Any) -> None:
        self.kv = kv
        self.seconds = {"get": 0.0, "update": 0.0}
        self.calls = {"get": 0, "update": 0}

    async def _timed(self, op: str, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await getattr(self.kv, op)(*args, **kwargs)
        finally:
            self.seconds[op] += time.perf_counter() - start
            self.calls[op] += 1

    async def get(self, *args: Any, **kwargs: Any) -> Any:
        return await self._timed("get", *args, **kwargs)

    async def _get(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await self.kv._get(*args, **kwargs)
        finally:
            self.seconds["get"] += time.perf_counter() - start
            self.calls["get"] += 1

    async def update(self, *args: Any, **kwargs: Any) -> Any:
        return await self._timed("update", *args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # the rest of the KeyValue, untimed
        return getattr(self.kv, name)


def time_puts(store: LedgerStore, kv: TimedKV) -> None:
    """Time a store's writes as ``update`` (a store that writes through ``_put``: the totals
    and run entries, one value or an atomic batch)."""
    put = getattr(store, "_put", None)
    if put is None:
        return

    async def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await put(*args, **kwargs)
        finally:
            kv.seconds["update"] += time.perf_counter() - start
            kv.calls["update"] += 1

    store._put = timed  # type: ignore[method-assign]


async def time_split(clients: Sequence[Client], seconds: float) -> dict[str, Any]:
    """Where one contended change's time goes: KV round trips awaited, entry decode/encode,
    and how busy this process's one thread was (an unlimited contended round)."""
    stores = [await LedgerStore.open(c.jetstream()) for c in clients]
    timed = [TimedKV(store.kv) for store in stores]
    for store, kv in zip(stores, timed, strict=True):
        store.kv = kv  # type: ignore[assignment]
        time_puts(store, kv)
    spent = {"decode": 0.0, "encode": 0.0}
    # the totals and run entries (this layout), or the one-value book (the layout before)
    names = (
        ("decode_totals", "split") if hasattr(codec, "split") else ("decode_book", "encode_book")
    )
    decode, encode = getattr(codec, names[0]), getattr(codec, names[1])

    def timed_decode(data: bytes) -> Any:
        start = time.perf_counter()
        try:
            return decode(data)
        finally:
            spent["decode"] += time.perf_counter() - start

    def timed_encode(book: Book, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return encode(book, **kwargs)
        finally:
            spent["encode"] += time.perf_counter() - start

    setattr(codec, names[0], timed_decode)
    setattr(codec, names[1], timed_encode)
    try:
        wall, cpu = time.perf_counter(), time.thread_time()
        figures = await one_round(
            stores, label=f"split{len(stores)}", contended=True, seconds=seconds, limits=UNLIMITED
        )
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    finally:
        setattr(codec, names[0], decode)
        setattr(codec, names[1], encode)
    changes = 2 * figures["pairs"] + figures["refused"]
    per_change = {
        op: round(sum(kv.seconds[op] for kv in timed) / changes * 1000, 3)
        for op in ("get", "update")
    }
    return {
        "pairs_per_s": figures["pairs_per_s"],
        "conflicts_per_pair": round(figures["conflicts"] / max(1, figures["pairs"]), 2),
        "ms_per_change": round(figures["seconds"] / changes * 1000, 3),
        "kv_get_ms_per_change": per_change["get"],
        "kv_update_ms_per_change": per_change["update"],
        "kv_calls_per_change": round(sum(sum(kv.calls.values()) for kv in timed) / changes, 2),
        "decode_ms_per_change": round(spent["decode"] / changes * 1000, 3),
        "encode_ms_per_change": round(spent["encode"] / changes * 1000, 3),
        "python_thread_busy": round(cpu / wall, 2),
    }


async def profile(clients: Sequence[Client], seconds: float) -> dict[str, Any]:
    """Pure-CPU cost of one change of a contended entry, KV round trips, and a cProfile."""
    book = contended_book()
    data = codec.encode_book(book)
    now = time.time()
    hold = Hold("contended-run40", 9, WORST_TOKENS, WORST_COST, now + 60, "1" * 16)

    def change() -> None:  # what LedgerStore._change does per attempt, minus the I/O
        copy = codec.decode_book(data)
        copy.reserve("contended-run40:9", hold, now=now)
        codec.encode_book(copy)

    cpu = {
        "entry_bytes": len(data),
        "decode_us": time_us(lambda: codec.decode_book(data)),
        "encode_us": time_us(lambda: codec.encode_book(book)),
        "decode_apply_encode_us": time_us(change),
    }
    kv = (await LedgerStore.open(clients[0].jetstream())).kv
    revision = await kv.put("profile.rt", data)
    gets, updates = [], []
    for _ in range(300):
        start = time.perf_counter()
        await kv.get("profile.rt")
        gets.append(time.perf_counter() - start)
        start = time.perf_counter()
        revision = await kv.update("profile.rt", data, last=revision)
        updates.append(time.perf_counter() - start)
    await kv.delete("profile.rt")
    round_trips = {
        "kv_get_ms_p50": round(median(gets) * 1000, 3),
        "kv_update_ms_p50": round(median(updates) * 1000, 3),
        "kv_update_ms_p99": round(percentile(updates, 0.99) * 1000, 3),
    }
    print(f"ledger profile: contended entry {cpu}")
    print(f"ledger profile: sequential KV round trips, one key {round_trips}")
    splits = {f"split_k{k}": await time_split(clients[:k], seconds) for k in (1, 3)}
    for name, split in splits.items():
        print(f"ledger profile: unlimited contended round, {name}: {split}")
    stores = [await LedgerStore.open(c.jetstream()) for c in clients[:3]]
    profiler = cProfile.Profile()
    profiler.enable()
    await one_round(stores, label="profile", contended=True, seconds=seconds, limits=UNLIMITED)
    profiler.disable()
    stats = pstats.Stats(profiler)
    print("ledger profile: one unlimited contended round (K=3), by own time")
    stats.sort_stats("tottime").print_stats(15)
    stats.sort_stats("cumulative").print_stats(r"agentrun/ledger/|worker/budget|nats/js/kv", 12)
    return {**cpu, **round_trips, **splits}


# --- main --------------------------------------------------------------------------------------


async def bench(server: natsserver.NatsServer, args: argparse.Namespace) -> dict[str, Any]:
    options = server.client_options()  # admission is the operator's, holds the workers'
    clients = [await nats.connect(**options, name=f"bench-ledger-{i}") for i in range(3)]
    try:
        stores = [await LedgerStore.open(c.jetstream()) for c in clients]
        await one_round(  # warm up: bucket, connections, code paths
            stores, label="warmup", contended=False, seconds=0.5, limits=UNLIMITED
        )
        scenarios = {}
        for scenario in SCENARIOS:
            figures = await run_scenario(
                clients, scenario, seconds=args.seconds, rounds=args.rounds
            )
            scenarios[scenario.name] = figures
            print_row(scenario.name, figures)
        missed = any(not scenarios[s.name]["target_met"] for s in SCENARIOS if s.headline)
        profiled = None
        if args.profile or missed:
            profiled = await profile(clients, min(args.seconds, 2.0))
        return {"scenarios": scenarios, "profile": profiled}
    finally:
        for client in clients:
            await client.close()


def print_row(name: str, f: dict[str, Any]) -> None:
    """One line of the table (the header before the first)."""
    if name == SCENARIOS[0].name:
        print(
            f"{'scenario':<16}{'pairs/s':>9}{'target':>8}{'ratio':>7}{'refused':>9}"
            f"{'conflicts':>10}{'unavail':>8}{'reserve p50/p99 ms':>20}"
            f"{'settle p50/p99 ms':>20}  overspend"
        )
    print(
        f"{name:<16}{f['median_pairs_per_s']:>9.0f}{f['target_pairs_per_s']:>8.0f}"
        f"{f['ratio_to_target']:>7.2f}{f['median_refused']:>9}{f['median_conflicts']:>10}"
        f"{f['unavailable']:>8}{f['reserve_ms_p50']:>11.1f} / {f['reserve_ms_p99']:<6.1f}"
        f"{f['settle_ms_p50']:>11.1f} / {f['settle_ms_p99']:<6.1f}"
        f"  {'FAILED' if f['problems'] else 'none'}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0, help="length of a round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 round of 2 s")
    parser.add_argument("--profile", action="store_true", help="also show where the time goes")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.rounds = 2.0, 1

    workdir = Path(tempfile.mkdtemp(prefix="agentrun-bench-ledger-"))
    launch = components.Launch(log_dir=workdir / "logs", die_with_parent=True)
    server = natsserver.start_nats_server(workdir / "nats", launch=launch)
    try:
        result = asyncio.run(bench(server, args))
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    scenarios = result["scenarios"]
    contended, uncontended = scenarios["contended_k3"], scenarios["uncontended_k3"]
    problems = [f"{name}: {p}" for name, figures in scenarios.items() for p in figures["problems"]]
    figures = {
        "contended_pairs_per_s": contended["median_pairs_per_s"],
        "contended_ratio_to_target": contended["ratio_to_target"],
        "uncontended_pairs_per_s": uncontended["median_pairs_per_s"],
        "uncontended_ratio_to_target": uncontended["ratio_to_target"],
        "target": f">= {TARGET_UNCONTENDED:g} pairs/s uncontended, "
        f">= {TARGET_CONTENDED:g} contended (K=3), zero overspend",
        "target_met": contended["target_met"] and uncontended["target_met"],
        "zero_overspend": not problems,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "reserve_worst_case_tokens": WORST_TOKENS,
        "call_tokens_avg": AVG_CALL_TOKENS,
        "scenarios": scenarios,
        "profile": result["profile"],
    }
    write_result("ledger", figures)
    if problems:
        print("OVERSPEND / LEDGER INVARIANT BROKEN:", *problems, sep="\n  ", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
