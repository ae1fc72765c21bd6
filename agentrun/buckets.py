"""Binding JetStream KV buckets: the operator creates them, the workers only bind.

On a closed bus only the operator may create or configure a stream, and a KV bucket is a
stream (``KV_<bucket>``); a worker that finds a bucket missing waits for the operator to make
it instead of making its own. What belongs here: that rule, once, for every bucket, and the
configuration of a bucket the operator provisions for a ledger it does not use itself (the
effect ledger's, ``effects_config``). What a bucket holds belongs to its ledger
(``agentrun.ledger``, the worker's ``effects``).
"""

from __future__ import annotations

import asyncio
import logging

import nats.js.errors
from nats.js import JetStreamContext, api
from nats.js.kv import KeyValue

from agentrun import protocol

log = logging.getLogger(__name__)

EFFECTS_TTL_SECONDS = 7 * 24 * 3600
"""Effect ledger entries expire after a week (longer than any run's timeout, at most 24 h)."""


def effects_config(bucket: str = protocol.EFFECTS_BUCKET) -> api.KeyValueConfig:
    """The effect ledger's bucket (``AGENTRUN_EFFECTS``; another name keeps a second ledger
    apart, e.g. for tests): one entry per write or idempotent tool call, no history, entries
    expiring after ``EFFECTS_TTL_SECONDS``, on file storage. The operator creates it with this
    configuration; the workers' effect ledger binds it."""
    return api.KeyValueConfig(
        bucket=bucket, history=1, ttl=EFFECTS_TTL_SECONDS, storage=api.StorageType.FILE
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


async def open_bucket(
    js: JetStreamContext, config: api.KeyValueConfig, *, create: bool, retry: float = 1.0
) -> KeyValue:
    """The bucket ``config.bucket``: bound if it exists; created with ``config`` when missing
    and ``create``; otherwise waited for (checked every ``retry`` seconds, for as long as it
    takes: a worker that starts before the operator), logging once that it waits.

    Raises what nats-py raises for anything but a missing bucket (e.g. a timeout when the
    connection has no permission to read the bucket).
    """
    assert config.bucket is not None
    waited = False
    while True:
        try:
            return await js.key_value(config.bucket)
        except nats.js.errors.BucketNotFoundError:
            if create:
                return await js.create_key_value(config)
        if not waited:
            log.info(
                "KV bucket %s does not exist yet: waiting for the operator to create it",
                config.bucket,
            )
            waited = True
        await asyncio.sleep(retry)
