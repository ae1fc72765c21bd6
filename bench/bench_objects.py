"""The operator with many AgentRuns present: memory, and whether admission and status slow down
with the number of finished runs.

At each size of ``--sizes`` (1,000, 10,000 and 50,000 by default; each adds runs to the ones
before) the runs present are finished AgentRuns as a long-lived cluster holds them. They are
made quickly rather than run: the operator is stopped, each is created from a template run
that ran to its end on this stack (its spec, labels, the operator's annotations) and its
status set to the template's with one PATCH, then the operator starts on them as after a
restart. Then, per size:

- the operator's start-up: seconds from its start until its CPU stays below 5 % for 3 s, and
  the API requests it made meanwhile (an AgentRun already handled needs no write);
- operator and worker RSS once settled (MiB);
- ``kubectl apply`` → first model request of ``--probe`` runs applied one at a time, 0.5 s
  apart (p50/p99; the time counts from ``kubectl apply`` returning);
- ``--bulk`` one-turn runs created at once (concurrent POSTs): created → first model request
  p50/p99 and the admission rate (runs over first POST → last first request), the runs' end
  event → terminal status seen by a watch p50/p99 (the status path), the API requests per
  run of the bulk by verb, and each process's cores busy meanwhile (CPU seconds over the
  bulk's wall time: which process bounds admission).

Targets (issue 24): operator RSS ≤ 250 MB and a worker ≤ 150 MB with 50,000 present; apply →
first request p50 ≤ 100 ms, p99 ≤ 400 ms; admission and status figures flat across sizes.

    cd bench && ../.venv/bin/python bench_objects.py [--sizes 1000,10000,50000] [--probe 20]
        [--bulk 200] [--memory FOLDER [--trace FRAMES]] [--gc FOLDER]

``--memory FOLDER`` runs the operator under the memory probe and records, at each size once it
settled, where its RSS is (``operator_memory``: by kind of mapping, pymalloc's arenas);
``--trace FRAMES`` adds what Python objects it holds by allocating line (tracemalloc: several
times slower, and its own memory counts in the RSS, so not a figure to compare).

``--gc FOLDER`` runs the operator and the workers under the collector probe: the bulk's row
adds each process's cyclic-collector passes by generation and their CPU ms per run
(``gc_per_run``).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil
from bench_fairness import arrivals
from figures import wait_figures
from harness import (
    BenchStack,
    agent_run,
    api_requests,
    bench_stack,
    cpu_seconds,
    cpu_used,
    load_average,
    per_run,
    read_events,
    rss_mb,
    tree_revision,
    without_codes,
    write_result,
)
from kubernetes_asyncio import client, watch

from agentrun import kube
from agentrun.operator.runs.keys import ADMITTED_UID_ANNOTATION
from agentrun_dev import components, stack

HERE = Path(__file__).parent
GROUP, VERSION, PLURAL = "agentrun.dev", "v1alpha1", "agentruns"
NAMESPACE = "default"
SCENARIOS = """
scenarios:
  - name: objects
    match: {goal: "^OBJECTS "}
    turns:
      - content: done
        usage: {prompt_tokens: 20, completion_tokens: 2}
"""
CONCURRENCY = 48
"""API requests in flight at once while the runs present are made."""


def run_object(name: str, *, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A one-turn AgentRun of the ``objects`` scenario."""
    obj = agent_run(name, f"OBJECTS {name}", max_steps=1, tools=())
    if labels:
        obj["metadata"]["labels"] = labels
    return obj


def template_of(bench: BenchStack) -> dict[str, Any]:
    """A run that ran to its end on this stack, as the API server holds it."""
    bench.apply([run_object("objects-template")], namespace=NAMESPACE)
    bench.wait_all_terminal(1, timeout=120, names=["objects-template"])
    out = bench.kubectl("get", "agentrun", "objects-template", "-n", NAMESPACE, "-o", "json")
    return dict(json.loads(out.stdout))


def present_copy(template: dict[str, Any], name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The object to create and the status to set for a finished run named ``name``."""
    meta = template["metadata"]
    body = {
        "apiVersion": template["apiVersion"],
        "kind": template["kind"],
        "metadata": {
            "name": name,
            "labels": dict(meta.get("labels") or {}),
            "annotations": {
                k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith("kopf.")
            },
        },
        "spec": copy.deepcopy(template["spec"]),
    }
    return body, {"status": copy.deepcopy(template["status"])}


async def make_present(
    kubeconfig: str, template: dict[str, Any], names: Sequence[str]
) -> dict[str, float]:
    """Create the finished runs ``names`` (``CONCURRENCY`` at once): each as the template,
    then its admission record (``agentrun.dev/admitted-uid``: its own uid, as the operator
    wrote it when it admitted the run), then its status; seconds taken."""
    api = await kube.api_client(config_file=kubeconfig, trust_env=False)
    objects = client.CustomObjectsApi(api)
    gate = asyncio.Semaphore(CONCURRENCY)
    merge = "application/merge-patch+json"

    async def one(name: str) -> None:
        body, status = present_copy(template, name)
        async with gate:
            made = await objects.create_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, PLURAL, body
            )
            uid = made["metadata"]["uid"]
            record = {"metadata": {"annotations": {ADMITTED_UID_ANNOTATION: uid}}}
            await objects.patch_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, PLURAL, name, record, _content_type=merge
            )
            await objects.patch_namespaced_custom_object_status(
                GROUP, VERSION, NAMESPACE, PLURAL, name, status, _content_type=merge
            )

    started = time.monotonic()
    try:
        await asyncio.gather(*(one(n) for n in names))
    finally:
        await api.close()
    return {"seconds": round(time.monotonic() - started, 1)}


def settle(pid: int, *, quiet_percent: float = 5.0, quiet_for: float = 3.0) -> float:
    """Seconds from now until process ``pid`` went quiet: the start of its first stretch of
    ``quiet_for`` seconds in a row under ``quiet_percent`` of a core (sampled every 0.5 s; the
    stretch itself not counted). Raises ``TimeoutError`` after 30 minutes without one."""
    proc = psutil.Process(pid)
    started = time.monotonic()
    quiet_since = None
    last = sum(proc.cpu_times()[:2])
    while True:
        time.sleep(0.5)
        now_cpu = sum(proc.cpu_times()[:2])
        busy = (now_cpu - last) / 0.5 * 100
        last = now_cpu
        if busy < quiet_percent:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= quiet_for:
                return quiet_since - started
        else:
            quiet_since = None
        if time.monotonic() - started > 1800:
            raise TimeoutError("the operator did not settle within 30 minutes")


class OperatorDied(Exception):
    """The operator exited while starting on the runs present."""

    def __init__(self, size: int, seconds: float, log_tail: str) -> None:
        super().__init__(f"the operator exited {seconds:.0f} s after starting on {size} runs")
        self.size, self.seconds, self.log_tail = size, seconds, log_tail


def restart_operator(
    bench: BenchStack, generation: int, *, memory: str = "", frames: int = 0
) -> components.Component:
    """Start an operator (the ``generation``-th) on the stack's environment; with ``memory``
    (a folder), under the memory probe (``probes/sitecustomize.py``), tracing allocations
    with ``frames`` frames of their stacks (0: not tracing)."""
    env = dict(bench.env)
    if memory:
        env |= {"PYTHONPATH": str(HERE / "probes"), "AGENTRUN_MEMORY_PROBE": memory}
        env["AGENTRUN_MEMORY_FRAMES"] = str(frames)
    bench.operator = stack.start_operator(env, launch=bench.launch, name=f"operator-{generation}")
    return bench.operator


def memory_dump(operator: components.Component, folder: str) -> dict[str, Any]:
    """Ask the operator under the memory probe what it holds (``SIGUSR2``) and read the answer
    (``rss_mib``, ``traced_mib``, ``peak_mib``, ``top``). Raises ``TimeoutError`` if none is
    written within 120 s."""
    path = Path(folder) / f"operator-{operator.record.pid}.memory.json"
    path.unlink(missing_ok=True)
    os.kill(operator.record.pid, signal.SIGUSR2)
    deadline = time.monotonic() + 120
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the operator wrote no {path.name} within 120 s")
        time.sleep(0.5)
    return dict(json.loads(path.read_text()))


def probe(bench: BenchStack, size: int, count: int) -> dict[str, Any]:
    """``kubectl apply`` → first model request of ``count`` runs applied 0.5 s apart:
    ``figures.wait_figures`` (``p50_s``, ``p99_s``, ``max_s``: seconds; ``runs``). Raises
    ``TimeoutError`` if they do not all end within 300 s."""
    applied: dict[str, float] = {}
    for i in range(count):
        name = f"probe-{size}-{i}"
        bench.apply([run_object(name)], namespace=NAMESPACE)
        applied[name] = time.time()
        time.sleep(0.5)
    bench.wait_all_terminal(count, timeout=300, names=list(applied))
    seen = arrivals(bench.env["AGENTRUN_BENCH_MODEL_URL"], "objects")
    return wait_figures([seen[n] - applied[n] for n in applied])


async def create_bulk(kubeconfig: str, names: Sequence[str], label: str) -> dict[str, float]:
    """POST the runs ``names`` at once (``CONCURRENCY`` in flight); each one's creation time
    (epoch seconds, when its POST returned)."""
    api = await kube.api_client(config_file=kubeconfig, trust_env=False)
    objects = client.CustomObjectsApi(api)
    gate = asyncio.Semaphore(CONCURRENCY)
    created: dict[str, float] = {}

    async def one(name: str) -> None:
        async with gate:
            body = run_object(name, labels={"bench-bulk": label})
            await objects.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body)
            created[name] = time.time()

    try:
        await asyncio.gather(*(one(n) for n in names))
    finally:
        await api.close()
    return created


async def watch_terminal(
    kubeconfig: str, label: str, count: int, ready: asyncio.Event, *, timeout: float
) -> dict[str, float]:
    """When a watch saw each run labelled ``bench-bulk=label`` with a terminal reason (epoch
    seconds), until ``count`` did."""
    api = await kube.api_client(config_file=kubeconfig, trust_env=False)
    objects = client.CustomObjectsApi(api)
    seen: dict[str, float] = {}
    try:
        async with asyncio.timeout(timeout):
            while len(seen) < count:
                stream = watch.Watch().stream(
                    objects.list_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    NAMESPACE,
                    PLURAL,
                    label_selector=f"bench-bulk={label}",
                    timeout_seconds=60,
                )
                ready.set()
                async for change in stream:
                    obj = change["object"]
                    if (obj.get("status") or {}).get("terminalReason"):
                        seen.setdefault(obj["metadata"]["name"], time.time())
                        if len(seen) >= count:
                            break
    finally:
        await api.close()
    return seen


def collector_totals(folder: str) -> dict[int, list[list[float]]]:
    """The collector probe's totals in ``folder`` by pid: per generation, [passes, CPU
    seconds] (``probes/sitecustomize.py``)."""
    found: dict[int, list[list[float]]] = {}
    for path in Path(folder).glob("*.gc.json"):
        record = json.loads(path.read_text())
        found[record["pid"]] = [record["passes"][str(g)] for g in range(3)]
    return found


def collector_per_run(
    before: dict[int, list[list[float]]],
    after: dict[int, list[list[float]]],
    pids: dict[str, int],
    runs: int,
) -> dict[str, dict[str, float]]:
    """Each probed process's collector passes by generation (``gen0``…) and their CPU ms
    (``cpu_ms``), from two ``collector_totals`` readings, per run."""
    out: dict[str, dict[str, float]] = {}
    for name, pid in pids.items():
        if pid not in after:
            continue
        then = before.get(pid, [[0, 0.0]] * 3)
        moved = [
            [a - b for a, b in zip(now, old, strict=True)]
            for now, old in zip(after[pid], then, strict=True)
        ]
        row = {f"gen{g}": round(moved[g][0] / runs, 4) for g in range(3)}
        row["cpu_ms"] = round(1000 * sum(m[1] for m in moved) / runs, 3)
        out[name] = row
    return out


def bulk(bench: BenchStack, size: int, count: int, *, gc_folder: str = "") -> dict[str, Any]:
    """``count`` one-turn runs created at once: ``created_to_first_request`` and
    ``end_event_to_terminal_status`` (``wait_figures``, seconds), ``admitted_per_second``
    (runs/s, first POST → last first request), ``cores_busy`` (each process's CPU seconds
    over the bulk's wall time), ``api_requests_per_run`` (by verb and resource) and
    ``api_answers_per_run`` (by response code too: a write refused, 409 or 404, shows apart
    from one that landed), ``cpu_ms_per_run`` (each process's CPU ms over the bulk, per run;
    less moved by other work on the machine than the rate), with ``gc_folder`` ``gc_per_run``
    (``collector_per_run``). Raises ``TimeoutError`` if the watch does not see them all end
    within 600 s."""
    names = [f"bulk-{size}-{i}" for i in range(count)]
    label = str(size)
    kubeconfig = str(bench.cluster.kubeconfig)
    before = api_requests(bench, by_code=True)
    pids = bench.processes()
    gc_before = collector_totals(gc_folder) if gc_folder else {}
    cpu_before, wall_before = cpu_seconds(pids), time.monotonic()

    async def both() -> tuple[dict[str, float], dict[str, float]]:
        ready = asyncio.Event()
        watcher = asyncio.create_task(watch_terminal(kubeconfig, label, count, ready, timeout=600))
        await ready.wait()
        created = await create_bulk(kubeconfig, names, label)
        return created, await watcher

    created, terminal = asyncio.run(both())
    used = cpu_used(cpu_before, cpu_seconds(pids))
    cores = {name: round(cpu / (time.monotonic() - wall_before), 2) for name, cpu in used.items()}
    collector = (
        collector_per_run(gc_before, collector_totals(gc_folder), pids, count)
        if gc_folder
        else None
    )
    time.sleep(6)  # trailing writes (the status writer's interval is 5 s)
    after = api_requests(bench, by_code=True)
    seen = arrivals(bench.env["AGENTRUN_BENCH_MODEL_URL"], "objects")
    ends = {
        name: next(stamp for event, stamp in events if event.phase.is_terminal)
        for name, events in read_events(bench.nats, NAMESPACE, names).items()
    }
    first_post = min(created.values())
    span = max(seen[n] for n in names) - first_post
    return {
        "runs": count,
        "created_to_first_request": wait_figures([seen[n] - created[n] for n in names]),
        "admitted_per_second": round(count / span, 1) if span > 0 else None,
        "cores_busy": cores,
        "cpu_ms_per_run": {name: round(1000 * cpu / count, 3) for name, cpu in used.items()},
        **({"gc_per_run": collector} if collector is not None else {}),
        "end_event_to_terminal_status": wait_figures([terminal[n] - ends[n] for n in names]),
        "api_requests_per_run": per_run(without_codes(before), without_codes(after), count),
        "api_answers_per_run": per_run(before, after, count),
    }


def measure_size(
    bench: BenchStack,
    size: int,
    present: int,
    template: dict[str, Any],
    args: argparse.Namespace,
    generation: int,
) -> dict[str, Any]:
    """Bring the finished runs present to ``size`` (the operator stopped meanwhile, so none is
    admitted before its status says it ended), start the operator on them, measure: the
    row's keys are ``present``, ``made_seconds``, ``operator_settled_seconds`` (from its metrics
    port answering until its CPU went quiet), ``startup_api_requests`` (counts by verb and
    resource), ``operator_rss_mb``/``operator_rss_mb_after``/``worker_rss_mb`` (MiB),
    ``apply_to_first_request`` (``probe``), ``bulk`` (``bulk``), ``load_average``. Raises
    ``OperatorDied`` when the operator exited while starting."""
    names = [f"done-{i}" for i in range(present, size)]
    if bench.operator is not None:
        components.stop_component(bench.operator)
        bench.operator = None
    made = asyncio.run(make_present(str(bench.cluster.kubeconfig), template, names))
    print(f"objects: {size}: {len(names)} finished runs made in {made['seconds']} s", flush=True)
    before = api_requests(bench)
    operator = restart_operator(bench, generation, memory=args.memory, frames=args.trace)
    settled = settle(operator.record.pid)
    if not operator.is_alive():
        tail = operator.spec.log_path.read_text().splitlines()[-3:]
        raise OperatorDied(size, settled, "\n".join(tail))
    startup = api_requests(bench)
    figures: dict[str, Any] = {
        "present": size,
        "made_seconds": made["seconds"],
        "operator_settled_seconds": round(settled, 1),
        "startup_api_requests": {
            k: startup.get(k, 0) - before.get(k, 0)
            for k in sorted(set(startup) | set(before))
            if startup.get(k, 0) != before.get(k, 0)
        },
        "operator_rss_mb": round(rss_mb(operator), 1),
        "worker_rss_mb": round(max(rss_mb(w) for w in bench.workers), 1),
        "load_average": load_average(),
    }
    rss = figures["operator_rss_mb"]
    print(f"objects: {size}: operator settled in {settled:.1f} s, rss {rss} MiB", flush=True)
    if args.memory:
        figures["operator_memory"] = held = memory_dump(operator, args.memory)
        print(
            f"objects: {size}: rss {held['rss_mib']} MiB by mapping {held['mappings']}; "
            f"pymalloc {held['pymalloc']}"
        )
        if "traced_mib" in held:
            print(f"objects: {size}: traced {held['traced_mib']} MiB, at most {held['peak_mib']}")
            for row in held["top"][:15]:
                print(f"  {row['mib']:8.2f} MiB {row['blocks']:9d} blocks  {row['where']}")
    figures["apply_to_first_request"] = probe(bench, size, args.probe)
    figures["bulk"] = bulk(bench, size, args.bulk, gc_folder=args.gc)
    figures["operator_rss_mb_after"] = round(rss_mb(operator), 1)
    return figures


def flatness(
    rows: Sequence[dict[str, Any]], pick: Callable[[dict[str, Any]], float | None]
) -> float:
    """The largest size's figure over the smallest's (NaN with no sizes measured, or a figure
    missing)."""
    if not rows:
        return float("nan")
    first, last = pick(rows[0]), pick(rows[-1])
    if first is None or last is None:
        return float("nan")
    return round(last / first, 2) if first else float("nan")


def _print_row(row: dict[str, Any]) -> None:
    first, bulk_row = row["apply_to_first_request"], row["bulk"]
    print(
        f"objects: {row['present']}: rss operator {row['operator_rss_mb']} → "
        f"{row['operator_rss_mb_after']} MiB, worker {row['worker_rss_mb']} MiB; apply → first "
        f"request p50 {first['p50_s']} s, p99 {first['p99_s']} s; bulk "
        f"{bulk_row['admitted_per_second']} runs/s, created → first request p50 "
        f"{bulk_row['created_to_first_request']['p50_s']} s; end → status p50 "
        f"{bulk_row['end_event_to_terminal_status']['p50_s']} s; start-up requests "
        f"{row['startup_api_requests']}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1000,10000,50000")
    parser.add_argument("--probe", type=int, default=20)
    parser.add_argument("--bulk", type=int, default=200)
    parser.add_argument(
        "--memory",
        default="",
        metavar="FOLDER",
        help="record, once the operator settled, its memory by kind (mappings, pymalloc)",
    )
    parser.add_argument(
        "--trace",
        type=int,
        default=0,
        metavar="FRAMES",
        help="with --memory: trace its allocations (slower, and costs memory) with FRAMES frames",
    )
    parser.add_argument(
        "--gc",
        default="",
        metavar="FOLDER",
        help="count the cyclic collector's passes and CPU in the operator and workers",
    )
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    scenarios = HERE / "objects-scenarios.yaml"
    scenarios.write_text(SCENARIOS)
    rows: list[dict[str, Any]] = []
    died: dict[str, Any] | None = None
    try:
        with bench_stack(scenarios) as bench:
            bench.env["AGENTRUN_BENCH_MODEL_URL"] = stack.mockllm_url(bench.mock)
            if args.gc:
                Path(args.gc).mkdir(parents=True, exist_ok=True)
                bench.env |= {"PYTHONPATH": str(HERE / "probes"), "AGENTRUN_GC_PROBE": args.gc}
            bench.start_services(workers=1)
            template = template_of(bench)
            present = 0
            for generation, size in enumerate(sizes, start=1):
                try:
                    rows.append(measure_size(bench, size, present, template, args, generation))
                except OperatorDied as err:
                    died = {"present": err.size, "after_seconds": round(err.seconds, 1)}
                    died["log_tail"] = err.log_tail
                    print(f"objects: {err}:\n{err.log_tail}", flush=True)
                    break
                present = size
                _print_row(rows[-1])
    finally:  # what was measured is written even when a later size failed
        scenarios.unlink(missing_ok=True)
        write_result("objects", _summary(sizes, rows, died))


def _summary(
    sizes: Sequence[int], rows: Sequence[dict[str, Any]], died: dict[str, Any] | None
) -> dict[str, Any]:
    return {
        "tree": tree_revision(),
        "sizes": list(sizes),
        "rows": list(rows),
        "largest_over_smallest": {
            "apply_to_first_request_p50": flatness(
                rows, lambda r: r["apply_to_first_request"]["p50_s"]
            ),
            "created_to_first_request_p50": flatness(
                rows, lambda r: r["bulk"]["created_to_first_request"]["p50_s"]
            ),
            "admitted_per_second": flatness(rows, lambda r: r["bulk"]["admitted_per_second"]),
            "end_event_to_terminal_status_p50": flatness(
                rows, lambda r: r["bulk"]["end_event_to_terminal_status"]["p50_s"]
            ),
        },
        "operator_died": died,
        "targets": {
            "operator_rss_mb_at_50000": "<= 250",
            "worker_rss_mb": "<= 150",
            "apply_to_first_request": "p50 <= 0.1 s, p99 <= 0.4 s",
        },
    }


if __name__ == "__main__":
    main()
