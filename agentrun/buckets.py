"""Binding JetStream KV buckets: the operator creates them, the workers only bind.

On a closed bus only the operator may create or configure a stream, and a KV bucket is a
stream (``KV_<bucket>``); a worker that finds a bucket missing waits for the operator to make
it instead of making its own. What belongs here: that rule, once, for every bucket, and the
configuration of a bucket the operator provisions for a ledger it does not use itself (the
effect ledger's, ``effects_config``). What a bucket holds belongs to its ledger
(``agentrun.ledger``, the worker's ``effects``).

Replicas: the operator gives every stream and bucket it provisions the replica count it is
configured with (``AGENTRUN_NATS_REPLICAS``): a missing one is created with it, an existing one
with another count is updated to it (JetStream moves the data to the new peers; both raising
and lowering are allowed on a cluster), and a count the servers cannot hold is refused with
``ReplicasRefused`` saying what to set (``provision_stream``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

import nats.js.errors
from nats.js import JetStreamContext, api
from nats.js.kv import KeyValue

from agentrun import protocol

log = logging.getLogger(__name__)

STREAM_EXISTS_CODE = 10058
"""JetStream API error code of a stream created again with another configuration (``stream
name already in use with a different configuration``)."""
NO_PEERS_CODE = 10005
"""JetStream API error code of a placement no servers can take (``no suitable peers for
placement``; with "peer offline" in its description while a server is down)."""
OFFLINE_WAIT = 30.0
"""Seconds a stream's creation or update waits for an offline server of the cluster to come
back (a rolling restart takes one server down at a time) before it is refused."""
REPLICAS_REFUSED_CODES = frozenset({10074, 10005})
"""JetStream API error codes of a replica count the servers cannot hold: 10074 (``replicas > 1
not supported in non-clustered mode``: a single server) and 10005 (``no suitable peers for
placement``: fewer servers in the cluster than replicas)."""

EFFECTS_TTL_SECONDS = 7 * 24 * 3600
"""Effect ledger entries expire after a week (longer than any run's timeout, at most 24 h)."""


class ReplicasRefused(Exception):
    """The NATS servers cannot hold a stream or bucket at the configured replica count (more
    replicas than servers in the JetStream cluster, or any above 1 on a single server)."""


def effects_config(
    bucket: str = protocol.EFFECTS_BUCKET, *, replicas: int = 1
) -> api.KeyValueConfig:
    """The effect ledger's bucket (``AGENTRUN_EFFECTS``; another name keeps a second ledger
    apart, e.g. for tests): one entry per write or idempotent tool call, no history, entries
    expiring after ``EFFECTS_TTL_SECONDS``, on file storage, kept by ``replicas`` servers. The
    operator creates it with this configuration; the workers' effect ledger binds it."""
    return api.KeyValueConfig(
        bucket=bucket,
        history=1,
        ttl=EFFECTS_TTL_SECONDS,
        storage=api.StorageType.FILE,
        replicas=replicas,
    )


async def require_atomic(
    js: JetStreamContext, bucket: str, *, create: bool, retry: float = 1.0
) -> None:
    """Make sure the bucket's stream takes atomic batches and per-message TTLs (a change of a
    run's ledger entry and its tenant's totals is one batch; a deleted entry leaves a purge
    marker that expires): set them if ``create`` (the operator; a bucket made by an earlier
    release lacks them), otherwise wait until they are set (checked every ``retry`` seconds,
    logging once). Needs nats-server ≥ 2.12 (ADR-50); an older server refuses the update
    (``nats.js.errors.APIError``, raised)."""
    stream = protocol.kv_stream(bucket)
    waited = False
    while True:
        config = (await js.stream_info(stream)).config
        if config.allow_atomic and config.allow_msg_ttl:
            return
        if create:
            config.allow_atomic = True
            config.allow_msg_ttl = True
            await js.update_stream(config)
            log.info("stream %s now takes atomic batches and message TTLs", stream)
            return
        if not waited:
            log.info("stream %s does not take atomic batches yet: waiting for the operator", stream)
            waited = True
        await asyncio.sleep(retry)


async def provision_stream(
    js: JetStreamContext, config: api.StreamConfig, *, offline_wait: float = OFFLINE_WAIT
) -> None:
    """Create the stream ``config.name``, or update it to ``config`` when it exists with
    another configuration (error 10058; its replica count included). While the placement is
    refused because a server of the cluster is offline (10005, "peer offline": one restarting),
    it is tried again every second for up to `offline_wait` seconds.

    Raises ``ReplicasRefused`` when the servers cannot hold ``config.num_replicas`` (also a
    server still offline after `offline_wait` s), and what nats-py raises for any other
    refusal or when the server cannot be asked.
    """
    assert config.name is not None
    deadline = time.monotonic() + offline_wait
    while True:
        try:
            try:
                await js.add_stream(config)
            except nats.js.errors.BadRequestError as err:
                if err.err_code != STREAM_EXISTS_CODE:
                    raise
                await js.update_stream(config)
            return
        except nats.js.errors.APIError as err:
            if _peer_offline(err) and time.monotonic() < deadline:
                log.warning("stream %s: %s; trying again", config.name, err.description)
                await asyncio.sleep(1.0)
                continue
            _raise_refused(config.name, config.num_replicas, err)
            raise


def _peer_offline(err: nats.js.errors.APIError) -> bool:
    """Whether `err` refuses a placement because a server is offline (10005, "peer
    offline"), which passes once it is back, rather than for good."""
    return err.err_code == NO_PEERS_CODE and "offline" in (err.description or "")


async def _provision_bucket(js: JetStreamContext, config: api.KeyValueConfig) -> KeyValue:
    """The bucket ``config.bucket`` created (waiting for an offline server as
    ``provision_stream`` does), or bound and its stream's replica count set to
    ``config.replicas`` if it has another one (``provision_stream``'s errors)."""
    assert config.bucket is not None
    stream = protocol.kv_stream(config.bucket)
    try:
        info = await js.stream_info(stream)
    except nats.js.errors.NotFoundError:
        deadline = time.monotonic() + OFFLINE_WAIT
        while True:
            try:
                kv = await js.create_key_value(config)
                await forbid_rollups(js, config.bucket)
                return kv
            except nats.js.errors.APIError as err:
                if _peer_offline(err) and time.monotonic() < deadline:
                    log.warning("bucket %s: %s; trying again", config.bucket, err.description)
                    await asyncio.sleep(1.0)
                    continue
                _raise_refused(stream, config.replicas, err)
                raise
    if info.config.num_replicas != config.replicas:
        await provision_stream(js, dataclasses.replace(info.config, num_replicas=config.replicas))
        log.info("KV bucket %s: replicas set to %d", config.bucket, config.replicas)
    await forbid_rollups(js, config.bucket)
    return await js.key_value(config.bucket)


async def forbid_rollups(js: JetStreamContext, bucket: str) -> None:
    """Make the bucket's stream refuse ``Nats-Rollup`` (nats-py creates every bucket allowing
    it). No subject permission sees a header: a rollup of ``all`` published to a key a worker
    may write (a book, a run entry, an effect) would purge every other key of the bucket —
    every tenant's books and entries, the admission queues that are the operator's alone,
    every effect. agentrun deletes a value with a purge marker that needs no rollup (each
    bucket keeps one message a key), so nothing of its own is refused."""
    stream = protocol.kv_stream(bucket)
    config = (await js.stream_info(stream)).config
    if config.allow_rollup_hdrs:
        config.allow_rollup_hdrs = False
        await js.update_stream(config)
        log.info("stream %s now refuses rollups", stream)


def _raise_refused(stream: str, replicas: int | None, err: nats.js.errors.APIError) -> None:
    """Raise ``ReplicasRefused`` if ``err`` is the servers refusing ``replicas``."""
    if err.err_code in REPLICAS_REFUSED_CODES:
        raise ReplicasRefused(
            f"stream {stream}: the NATS servers refused {replicas} replicas "
            f"({err.description}); set AGENTRUN_NATS_REPLICAS (the chart's "
            "nats.jetstream.replicas) to at most the servers in the JetStream cluster, "
            "1 for a single server"
        ) from err


async def open_bucket(
    js: JetStreamContext, config: api.KeyValueConfig, *, create: bool, retry: float = 1.0
) -> KeyValue:
    """The bucket ``config.bucket``. With ``create`` (the operator): created with ``config``
    when missing, else bound with its replica count made ``config.replicas``. Without: bound,
    or waited for while missing (checked every ``retry`` seconds, for as long as it takes: a
    worker that starts before the operator), logging once that it waits.

    Raises ``ReplicasRefused`` (``create`` only) when the servers cannot hold
    ``config.replicas``, and what nats-py raises for anything but a missing bucket (e.g. a
    timeout when the connection has no permission to read the bucket).
    """
    assert config.bucket is not None
    if create:
        return await _provision_bucket(js, config)
    waited = False
    while True:
        try:
            return await js.key_value(config.bucket)
        except nats.js.errors.BucketNotFoundError:
            pass
        if not waited:
            log.info(
                "KV bucket %s does not exist yet: waiting for the operator to create it",
                config.bucket,
            )
            waited = True
        await asyncio.sleep(retry)
