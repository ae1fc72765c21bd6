"""What tests on a three-server NATS cluster (``agentrun_dev.natscluster``) share."""

from __future__ import annotations

import asyncio
import time

import nats
import nats.errors
import nats.js.errors

from agentrun_dev.natscluster import NatsCluster

ELECTION_ERRORS: tuple[type[Exception], ...] = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
)
"""What a request may answer while a stream of the cluster elects a leader: no answer in time,
no responder, an empty reply, or 503 "JetStream system temporarily unavailable" (10008) from a
server that has no leader to forward to. The runtime retries each (the worker's
``is_transient``: a turn naked and redelivered, a settlement settled again); a test on the
cluster retries exactly these and fails on any other error."""


async def jetstream_usable(cluster: NatsCluster, *, timeout: float = 60.0) -> None:
    """Wait until JetStream answers on the cluster (the admin identity asks for its account): a
    cluster with a meta leader may still answer 503 "JetStream not enabled for account" for a
    moment while the account is assigned. Raises AssertionError after ``timeout`` seconds."""
    deadline, last = time.monotonic() + timeout, "not asked yet"
    while time.monotonic() < deadline:
        try:
            nc = await nats.connect(**cluster.client_options("admin"))
            try:
                await nc.jetstream(timeout=2).account_info()
                return
            finally:
                await nc.close()
        except (nats.errors.Error, OSError, TimeoutError) as err:
            last = repr(err)
        await asyncio.sleep(0.2)
    raise AssertionError(f"JetStream not usable on the cluster within {timeout}s: {last}")
