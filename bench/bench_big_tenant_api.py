"""Tenants as big as their users, through the API server: ``--runs`` one-turn AgentRuns in
each of ``--tenants`` tenants, all queued at once, then admitted up to ``--active`` at a time
on the real local stack (API server, operator, workers, closed nats-server, scripted model),
with the ledger stored ``--layout`` (``split`` or the one-value ``single``).

Each tenant's one slot is first held by a run waiting for an approval (its gate), so that the
runs are all queued whatever the speed of ``kubectl create`` (chunks of ``CHUNK`` runs, two
requests at a time); then its ``maxConcurrentRuns`` is raised to ``--active`` and the gate
cancelled. The benchmark waits for every run to end and checks, exiting 1 otherwise: every run
ended ``completed`` (in the one-value layout, the runs its queue refused end
``checkpoint_failed`` and are counted as refused, nothing else is allowed), and each tenant's
ledger holds ``used`` equal to the sum of its runs' own usage exactly (tokens and USD), nothing
held, nothing active, totals equal to the sums of its entries.

Figures: the time to create the runs (runs/s the API server took), the most runs active and
queued at once (the AgentTenant's status), admissions/s (first to last ``startTime`` after
the gate opened, and runs ended per second from then), ledger writes and payload bytes per
turn (every message to the ledger bucket's subjects, counted by a subscriber; the largest),
API-server requests per run for agentrun's kinds by verb (``apiserver_request_total``), the
operator's and workers' RSS at the end, and the load average before, during (its highest) and
after. Reservation latency and compare-and-set retries are not exposed by the operator or the
workers (no metric): ``bench_ledger_scale.py`` measures them against the ledger alone.

    .venv/bin/python bench/bench_big_tenant_api.py [--runs 500] [--tenants 1] [--active 2000]
        [--layout split] [--workers 2] [--slots 64]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import sys
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import nats
import yaml
from harness import (
    BenchStack,
    api_requests,
    bench_stack,
    load_average,
    mock_add_scenarios,
    per_run,
    rss_mb,
    tree_revision,
    write_result,
)

from agentrun import kernel, protocol
from agentrun.ledger import LedgerStore
from agentrun_dev import demo, natsserver, stack

HERE = Path(__file__).parent
CHUNK = 250
"""AgentRuns per ``kubectl create`` (the API server creates each with a request of its own)."""
GOAL = "BIG-TENANT-ONE-TURN"
GATE_GOAL = "BIG-TENANT-GATE"
USAGE = {"prompt_tokens": 40, "completion_tokens": 6}
REFUSED = "checkpoint_failed"
"""How a run the one-value queue refused ends ("the run could not be queued")."""


def scenarios(latency_ms: int) -> str:
    """The runs' one turn (an answer after ``latency_ms``) and the gate's held call."""
    gate = [
        {"content": "Held.", "tool_calls": [{"id": "g1", "name": "calculate",
                                              "arguments": {"expression": "6*7"}}]},
        {"content": "Reviewed."},
    ]  # fmt: skip
    answer = {"content": "Done in one turn.", "usage": USAGE, "latency_ms": latency_ms}
    document = {
        "scenarios": [
            {"name": "big-tenant-gate", "match": {"goal": f"^{GATE_GOAL}"}, "turns": gate},
            {"name": "big-tenant-run", "match": {"goal": f"^{GOAL}"}, "turns": [answer]},
        ]
    }
    return yaml.safe_dump(document)


def run(name: str, goal: str, **spec: Any) -> dict[str, Any]:
    """An AgentRun of the priced ``mock`` model, no tools unless ``spec`` says."""
    body: dict[str, Any] = {"model": "mock", "goal": goal, "tools": [], **spec}
    return {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun",
            "metadata": {"name": name}, "spec": body}  # fmt: skip


def tenant(name: str, most: int) -> dict[str, Any]:
    return {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentTenant",
            "metadata": {"name": name},
            "spec": {"namespaces": [name], "maxConcurrentRuns": most}}  # fmt: skip


class LedgerTraffic:
    """Every message published to the ledger bucket's subjects, counted by a subscriber on a
    connection of its own (the dev server's admin identity), in a thread of its own."""

    def __init__(self, server: natsserver.NatsServer) -> None:
        self.messages = 0
        self.bytes = 0
        self.largest = 0
        self._server = server
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._count()), daemon=True)

    def __enter__(self) -> LedgerTraffic:
        self._thread.start()
        if not self._ready.wait(60):
            raise RuntimeError("the ledger subscriber did not start")
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(60)

    async def _count(self) -> None:
        nc = await nats.connect(**self._server.client_options())

        async def seen(msg: Any) -> None:
            self.messages += 1
            self.bytes += len(msg.data)
            self.largest = max(self.largest, len(msg.data))

        await nc.subscribe(protocol.kv_subject(protocol.LEDGER_BUCKET, ">"), cb=seen)
        await nc.flush()
        self._ready.set()
        while not self._stop.is_set():
            await asyncio.sleep(0.2)
        await nc.drain()


def create_runs(bench: BenchStack, namespaces: list[str], runs: int) -> float:
    """``kubectl create`` ``runs`` runs in each namespace, in chunks, two at a time; seconds."""
    jobs = [(ns, start) for ns in namespaces for start in range(0, runs, CHUNK)]

    def create(job: tuple[str, int]) -> None:
        namespace, start = job
        names = [f"run-{i:05d}" for i in range(start, min(start + CHUNK, runs))]
        body = {"apiVersion": "v1", "kind": "List",
                "items": [run(n, f"{GOAL} {n}") for n in names]}  # fmt: skip
        bench.kubectl("create", "-n", namespace, "-f", "-", input=yaml.safe_dump(body),
                      timeout=1800)  # fmt: skip

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(create, jobs))
    return time.monotonic() - started


def terminal_reasons(bench: BenchStack, namespace: str) -> dict[str, str]:
    """name → terminal reason ("" while not ended): light enough to poll at 10,000 runs."""
    out = bench.kubectl("get", "agentruns", "-n", namespace, "--no-headers", "-o",
                        "custom-columns=N:.metadata.name,R:.status.terminalReason",
                        timeout=600).stdout  # fmt: skip
    found = {}
    for line in out.splitlines():
        name, _, reason = line.partition(" ")
        found[name] = "" if reason.strip() == "<none>" else reason.strip()
    return found


def tenant_status(bench: BenchStack, name: str) -> dict[str, Any]:
    obj = json.loads(bench.kubectl("get", "agenttenant", name, "-o", "json", timeout=120).stdout)
    return dict(obj.get("status") or {})


class Keeper:
    """Starts the operator or a worker again if it exited, as their Deployments would (an API
    server slowed by thousands of runs can make the operator miss its Lease renewal, and it
    exits by design); counts the restarts; records the highest load average seen."""

    def __init__(self, bench: BenchStack, env: dict[str, str]) -> None:
        self.bench, self.env, self.restarts = bench, {**bench.env, **env}, 0
        self.highest_load = 0.0

    def check(self) -> None:
        self.highest_load = max(self.highest_load, load_average()[0])
        bench = self.bench
        if bench.operator is not None and not bench.operator.is_alive():
            self.restarts += 1
            print("bench: the operator exited; starting it again", file=sys.stderr)
            bench.operator = stack.start_operator(self.env, launch=bench.launch)
        for i, worker in enumerate(bench.workers):
            if not worker.is_alive():
                self.restarts += 1
                print(f"bench: {worker.name} exited; starting it again", file=sys.stderr)
                bench.workers[i] = stack.start_worker(i + 1, env=self.env, launch=bench.launch)


def open_gates(bench: BenchStack, keeper: Keeper, namespaces: list[str], active: int) -> None:
    """Hold each tenant's one slot with a run waiting for an approval."""
    for ns in namespaces:
        bench.kubectl("create", "namespace", ns)
        bench.kubectl("apply", "-f", "-", input=yaml.safe_dump(tenant(ns, 1)))
        gate = run("gate", f"{GATE_GOAL} gate", tools=["calculate"],
                   approval={"tools": ["calculate"]})  # fmt: skip
        bench.apply([gate], namespace=ns)
    for ns in namespaces:
        while bench.kubectl("get", "agentrun", "gate", "-n", ns, "-o",
                            "jsonpath={.status.phase}").stdout != "AwaitingApproval":  # fmt: skip
            keeper.check()
            time.sleep(1)


def poll_seconds(total: int) -> float:
    """Seconds between polls: each lists every run, so fewer at 10,000 runs (10 s) than at
    500 (3 s)."""
    return max(3.0, total / 1000)


def wait_queued(bench: BenchStack, keeper: Keeper, namespaces: list[str], runs: int) -> int:
    """Wait until every run of every tenant is queued or ended (refused); the most queued."""
    end = time.monotonic() + max(600, runs * len(namespaces) / 5)
    while True:
        keeper.check()
        queued = [int(tenant_status(bench, ns).get("queuedRuns") or 0) for ns in namespaces]
        ended = [sum(bool(r) for n, r in terminal_reasons(bench, ns).items() if n != "gate")
                 for ns in namespaces]  # fmt: skip
        if all(q + e == runs for q, e in zip(queued, ended, strict=True)):
            return max(queued)
        if time.monotonic() > end:
            raise TimeoutError(f"queued {queued}, ended {ended} of {runs} each")
        time.sleep(poll_seconds(runs * len(namespaces)))


def release(bench: BenchStack, namespaces: list[str], active: int) -> None:
    """Raise each tenant's ``maxConcurrentRuns`` to ``active`` and cancel its gate."""
    for ns in namespaces:
        bench.kubectl("apply", "-f", "-", input=yaml.safe_dump(tenant(ns, active)))
        bench.kubectl("annotate", "agentrun", "gate", "-n", ns, "agentrun.dev/cancel=true")


def wait_ended(
    bench: BenchStack, keeper: Keeper, namespaces: list[str], runs: int
) -> dict[str, int]:
    """Poll until every run ended; the most runs active and queued at once in one tenant."""
    most = {"activeRuns": 0, "queuedRuns": 0}
    end = time.monotonic() + max(1800, 2 * runs * len(namespaces))
    while True:
        keeper.check()
        for ns in namespaces:
            status = tenant_status(bench, ns)
            for key in most:
                most[key] = max(most[key], int(status.get(key) or 0))
        ended = sum(sum(bool(r) for r in terminal_reasons(bench, ns).values()) for ns in namespaces)
        if ended == (runs + 1) * len(namespaces):
            return most
        if time.monotonic() > end:
            raise TimeoutError(f"{ended} of {(runs + 1) * len(namespaces)} runs ended")
        time.sleep(poll_seconds(runs * len(namespaces)))


def run_sums(items: list[dict[str, Any]]) -> tuple[int, Decimal]:
    """Σ of the runs' own usage (tokens, USD, exact: priced again from each status's tokens at
    the demo model's prices; each must round to the cost its status shows)."""
    pricing = kernel.Pricing(Decimal("2.50"), Decimal("1.25"), Decimal("10.00"))
    tokens, cost = 0, Decimal(0)
    for item in items:
        usage = (item.get("status") or {}).get("usage") or {}
        tokens += usage.get("inputTokens", 0) + usage.get("outputTokens", 0)
        exact = pricing.cost(input_tokens=usage.get("inputTokens", 0),
                             cached_input_tokens=usage.get("cachedInputTokens", 0),
                             output_tokens=usage.get("outputTokens", 0))  # fmt: skip
        if f"{exact:.6f}" != f"{Decimal(usage.get('costUSD') or '0'):.6f}":
            raise AssertionError(f"{item['metadata']['name']}: {exact} against {usage}")
        cost += exact
    return tokens, cost


def read_ledger(server: natsserver.NatsServer, tenants: list[str]) -> dict[str, Any]:
    """Each tenant's whole ledger from JetStream KV: used tokens and USD, what is still
    active, held or abandoned, and where its totals differ from its entries."""

    async def read() -> dict[str, Any]:
        nc = await nats.connect(**server.client_options())
        try:
            store = await LedgerStore.open(nc.jetstream(), create=False)
            found = {}
            for name in tenants:
                book = await store.read(name)
                if book is None:
                    raise AssertionError(f"tenant {name} has no ledger")
                found[name] = {
                    "used_tokens": book.used_tokens, "used_cost": book.used_cost,
                    "active_runs": book.active_runs, "holds": len(book.holds),
                    "abandoned_tokens": book.abandoned_tokens,
                    "mismatch": book.totals_mismatch(),
                }  # fmt: skip
            return found
        finally:
            await nc.close()

    return asyncio.run(read())


def check_tenant(
    bench: BenchStack, namespace: str, ledger: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    """One tenant's verdict: its runs' reasons, its ledger against Σ runs, its admissions."""
    listed = bench.kubectl("get", "agentruns", "-n", namespace, "-o", "json", timeout=1200)
    every = json.loads(listed.stdout)["items"]  # the gate's one call is the tenant's too
    items = [i for i in every if i["metadata"]["name"] != "gate"]
    gate = next(i for i in every if i["metadata"]["name"] == "gate")
    reasons: dict[str, int] = {}
    for item in items:
        reason = (item.get("status") or {}).get("terminalReason", "")
        reasons[reason] = reasons.get(reason, 0) + 1
    allowed = {"completed"} | ({REFUSED} if args.layout == "single" else set())
    tokens, cost = run_sums(every)
    exact = (ledger["used_tokens"], ledger["used_cost"]) == (tokens, cost) and (
        ledger["active_runs"],
        ledger["holds"],
        ledger["abandoned_tokens"],
        ledger["mismatch"],
    ) == (0, 0, 0, [])
    starts = sorted(s for i in items if (s := (i.get("status") or {}).get("startTime")))
    return {
        "runs": len(items),
        "reasons": reasons,
        "reasons_ok": set(reasons) <= allowed
        and len(items) == args.runs
        and (gate.get("status") or {}).get("terminalReason") == "cancelled",
        "refused": reasons.get(REFUSED, 0),
        "ledger_exact": exact,
        "used_tokens": tokens,
        "used_cost_usd": str(cost),
        "ledger": {**ledger, "used_cost": str(ledger["used_cost"])},
        "first_start": starts[0] if starts else None,
        "last_start": starts[-1] if starts else None,
    }


def rate(count: int, stamps: list[str]) -> float | None:
    """``count`` over the seconds from the first to the last RFC 3339 stamp (whole seconds:
    one more is counted, so a burst within one second is not infinite)."""
    if not stamps:
        return None
    seconds = [time.mktime(time.strptime(s, "%Y-%m-%dT%H:%M:%SZ")) for s in stamps]
    return round(count / (max(seconds) - min(seconds) + 1), 1)


def service_env(args: argparse.Namespace) -> dict[str, str]:
    """The operator's and workers' settings for this benchmark."""
    return {
        "AGENTRUN_LEDGER_LAYOUT": args.layout,
        "AGENTRUN_WORKER_CONCURRENCY": str(args.slots),
        # the chart's Lease timings: the dev stack's 6 s renewal deadline is short for an API
        # server busy with 10,000 runs on a shared machine
        "AGENTRUN_LEASE_DURATION": "15",
        "AGENTRUN_LEASE_RENEW_DEADLINE": "10",
    }


def drive(
    bench: BenchStack, keeper: Keeper, namespaces: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    """Create every run behind the gates, wait until all are queued, open the gates, wait
    until all ended; what each phase took and the ledger traffic of the whole."""
    open_gates(bench, keeper, namespaces, args.active)
    requests_before = api_requests(bench)
    with LedgerTraffic(bench.nats) as traffic:
        created_s = create_runs(bench, namespaces, args.runs)
        most_queued = wait_queued(bench, keeper, namespaces, args.runs)
        load_queued = load_average()
        opened = time.monotonic()
        opened_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        release(bench, namespaces, args.active)
        most = wait_ended(bench, keeper, namespaces, args.runs)
        drained_s = time.monotonic() - opened
        time.sleep(3)  # the last closes' ledger writes
        written = (traffic.messages, traffic.bytes, traffic.largest)
    total = args.runs * len(namespaces)
    return {
        "created_s": round(created_s, 1),
        "created_per_s": round(total / created_s, 1),
        "most_queued": max(most_queued, most["queuedRuns"]),
        "most_active": most["activeRuns"],
        "gate_opened": opened_at,
        "drained_s": round(drained_s, 1),
        "ended_per_s": round(total / drained_s, 1),
        "ledger": written,
        "load_all_queued": load_queued,
        "api_requests_per_run": per_run(requests_before, api_requests(bench), total),
    }


def summary(
    args: argparse.Namespace, phases: dict[str, Any], tenants: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The record's figures from what the phases measured and each tenant's verdict."""
    completed = sum(t["reasons"].get("completed", 0) for t in tenants.values())
    starts = [s for t in tenants.values() for s in (t["first_start"], t["last_start"]) if s]
    messages, written, largest = phases.pop("ledger")
    return {
        "revision": tree_revision(),
        "layout": args.layout,
        "tenants": args.tenants,
        "runs_per_tenant": args.runs,
        "max_concurrent_runs": args.active,
        "workers": args.workers,
        "slots_per_worker": args.slots,
        "model_latency_ms": args.latency_ms,
        **phases,
        "admissions": {"first": min(starts, default=None), "last": max(starts, default=None)},
        "admissions_per_s": rate(completed, starts),
        "completed": completed,
        "refused": sum(t["refused"] for t in tenants.values()),
        "ledger_writes_per_turn": round(messages / max(completed, 1), 2),
        "ledger_bytes_per_turn": round(written / max(completed, 1)),
        "ledger_largest_message_bytes": largest,
        "reservation": "not exposed by the operator or workers (bench_ledger_scale.py)",
        "tenant_results": tenants,
        "ok": all(t["reasons_ok"] and t["ledger_exact"] for t in tenants.values()),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """The whole benchmark on a stack of its own: the record (see the module's docstring)."""
    env = service_env(args)
    namespaces = [f"big-{i:02d}" for i in range(args.tenants)]
    with bench_stack(HERE / "scenarios.yaml") as bench:
        base = stack.mockllm_url(bench.mock)
        model = demo.mock_model(base, max_output_tokens=1000, context_window=32000)
        bench.kubectl("apply", "-f", "-", input=yaml.safe_dump(model))
        mock_add_scenarios(base, scenarios(args.latency_ms))
        bench.start_services(workers=args.workers, extra_env=env)
        keeper = Keeper(bench, env)
        load_before = load_average()
        phases = drive(bench, keeper, namespaces, args)
        load_queued = phases.pop("load_all_queued")
        ledgers = read_ledger(bench.nats, namespaces)
        tenants = {ns: check_tenant(bench, ns, ledgers[ns], args) for ns in namespaces}
        rss = {w.name: round(rss_mb(w), 1) for w in [bench.operator, *bench.workers] if w}
        record = summary(args, phases, tenants)
    record["rss_mb_at_end"] = rss
    record["component_restarts"] = keeper.restarts
    record["load_average"] = {
        "before": load_before,
        "all_queued": load_queued,
        "highest_1min": keeper.highest_load,
        "after": load_average(),
    }
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=500, help="runs of each tenant")
    parser.add_argument("--tenants", type=int, default=1)
    parser.add_argument("--active", type=int, default=2000, help="maxConcurrentRuns")
    parser.add_argument("--layout", choices=("split", "single"), default="split")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--slots", type=int, default=64, help="AGENTRUN_WORKER_CONCURRENCY")
    parser.add_argument("--latency-ms", type=int, default=200, help="the model's answer time")
    parser.add_argument("--name", default="big-tenant-api", help="the result file's name")
    args = parser.parse_args()
    record = measure(args)
    write_result(args.name, record)
    if not record["ok"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
