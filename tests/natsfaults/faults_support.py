"""What the NATS cluster's load tests share: an admin client on the cluster (ledger books,
leaders, step-downs, a run's events, what NATS holds of a stuck run), the scripted model and the
processes' environment on the cluster, and a tenant's settled book."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import nats
import nats.js.errors
import yaml

from agentrun import protocol
from agentrun.ledger import Book, LedgerStore
from agentrun.protocol import RunEvent
from agentrun_dev import components, natscluster, stack

LEDGER_KV = protocol.kv_stream(protocol.LEDGER_BUCKET)
EFFECTS_KV = protocol.kv_stream(protocol.EFFECTS_BUCKET)
SETTLE = 30.0
"""Seconds the ledger and the turn queue get to settle after the last run ended (its close
and the last acks land right after its terminal status)."""


class Admin:
    """An admin NATS client on its own event loop: ledger books, leaders, step-downs."""

    def __init__(self, cluster: natscluster.NatsCluster) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.nc: Any = self.run(nats.connect(**cluster.client_options(), max_reconnect_attempts=-1))
        # bound, not provisioned: an open with ``create`` would set the bucket's replicas
        self.store: LedgerStore = self.run(LedgerStore.open(self.nc.jetstream(), create=False))

    def run(self, coro: Any, timeout: float = 60) -> Any:
        """``coro``'s result, run on the client's loop (``TimeoutError`` after ``timeout`` s)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=timeout)

    def book(self, tenant: str) -> Book | None:
        """``tenant``'s ledger book, None if it has none."""
        found: Book | None = self.run(self.store.read(tenant))
        return found

    def leader(self, stream: str) -> str:
        """The name (``n<i>``) of the server leading ``stream``."""
        info = self.run(self.nc.jetstream(timeout=5).stream_info(stream))
        return str(info.cluster.leader)

    def step_down(self, stream: str, consumer: str | None = None) -> tuple[str, str]:
        """Move the leader of ``stream`` (or of its ``consumer``): (old, new) server names."""
        moved: tuple[str, str] = self.run(
            natscluster.step_down(self.nc, stream, consumer=consumer, timeout=20)
        )
        return moved

    def replicas(self) -> dict[str, int]:
        """Every stream agentrun made (its KV buckets' included) → its replica count."""
        js = self.nc.jetstream(timeout=5)
        names = (protocol.STREAM_TURNS, protocol.STREAM_EVENTS, LEDGER_KV, EFFECTS_KV)
        return {n: int(self.run(js.stream_info(n)).config.num_replicas or 1) for n in names}

    def turns_queued(self) -> int:
        """TurnRequests in the work queue now."""
        info = self.run(self.nc.jetstream(timeout=5).stream_info(protocol.STREAM_TURNS))
        return int(info.state.messages)

    def diagnose(self, namespace: str, name: str, uid: str) -> dict[str, Any]:
        """What NATS holds of a stuck run: its events (kind, turn, seq), the TurnRequests of
        it still in the work queue (turn, base, deliveries), the workers' consumer (pending,
        ack pending, redelivered) and the operators' on the events, by name (the same, and
        their pull requests waiting)."""
        return dict(self.run(self._diagnose(namespace, name, uid)))

    def events(self, namespace: str, name: str) -> list[tuple[RunEvent, float]]:
        """Run ``namespace/name``'s events in order, each with the time JetStream stored it
        (epoch seconds), read from the stream's leader."""
        found: list[tuple[RunEvent, float]] = self.run(self._events(namespace, name))
        return found

    async def _events(self, namespace: str, name: str) -> list[tuple[RunEvent, float]]:
        jsm = self.nc.jsm()
        subject = protocol.event_subject(namespace, name)
        events, seq = [], 1
        while True:
            try:
                raw = await jsm.get_msg(protocol.STREAM_EVENTS, seq=seq, next=True, subject=subject)
            except nats.js.errors.NotFoundError:
                return events
            stored = raw.time.timestamp() if raw.time is not None else 0.0
            events.append((RunEvent.decode(raw.data or b"", seq=int(raw.seq or 0)), stored))
            seq = int(raw.seq or 0) + 1

    async def _diagnose(self, namespace: str, name: str, uid: str) -> dict[str, Any]:
        jsm = self.nc.jsm()
        events = [(e.kind, e.summary.turn, e.seq) for e, _ in await self._events(namespace, name)]
        info = await jsm.stream_info(protocol.STREAM_TURNS)
        queued = []
        for at in range(int(info.state.first_seq or 0), int(info.state.last_seq or 0) + 1):
            try:
                raw = await jsm.get_msg(protocol.STREAM_TURNS, seq=at)
            except nats.js.errors.NotFoundError:
                continue
            request = protocol.decode_turn_request(raw.data or b"")
            if request.run_uid == uid:
                queued.append((at, request.turn, request.expected_seq, raw.headers))
        consumer = await jsm.consumer_info(protocol.STREAM_TURNS, protocol.WORKERS_CONSUMER)
        operators = {  # one, or one a shard (``agentrun-operator-<shard>``)
            str(info.name): (
                info.num_pending,
                info.num_ack_pending,
                info.num_redelivered,
                info.num_waiting,
            )
            for info in await jsm.consumers_info(protocol.STREAM_EVENTS)
            if str(info.name).startswith(protocol.OPERATOR_CONSUMER)
        }
        return {
            "uid": uid,
            "events": events,
            "queued": queued,
            "workers": (consumer.num_pending, consumer.num_ack_pending, consumer.num_redelivered),
            "operators": operators,
        }

    def close(self) -> None:
        """Close the client and stop its loop."""
        self.run(self.nc.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


def model_on_cluster(
    logs: Path,
    scenarios: list[dict[str, Any]],
    control_plane: Any,
    cluster: natscluster.NatsCluster,
) -> tuple[components.Launch, components.Component, dict[str, str]]:
    """Start the scripted model with ``scenarios`` (logs in ``logs``); return the launch, the
    model and the environment of processes on ``cluster`` (every server's URL, R3 streams and
    buckets) with the Lease at the product's defaults (15 s, renew deadline 10 s), not the e2e
    stack's short ones (8 s, 6 s, for quick failovers): under this load a renewal took up to
    4.4 s on two cores, near the short deadline (past it the operator exits, as designed, and
    the tests start it again)."""
    path = logs / "scenarios.yaml"
    path.write_text(yaml.safe_dump({"scenarios": scenarios}))
    launch = components.Launch(log_dir=logs, die_with_parent=True)
    mock = stack.start_mockllm([path], launch=launch)
    env = stack.service_env(
        kubeconfig=str(control_plane.kubeconfig),
        nats=cluster.servers[0],
        replicas=len(cluster.servers),
        urls=cluster.urls,
    )
    env.update(
        AGENTRUN_LEASE_DURATION="15", AGENTRUN_LEASE_RENEW_DEADLINE="10", AGENTRUN_LEASE_RETRY="2"
    )
    return launch, mock, env


def settled(admin: Admin, tenant: str) -> Book:
    """`tenant`'s book once nothing is held or active (AssertionError after ``SETTLE`` s)."""
    end = time.monotonic() + SETTLE
    while True:
        book = admin.book(tenant)
        assert book is not None, tenant
        if not book.active and not book.holds:
            return book
        assert time.monotonic() < end, f"{tenant}: left {book.active} {book.holds}"
        time.sleep(0.5)


def tenant_manifest(name: str, namespace: str, *, tokens: int, concurrent: int) -> dict[str, Any]:
    """AgentTenant ``name`` of ``namespace``: a budget of ``tokens``, ``concurrent`` runs at
    most (``maxConcurrentRuns``)."""
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentTenant",
        "metadata": {"name": name},
        "spec": {
            "namespaces": [namespace],
            "budget": {"tokens": tokens},
            "maxConcurrentRuns": concurrent,
        },
    }


def server_named(cluster: natscluster.NatsCluster, name: str) -> Any:
    """The server of ``cluster`` named ``name`` (``n<i>``); StopIteration if none is."""
    return next(s for s in cluster.servers if s.component.name == f"nats-server-{name}")
