"""What one JetStream stream and one KV bucket carry at R1 and at R3, for the capacity model.

agentrun keeps every run's events in one stream (``AGENTRUN_EVENTS``), every TurnRequest in
one work queue (``AGENTRUN_TURNS``) and every tenant's ledger in one KV bucket
(``AGENTRUN_LEDGER``). How many turns a cluster can commit is bounded by what those carry, and
a replicated stream (R3) pays a Raft round between its servers for every write. This measures,
against a closed nats-server of its own (TLS, JWT auth, as the stack's) and then against a
closed three-server cluster of its own on loopback with the same assets at R3, with nats-py:

- ``hops``: the floor's three round trips one at a time (``bench_floor.measure_hops``: an
  event publish until its ack; a TurnRequest published, fetched and acked; a KV get and
  compare-and-set), p50/p99 of each, so R3's latency per hop is beside R1's;
- ``publish_per_s``: event publishes acked per second with ``--concurrency`` publishers at
  once, each on its own run subject (a stream's write capacity);
- ``work_queue_per_s``: TurnRequests through the work queue per second with ``--concurrency``
  producers and the same number of fetching consumers on one durable consumer;
- ``cas_per_s``: KV compare-and-sets per second on ``--concurrency`` distinct keys at once
  (the split ledger's shape: a run's own entry), and ``hot_cas_per_s`` with every writer on one
  key (a tenant's totals key), with the retries per success that contention costs.

Each throughput part runs for ``--seconds``. Wall-clock figures: run it on a quiet machine,
and read R3 over R1 from the same run (``r3_over_r1``), which is what the capacity model uses.

    cd bench && ../.venv/bin/python bench_streams.py [--seconds 5] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import figures
import nats
from bench_floor import make_assets, measure_hops
from harness import load_average, write_result
from nats.js.errors import KeyWrongLastSequenceError

from agentrun_dev import components, natscluster, natsserver

CONFLICT_CODES = frozenset({10071, 10164})
"""JetStream's "wrong last sequence" (10071) and, from a replicated bucket, 10164: both mean
another writer got there first (the ledger treats them alike)."""


@contextlib.contextmanager
def servers(size: int) -> Iterator[Any]:
    """One closed nats-server (`size` 1) or a closed cluster of `size` on loopback, in a
    temporary directory; stopped by pid and the directory removed on exit. Yields an object
    with ``client_options("admin")``."""
    workdir = Path(tempfile.mkdtemp(prefix="agentrun-bench-streams-"))
    launch = components.Launch(log_dir=workdir / "logs", die_with_parent=True)
    started: Any = None
    try:
        if size == 1:
            started = natsserver.start_nats_server(workdir / "nats", launch=launch, closed=True)
        else:
            started = natscluster.start_nats_cluster(workdir / "nats", size=size, launch=launch)
        yield started
    finally:
        if started is not None:
            started.stop()
        shutil.rmtree(workdir, ignore_errors=True)


async def _for(
    seconds: float, workers: int, step: Callable[[int], Awaitable[int]]
) -> tuple[int, float]:
    """Run `workers` loops of ``step(worker index)`` (each returns how many operations it
    completed) for `seconds`; the operations completed by all of them, and the seconds taken."""
    deadline = time.perf_counter() + seconds
    done = [0] * workers

    async def loop(index: int) -> None:
        while time.perf_counter() < deadline:
            done[index] += await step(index)

    start = time.perf_counter()
    await asyncio.gather(*(loop(i) for i in range(workers)))
    return sum(done), time.perf_counter() - start


async def _rate(seconds: float, workers: int, step: Callable[[int], Awaitable[int]]) -> float:
    """Operations per second of ``_for``."""
    done, took = await _for(seconds, workers, step)
    return done / took


async def throughput(
    options: dict[str, Any], *, replicas: int, seconds: float, concurrency: int, payload: int
) -> dict[str, float]:
    """The four throughput figures (module docstring) against the server(s) behind `options`,
    with every stream and bucket at `replicas`. Raises what nats-py raises on a failed request
    (other than a compare-and-set conflict, which is counted)."""
    nc = await nats.connect(**options, name="bench-streams")
    try:
        js = nc.jetstream(timeout=20)
        body = b"x" * payload
        queues, kv = await make_assets(js, "cap", replicas=replicas, fetchers=concurrency)

        async def publish(index: int) -> int:
            await js.publish(f"cap.event.run{index}", body)
            return 1

        async def work(index: int) -> int:
            await js.publish("cap.turn.default", body)
            (msg,) = await queues[index].fetch(batch=1, timeout=10)
            await msg.ack()
            return 1

        retries = [0]

        async def cas(key: str) -> int:
            while True:
                entry = await kv.get(key)
                assert entry.revision is not None
                try:
                    await kv.update(key, body, last=entry.revision)
                    return 1
                except KeyWrongLastSequenceError:
                    retries[0] += 1
                except nats.js.errors.APIError as err:
                    if err.err_code not in CONFLICT_CODES:
                        raise
                    retries[0] += 1

        for index in range(concurrency):
            await kv.put(f"run.{index}", body)
        await kv.put("book", body)
        found = {
            "publish_per_s": await _rate(seconds, concurrency, publish),
            "work_queue_per_s": await _rate(seconds, concurrency, work),
            "cas_per_s": await _rate(seconds, concurrency, lambda i: cas(f"run.{i}")),
        }
        retries[0] = 0
        successes, took = await _for(seconds, concurrency, lambda i: cas("book"))
        found["hot_cas_per_s"] = successes / took
        found["hot_cas_retries_per_success"] = retries[0] / successes if successes else 0.0
        return {name: round(value, 3) for name, value in found.items()}
    finally:
        await nc.close()


async def _hops(options: dict[str, Any], *, replicas: int, samples: int) -> dict[str, Any]:
    """The floor's hops against `options` at `replicas` (``bench_floor.measure_hops``)."""
    hops = await measure_hops(options, samples=samples, replicas=replicas)
    return figures.floor_figures(hops)


def measure(
    size: int, *, seconds: float, concurrency: int, samples: int, payload: int = 1024
) -> dict[str, Any]:
    """Start `size` servers (1: one server at R1; more: a cluster at R3), take the hops and the
    throughput, stop them. Returns ``{"servers", "replicas", "hops", "throughput",
    "load_average"}``."""
    replicas = 1 if size == 1 else 3
    with servers(size) as started:
        options = started.client_options("admin")
        before = load_average()
        hops = asyncio.run(_hops(options, replicas=replicas, samples=samples))
        found = asyncio.run(
            throughput(
                options,
                replicas=replicas,
                seconds=seconds,
                concurrency=concurrency,
                payload=payload,
            )
        )
    return {
        "servers": size,
        "replicas": replicas,
        "hops": hops,
        "throughput": found,
        "load_average": [before, load_average()],
    }


def ratios(r1: dict[str, Any], r3: dict[str, Any]) -> dict[str, float | None]:
    """R3 over R1 for every throughput figure and the floor's p50 sum."""
    out: dict[str, float | None] = {}
    for name, value in r1["throughput"].items():
        other = r3["throughput"][name]
        out[name] = round(other / value, 3) if value else None
    floor1, floor3 = r1["hops"]["sum_p50_ms"], r3["hops"]["sum_p50_ms"]
    out["floor_sum_p50_ms"] = round(floor3 / floor1, 3) if floor1 else None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0, help="per throughput figure")
    parser.add_argument("--concurrency", type=int, default=32, help="writers at once")
    parser.add_argument("--samples", type=int, default=500, help="round trips per hop")
    parser.add_argument("--payload", type=int, default=1024, help="bytes per message")
    parser.add_argument("--name", default="streams", help="results file name")
    args = parser.parse_args()
    sizes = {"seconds": args.seconds, "concurrency": args.concurrency, "samples": args.samples}
    r1 = measure(1, payload=args.payload, **sizes)
    r3 = measure(3, payload=args.payload, **sizes)
    record = {"r1": r1, "r3": r3, "r3_over_r1": ratios(r1, r3), **sizes}
    for label, part in (("R1, one server", r1), ("R3, three servers", r3)):
        t, h = part["throughput"], part["hops"]
        print(
            f"{label}: floor {h['sum_p50_ms']} ms p50; publish {t['publish_per_s']:.0f}/s, "
            f"work queue {t['work_queue_per_s']:.0f}/s, CAS {t['cas_per_s']:.0f}/s, "
            f"one hot key {t['hot_cas_per_s']:.0f}/s "
            f"({t['hot_cas_retries_per_success']:.2f} retries a success); "
            f"load {part['load_average']}"
        )
    print(f"R3 over R1: {record['r3_over_r1']}")
    write_result(args.name, record)


if __name__ == "__main__":
    main()
