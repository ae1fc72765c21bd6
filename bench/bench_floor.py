"""The NATS floor: what the three JetStream round trips a turn's overhead path cannot avoid cost
on this machine, with the client library agentrun uses (nats-py) on loopback.

A turn's overhead (committed event n → model request n+1) crosses, at the least: the event's
JetStream publish and its ack, the TurnRequest through the work queue (publish, a worker's
fetch, its ack), and the tenant ledger's compare-and-set (a KV get, then an update on that
revision). Each iteration here does those three hops in sequence, one message each, against a
nats-server of its own — closed as the stack's (TLS, JWT auth; the floor connects as the
development server's ``admin`` user, since its streams are not agentrun's), or open with
``--open-bus`` — with the same stream kinds agentrun uses (file storage; a limits stream with a
subject per run, a work-queue stream with a durable pull consumer, a KV bucket with history 1),
and times each hop with ``time.perf_counter``:

- ``publish``: ``js.publish`` of a ``--payload``-byte event until its ``PubAck``;
- ``work_queue``: ``js.publish`` to the work queue, ``fetch(batch=1)`` of it, ``msg.ack()``
  (sent, not awaited: the worker does not wait for it either);
- ``kv_cas``: ``kv.get`` then ``kv.update(…, last=revision)``.

The floor is the sum of the hops' medians (``sum_p50_ms``); ``chain_p50_ms`` / ``chain_p99_ms``
are percentiles of each iteration's total. Warm-up iterations are not counted.

    cd bench && ../.venv/bin/python bench_floor.py [--samples 2000] [--payload 1024] [--open-bus]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import figures
import nats
from harness import write_result
from nats.js import api

from agentrun_dev import components, natsserver

HOPS = ("publish", "work_queue", "kv_cas")


async def measure_hops(
    options: dict[str, Any],
    *,
    samples: int,
    payload: int = 1024,
    warmup: int = 200,
    replicas: int = 1,
) -> dict[str, list[float]]:
    """Time ``samples`` iterations of the three hops against the server(s) that
    ``nats.connect(**options)`` reaches (a server's or a cluster's ``client_options("admin")``),
    with both streams and the bucket at ``replicas``.

    Returns ``{hop: [milliseconds, …]}`` for each of ``HOPS``, plus ``chain`` (each
    iteration's total), all of length ``samples``. Raises whatever nats-py raises when the
    server does not answer (``nats.errors.NoServersError``, timeouts).
    """
    nc = await nats.connect(**options, name="bench-floor")
    try:
        js = nc.jetstream(timeout=10)
        (queue,), kv = await make_assets(js, "floor", replicas=replicas, fetchers=1)
        body = b"x" * payload
        await kv.put("book", body)
        out: dict[str, list[float]] = {hop: [] for hop in (*HOPS, "chain")}
        for i in range(warmup + samples):
            clock = time.perf_counter
            t0 = clock()
            await js.publish(f"floor.event.run{i % 100}", body)
            t1 = clock()
            await js.publish("floor.turn.default", body)
            (msg,) = await queue.fetch(batch=1, timeout=5)
            await msg.ack()
            t2 = clock()
            entry = await kv.get("book")
            assert entry.revision is not None
            await kv.update("book", body, last=entry.revision)
            t3 = clock()
            if i >= warmup:
                for hop, start, end in zip(HOPS, (t0, t1, t2), (t1, t2, t3), strict=True):
                    out[hop].append((end - start) * 1000)
                out["chain"].append((t3 - t0) * 1000)
        return out
    finally:
        await nc.close()


async def make_assets(
    js: Any, prefix: str, *, replicas: int, fetchers: int
) -> tuple[list[Any], Any]:
    """The stream kinds agentrun uses, named after ``prefix``, at ``replicas``: a limits stream
    ``<PREFIX>_EVENTS`` on ``<prefix>.event.>``, a work-queue stream ``<PREFIX>_TURNS`` on
    ``<prefix>.turn.>`` with the durable pull consumer ``<prefix>-workers`` (``fetchers`` pull
    subscriptions bound to it: nats-py's fetch is not safe to share between tasks), and a KV
    bucket ``<PREFIX>_LEDGER`` with history 1; file storage throughout. Returned once each
    replicated stream and the consumer have elected a leader (a group just made answers no
    write until then: the first one met "no responders"). Returns (the pull subscriptions, the
    bucket). Raises what nats-py raises, TimeoutError after ``LEADER_WAIT`` s without one."""
    upper, file = prefix.upper(), api.StorageType.FILE
    await js.add_stream(
        api.StreamConfig(
            name=f"{upper}_EVENTS",
            subjects=[f"{prefix}.event.>"],
            storage=file,
            num_replicas=replicas,
        )
    )
    await js.add_stream(
        api.StreamConfig(
            name=f"{upper}_TURNS",
            subjects=[f"{prefix}.turn.>"],
            retention=api.RetentionPolicy.WORK_QUEUE,
            storage=file,
            num_replicas=replicas,
        )
    )
    durable = f"{prefix}-workers"
    consumer = api.ConsumerConfig(
        durable_name=durable, ack_policy=api.AckPolicy.EXPLICIT, max_ack_pending=-1
    )
    queues = [
        await js.pull_subscribe(f"{prefix}.turn.>", durable=durable, config=consumer)
        for _ in range(fetchers)
    ]
    kv = await js.create_key_value(
        api.KeyValueConfig(bucket=f"{upper}_LEDGER", history=1, storage=file, replicas=replicas)
    )
    if replicas > 1:
        async with asyncio.timeout(LEADER_WAIT):
            for stream in (f"{upper}_EVENTS", f"{upper}_TURNS", f"KV_{upper}_LEDGER"):
                while not await _led(js.stream_info(stream)):
                    await asyncio.sleep(0.05)
            while not await _led(js.consumer_info(f"{upper}_TURNS", durable)):
                await asyncio.sleep(0.05)
    return queues, kv


LEADER_WAIT = 30.0
"""Seconds ``make_assets`` waits for a replicated stream or consumer to elect its leader."""


async def _led(asking: Awaitable[Any]) -> bool:
    """Whether the stream's or consumer's info ``asking`` names a leader (an info request
    unanswered while a group has none counts as no)."""
    try:
        info = await asking
    except nats.errors.Error:
        return False
    return bool(getattr(getattr(info, "cluster", None), "leader", None))


@contextlib.contextmanager
def nats_server(*, closed: bool = True) -> Iterator[natsserver.NatsServer]:
    """A nats-server of its own with JetStream (closed unless ``closed`` is False) in a
    temporary directory; stopped by pid and its directory removed on exit."""
    workdir = Path(tempfile.mkdtemp(prefix="agentrun-bench-floor-"))
    launch = components.Launch(log_dir=workdir / "logs", die_with_parent=True)
    server = natsserver.start_nats_server(workdir / "nats", launch=launch, closed=closed)
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def measure(*, samples: int, payload: int = 1024, closed: bool = True) -> dict[str, Any]:
    """Start a nats-server, time the hops, stop it; the figures (``figures.floor_figures``),
    the payload size and the bus kind."""
    with nats_server(closed=closed) as server:
        options = server.client_options("admin")
        hops = asyncio.run(measure_hops(options, samples=samples, payload=payload))
    bus = "closed (TLS, JWT auth)" if closed else "open"
    return {**figures.floor_figures(hops), "payload_bytes": payload, "bus": bus}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--payload", type=int, default=1024, help="bytes per message")
    parser.add_argument("--open-bus", action="store_true", help="nats-server without TLS, auth")
    args = parser.parse_args()
    found = measure(samples=args.samples, payload=args.payload, closed=not args.open_bus)
    write_result("floor-open-bus" if args.open_bus else "floor", found)


if __name__ == "__main__":
    main()
