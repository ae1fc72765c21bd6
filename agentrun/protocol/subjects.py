"""NATS names: streams, subjects, durable consumers and KV buckets, and the payload JSON
encoding. The NATS permissions of each identity (``agentrun.natsauth.permissions``) are built
from these names."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

STREAM_TURNS = "AGENTRUN_TURNS"
"""Work-queue stream of TurnRequests."""
STREAM_EVENTS = "AGENTRUN_EVENTS"
"""Per-run event subjects: the source of truth of every run."""
TURN_SUBJECTS = "agentrun.turn.>"
EVENT_SUBJECTS = "agentrun.event.>"
CANCEL_SUBJECTS = "agentrun.cancel.>"
WORKERS_CONSUMER = "agentrun-workers"
OPERATOR_CONSUMER = "agentrun-operator"
"""The operator's durable consumer on every run's events (one shard: the only one)."""
LEDGER_BUCKET = "AGENTRUN_LEDGER"
"""JetStream KV bucket of the tenant budget ledger: per tenant its totals
(``book.<tenant>``), the entries of its runs stored apart (``run.<tenant>.<run-uid>``),
its admission queue (``queue.<tenant>.<run-uid>``) and, while its ledger is made or split in
several batches, their guard (``making.<tenant>``)."""
LEDGER_TOTALS = "book"
"""Key prefix of a tenant's ledger totals (written by the operator and the workers)."""
LEDGER_RUNS = "run"
"""Key prefix of the run entries stored apart (written by the operator and the workers)."""
LEDGER_QUEUES = "queue"
"""Key prefix of the admission queues (written by the operator only)."""
LEDGER_MAKING = "making"
"""Key prefix of the guard of a tenant's ledger being made or split in several atomic batches
(``making.<tenant>``, written by the operator only; gone once the ledger is)."""
EFFECTS_BUCKET = "AGENTRUN_EFFECTS"
"""JetStream KV bucket of the effect ledger (``<run-uid>.<call-id>``)."""


def operator_consumer(shard: int, shards: int) -> str:
    """The durable consumer on every run's events of operator shard ``shard`` of ``shards``:
    ``agentrun-operator`` with one shard, else ``agentrun-operator-<shard>``. Its owner acks
    every event and acts on its shard's runs only, so a process taking the shard over resumes
    from its ack floor."""
    return OPERATOR_CONSUMER if shards == 1 else f"{OPERATOR_CONSUMER}-{shard}"


def kv_stream(bucket: str) -> str:
    """The stream behind a KV bucket, ``KV_<bucket>``."""
    return f"KV_{bucket}"


def kv_subject(bucket: str, key: str) -> str:
    """The subject a KV key is written to, ``$KV.<bucket>.<key>`` (``key`` may be a wildcard)."""
    return f"$KV.{bucket}.{key}"


def _token(value: str) -> str:
    """A subject token from a Kubernetes name: ``.`` (legal in names) becomes ``_`` (illegal)."""
    return value.replace(".", "_")


def turn_subject(tenant: str) -> str:
    """``agentrun.turn.<tenant>``."""
    return f"agentrun.turn.{_token(tenant)}"


def event_subject(namespace: str, name: str) -> str:
    """``agentrun.event.<ns>.<run>``: one subject per run, the run's checkpoint."""
    return f"agentrun.event.{_token(namespace)}.{_token(name)}"


def cancel_subject(run_uid: str) -> str:
    """Core-NATS subject on which the operator tells workers to abandon a run's turn."""
    return f"agentrun.cancel.{run_uid}"


def dumps(data: Mapping[str, Any]) -> bytes:
    """Compact UTF-8 JSON."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
