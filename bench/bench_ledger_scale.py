"""Tenants as big as their users, against the ledger alone: admissions/s, reservation latency,
compare-and-set retries per reservation and ledger bytes written per turn, with a tenant's
queue and active runs at the sizes users reach.

Scenarios (``--scenarios``, comma-separated):

- ``big``: one tenant, ``maxConcurrentRuns`` 2,000, 12,000 runs applied at once: 2,000 active
  and 10,000 queued from the start (``--active``, ``--queued``);
- ``cap``: one tenant at the one-value ledger's cap (500 active runs, 1,000 queued):
  ``maxConcurrentRuns`` 500 and 1,500 runs;
- ``many``: 20 tenants × 500 runs, ``maxConcurrentRuns`` 500 each (every run active at once).

Each run does with the ledger what the operator and a worker do around a one-turn run: the
operator queues it (all runs at once), its tenant's pump admits from the head in FIFO order as
the tree's operator does (this tree: the longest prefix of 32 heads that fits in one write,
``admit_runs``; a tree without it: ``admit_run`` one at a time), holding each first call's
worst case, then dequeues them; a worker reserves its call (``reserve_call``), waits the
scripted model's latency (``--model-ms``), records what the call used (``spend``) and settles;
the operator closes the run (``close_run``) and pumps the queue again. ``--workers`` worker
stores (each on its own NATS connection, as worker processes are) and one operator store, in
this process, against a nats-server of its own (closed as shipped).

First the floor: what one ledger write costs at the least on the same server (one writer,
sequential): a compare-and-set of one value and, in this layout, an atomic batch of two (a
run's entry and its tenant's totals). Then, per scenario: admissions/s (first admission →
last), reservation p50/p99 (ms), compare-and-set conflicts per reservation (every store's
lost races over the reservations made), ledger writes and bytes written per turn (every
message published to the ledger bucket's subjects, counted by a subscriber: payload bytes, and
the largest), runs the storage refused (the one-value ledger's queue cap, ``QueueFull``), wall
time. Each tenant's ledger is checked at the end: ``used`` equal to the sum of its runs' usage
exactly, nothing held, nothing active (the benchmark exits 1 otherwise).

It runs in any tree with the ledger port (``admit_run``, ``turn_hold``, ``close_run``,
``enqueue``, ``dequeue``, ``queue``), so ``make bench-ab REF=60a0290 BENCH=bench_ledger_scale.py``
sets the one-value ledger against this one on the same instrument.

    cd bench && ../.venv/bin/python bench_ledger_scale.py [--scenarios big,cap,many]
        [--model-ms 20] [--workers 3] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import inspect
import itertools
import shutil
import sys
import tempfile
import time
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import nats
from harness import load_average, percentile, tree_revision, write_result
from nats.aio.client import Client

from agentrun import kernel
from agentrun.ledger import (
    BudgetWait,
    CallNeed,
    Granted,
    LedgerStore,
    LedgerUnavailable,
    QueuedRun,
    TenantLimits,
    TurnRef,
    worst_case,
)
from agentrun_dev import components, natsserver

BUCKET = "AGENTRUN_LEDGER_SCALE"
NAMESPACE = "bench"
PRICING = kernel.Pricing(Decimal("2.50"), Decimal("1.25"), Decimal("10.00"))
NEED = CallNeed(1_000, 500, PRICING, min_output_tokens=128)
"""Each run's one model call: a 1,000-token prompt bound and a 500-token allowance."""
USAGE = kernel.Usage(input_tokens=880, output_tokens=220, cached_input_tokens=512)
USAGE = dataclasses.replace(
    USAGE, cost_usd=PRICING.cost(input_tokens=880, cached_input_tokens=512, output_tokens=220)
)
ADMISSION_NEED = worst_case(prompt_tokens=1_000, output_tokens=128, pricing=PRICING)
"""What admission holds for a run's first call (its smallest worst case)."""
LIMITS = dict(tokens=10**12, cost_usd=Decimal(10**6), window_seconds=1e9)
"""Limits checked on every reservation that never refuse; a window that cannot roll."""
HEADS = 32
"""Queue heads a pump round looks at (the one-value queue is read whole for them): the
operator's ``ADMIT_BATCH``."""


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    tenants: int
    active: int
    """``maxConcurrentRuns`` of each tenant."""
    runs: int
    """Runs of each tenant."""


@dataclasses.dataclass
class Tally:
    """What one scenario's runs did."""

    reserve_s: list[float] = dataclasses.field(default_factory=list)
    admitted_at: list[float] = dataclasses.field(default_factory=list)
    closed: int = 0
    refused: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    """Runs the storage refused (the one-value ledger's queue cap): tenant, why."""
    unavailable: int = 0
    waits: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)


class ByteCount:
    """Every message published to the ledger bucket's subjects, counted as it passes."""

    def __init__(self) -> None:
        self.messages = 0
        self.bytes = 0
        self.largest = 0

    async def on_message(self, msg: Any) -> None:
        size = len(msg.data)
        self.messages += 1
        self.bytes += size
        self.largest = max(self.largest, size)


async def retried(op: Any, tally: Tally) -> Any:
    """``op()`` until the ledger answers (a redelivery or the sweep would retry it)."""
    while True:
        try:
            return await op()
        except LedgerUnavailable:
            tally.unavailable += 1
            await asyncio.sleep(0.05)


async def run_turn(
    run: QueuedRun, tenant: str, worker: LedgerStore, operator: LedgerStore, tally: Tally, *,
    model_s: float, woken: asyncio.Event,
) -> None:  # fmt: skip
    """One admitted run's one turn, then its close."""
    ref = TurnRef(tenant, run.uid, run.namespace, run.name, 0)
    async with worker.turn_hold(ref) as hold:
        while True:
            start = time.perf_counter()
            answer = await retried(lambda: hold.reserve_call(NEED), tally)
            tally.reserve_s.append(time.perf_counter() - start)
            if isinstance(answer, Granted):
                break
            if not isinstance(answer, BudgetWait):
                raise RuntimeError(f"{run.uid}: refused {answer}")
            tally.waits += 1
            await asyncio.sleep(0.5)
        await asyncio.sleep(model_s)  # the scripted model's answer
        await hold.spend(USAGE)
        after = dataclasses.replace(kernel.initial_state(goal="scale"), usage=USAGE, turn=1)
        await retried(lambda: hold.settle(after), tally)
    summary = after.summary()
    await retried(lambda: operator.close_run(tenant, run.uid, summary, end=time.time()), tally)
    tally.closed += 1
    woken.set()


async def first_runs(store: LedgerStore, tenant: str) -> list[QueuedRun]:
    """The queue's first ``HEADS`` runs, as a pump round sees them: from the operator's index
    when the store keeps one, else by reading the one-value queue whole (as its pump did)."""
    queued = getattr(store, "queued", None)
    if queued is not None:
        return list(itertools.islice(await queued(tenant), HEADS))
    return list((await store.queue(tenant))[:HEADS])


async def admit_heads(
    operator: LedgerStore, tenant: str, heads: list[QueuedRun], limits: TenantLimits, tally: Tally
) -> list[QueuedRun]:
    """Admit the heads, FIFO, as the tree's operator does: all in one write where the ledger
    offers it (``admit_runs``), else one ``admit_run`` each; the runs admitted."""
    admit_runs = getattr(operator, "admit_runs", None)
    if admit_runs is not None:
        answers = await retried(
            lambda: admit_runs(tenant, [(h, ADMISSION_NEED) for h in heads], limits=limits),
            tally,
        )
        return [h for h, answer in zip(heads, answers, strict=False) if answer is None]
    admitted = []
    for head in heads:
        refusal = await retried(
            lambda h=head: operator.admit_run(tenant, h, limits=limits, need=ADMISSION_NEED),
            tally,
        )
        if refusal is not None:
            break
        admitted.append(head)
    return admitted


async def pump(
    tenant: str, scenario: Scenario, stores: list[LedgerStore], operator: LedgerStore,
    tally: Tally, *, model_s: float,
) -> None:  # fmt: skip
    """Admit the tenant's queue from the head until it is empty: a pump round admits what
    fits of the first ``HEADS`` runs, then dequeues them and starts their turns."""
    limits = TenantLimits(**LIMITS, max_concurrent_runs=scenario.active)  # type: ignore[arg-type]
    woken = asyncio.Event()
    turns: list[asyncio.Task[None]] = []
    while True:
        heads = await retried(lambda: first_runs(operator, tenant), tally)
        if not heads:
            break
        admitted = await admit_heads(operator, tenant, heads, limits, tally)
        now = time.perf_counter()
        await asyncio.gather(
            *(retried(lambda h=h: operator.dequeue(tenant, h.uid), tally) for h in admitted)
        )
        for head in admitted:
            tally.admitted_at.append(now)
            worker = stores[len(turns) % len(stores)]
            turns.append(
                asyncio.create_task(
                    run_turn(head, tenant, worker, operator, tally, model_s=model_s, woken=woken)
                )
            )
        if len(admitted) == len(heads):
            continue  # every head admitted: look at the next ones
        await woken.wait()  # a slot frees when a run closes
        woken.clear()
    for done in await asyncio.gather(*turns, return_exceptions=True):
        if isinstance(done, BaseException):
            tally.errors.append(repr(done))


async def enqueue_all(
    operator: LedgerStore, tenant: str, runs: list[QueuedRun], tally: Tally
) -> None:
    """Queue every run at once (as ``kubectl apply`` of them all does), in chunks the group
    commit carries; a run the storage refuses is counted, not queued."""

    async def one(run: QueuedRun) -> None:
        try:
            await retried(lambda: operator.enqueue(tenant, run), tally)
        except Exception as err:  # the one-value queue's QueueFull
            tally.refused.append((tenant, f"{type(err).__name__}: {err}"))

    for start in range(0, len(runs), 200):
        await asyncio.gather(*map(one, runs[start : start + 200]))


async def check(operator: LedgerStore, tenants: list[str], per_tenant: dict[str, int]) -> list[str]:
    """Exact usage, nothing held, nothing active, per tenant."""
    problems = []
    for tenant in tenants:
        book = await operator.read(tenant)
        ran = per_tenant[tenant]
        if book is None:
            problems.append(f"{tenant}: no ledger")
            continue
        want = (ran * USAGE.total_tokens, ran * USAGE.cost_usd)
        if (book.used_tokens, book.used_cost) != want:
            problems.append(f"{tenant}: used {book.used_tokens}/{book.used_cost}, runs {want}")
        if book.holds or book.active:
            problems.append(f"{tenant}: {len(book.holds)} holds, {len(book.active)} active")
    return problems


def layout_option(layout: str) -> dict[str, str]:
    """The operator store's ``layout`` (``AGENTRUN_LEDGER_LAYOUT``) where the tree has one: a
    revision before it (an A/B's A) has only the one-value ledger, and takes no such option."""
    return {"layout": layout} if "layout" in inspect.signature(LedgerStore).parameters else {}


async def run_scenario(
    server: natsserver.NatsServer, scenario: Scenario, args: argparse.Namespace
) -> dict[str, Any]:
    clients: list[Client] = [
        await nats.connect(**server.client_options(), name=f"scale-{i}")
        for i in range(args.workers + 2)
    ]
    try:
        operator = await LedgerStore.open(
            clients[0].jetstream(), bucket=BUCKET, **layout_option(args.layout)
        )
        workers = [
            await LedgerStore.open(c.jetstream(), bucket=BUCKET, create=False)
            for c in clients[1 : args.workers + 1]
        ]
        counter = ByteCount()
        await clients[-1].subscribe(f"$KV.{BUCKET}.>", cb=counter.on_message)
        await clients[-1].flush()
        label = uuid.uuid4().hex[:6]
        tenants = [f"{scenario.name}-{label}-{i}" for i in range(scenario.tenants)]
        tally = Tally()
        now = time.time()
        queues = {
            t: [
                QueuedRun(f"{t}-r{n}", NAMESPACE, f"r{n}", now + n / 1e4)
                for n in range(scenario.runs)
            ]
            for t in tenants
        }
        loads = [load_average()[0]]
        start = time.perf_counter()
        await asyncio.gather(*(enqueue_all(operator, t, queues[t], tally) for t in tenants))
        queued_s = time.perf_counter() - start
        stores = [operator, *workers]
        await asyncio.gather(
            *(
                pump(t, scenario, workers, operator, tally, model_s=args.model_ms / 1000)
                for t in tenants
            )
        )
        wall = time.perf_counter() - start
        loads.append(load_average()[0])
        await clients[-1].flush()
        admitted = len(tally.admitted_at)
        ran = {  # what each tenant ran: its runs less those the storage refused
            t: scenario.runs - sum(tenant == t for tenant, _ in tally.refused) for t in tenants
        }
        problems = tally.errors + await check(operator, tenants, ran)
        reservations = len(tally.reserve_s)
        span = (max(tally.admitted_at) - min(tally.admitted_at)) if admitted > 1 else 0.0
        conflicts = sum(store.conflicts for store in stores)
        return {
            "tenants": scenario.tenants,
            "runs_per_tenant": scenario.runs,
            "max_concurrent_runs": scenario.active,
            "runs_admitted": admitted,
            "runs_refused_by_storage": len(tally.refused),
            "refusals": sorted({why for _, why in tally.refused})[:3],
            "admissions_per_s": round(admitted / span, 1) if span else None,
            "queued_all_s": round(queued_s, 2),
            "wall_s": round(wall, 2),
            "reservations": reservations,
            "reserve_ms_p50": round(percentile(tally.reserve_s, 0.5) * 1000, 2),
            "reserve_ms_p99": round(percentile(tally.reserve_s, 0.99) * 1000, 2),
            "conflicts": conflicts,
            "conflicts_per_reservation": round(conflicts / max(1, reservations), 3),
            "ledger_writes_per_turn": round(counter.messages / max(1, admitted), 2),
            "ledger_bytes_per_turn": round(counter.bytes / max(1, admitted)),
            "ledger_largest_value_bytes": counter.largest,
            "budget_waits": tally.waits,
            "unavailable": tally.unavailable,
            "load_average": loads,
            "problems": problems,
        }
    finally:
        for client in clients:
            await client.close()


SCENARIOS = {
    "big": lambda a: Scenario("big", 1, a.active, a.active + a.queued),
    "cap": lambda a: Scenario("cap", 1, 500, 1_500),
    "many": lambda a: Scenario("many", 20, 500, 500),
}


def print_row(name: str, f: dict[str, Any], *, first: bool) -> None:
    if first:
        print(
            f"{'scenario':<8}{'runs':>8}{'refused':>9}{'adm/s':>8}{'reserve p50/p99 ms':>20}"
            f"{'cas/res':>9}{'writes/t':>10}{'bytes/t':>10}{'largest':>9}{'wall s':>8}  check"
        )
    runs = f["tenants"] * f["runs_per_tenant"]
    print(
        f"{name:<8}{runs:>8}{f['runs_refused_by_storage']:>9}{f['admissions_per_s'] or 0:>8.0f}"
        f"{f['reserve_ms_p50']:>11.1f} / {f['reserve_ms_p99']:<6.1f}"
        f"{f['conflicts_per_reservation']:>9.3f}{f['ledger_writes_per_turn']:>10.2f}"
        f"{f['ledger_bytes_per_turn']:>10}{f['ledger_largest_value_bytes']:>9}{f['wall_s']:>8.1f}"
        f"  {'FAILED' if f['problems'] else 'exact'}",
        flush=True,
    )


async def floor(server: natsserver.NatsServer, samples: int) -> dict[str, Any]:
    """What one ledger write costs at the least on this server, one writer, sequentially: a
    compare-and-set of one value (``kv.update``), and, where the store writes several values
    at once (this layout: a run's entry and its tenant's totals), an atomic batch of two."""
    client = await nats.connect(**server.client_options(), name="scale-floor")
    try:
        store = await LedgerStore.open(client.jetstream(), bucket=BUCKET)
        cas, batch = [], []
        revision = await store.kv.put("floor.one", b"x" * 400)
        for _ in range(samples):
            start = time.perf_counter()
            revision = await store.kv.update("floor.one", b"y" * 400, last=revision)
            cas.append(time.perf_counter() - start)
        put = getattr(store, "_put", None)
        if put is not None:
            from agentrun.ledger.cas import Write  # this layout only

            await put([Write("floor.a", b"a" * 400, 0), Write("floor.b", b"b" * 1000, 0)])
            for _ in range(samples):
                ra, rb = store._cache["floor.a"][0], store._cache["floor.b"][0]
                start = time.perf_counter()
                await put([Write("floor.a", b"a" * 400, ra), Write("floor.b", b"b" * 1000, rb)])
                batch.append(time.perf_counter() - start)
        found: dict[str, Any] = {
            "cas_ms_p50": round(percentile(cas, 0.5) * 1000, 2),
            "cas_ms_p99": round(percentile(cas, 0.99) * 1000, 2),
        }
        if batch:
            found["batch_of_two_ms_p50"] = round(percentile(batch, 0.5) * 1000, 2)
            found["batch_of_two_ms_p99"] = round(percentile(batch, 0.99) * 1000, 2)
        print(f"floor (one writer, sequential): {found}", flush=True)
        return found
    finally:
        await client.close()


async def bench(server: natsserver.NatsServer, args: argparse.Namespace) -> dict[str, Any]:
    found: dict[str, Any] = {"floor": await floor(server, args.floor_samples)}
    for index, name in enumerate(args.scenarios):
        scenario = SCENARIOS[name](args)
        found[name] = await run_scenario(server, scenario, args)
        print_row(name, found[name], first=index == 0)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default="big,cap,many")
    parser.add_argument(
        "--layout",
        choices=["split", "single"],
        default="split",
        help="the layout of the tenants' ledgers (AGENTRUN_LEDGER_LAYOUT; trees that have one)",
    )
    parser.add_argument("--active", type=int, default=2_000, help="big: maxConcurrentRuns")
    parser.add_argument("--queued", type=int, default=10_000, help="big: runs queued at first")
    parser.add_argument("--model-ms", type=float, default=20.0, help="the model's latency")
    parser.add_argument("--workers", type=int, default=3, help="worker stores (connections)")
    parser.add_argument("--quick", action="store_true", help="big with 400 active, 2,000 queued")
    parser.add_argument("--name", default="ledger_scale", help="results file name")
    parser.add_argument("--floor-samples", type=int, default=300, help="writes timed, each kind")
    args = parser.parse_args()
    args.scenarios = [s for s in args.scenarios.split(",") if s]
    if args.quick:
        args.active, args.queued = 400, 2_000

    workdir = Path(tempfile.mkdtemp(prefix="agentrun-bench-ledger-scale-"))
    launch = components.Launch(log_dir=workdir / "logs", die_with_parent=True)
    server = natsserver.start_nats_server(workdir / "nats", launch=launch)
    try:
        found = asyncio.run(bench(server, args))
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    floor_figures = found.pop("floor")
    problems = [f"{name}: {p}" for name, f in found.items() for p in f["problems"]]
    write_result(
        args.name,
        {
            "revision": tree_revision(),
            "model_ms": args.model_ms,
            "workers": args.workers,
            "floor": floor_figures,
            "scenarios": found,
            "exact": not problems,
        },
        quiet=True,
    )
    if problems:
        print("LEDGER INVARIANT BROKEN:", *problems, sep="\n  ", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
