"""Listing a JetStream KV bucket's keys in tests without a consumer (imported by name; pytest
puts this folder on sys.path).

nats-py's ``KeyValue.keys()`` lists through an ordered consumer that watches the bucket and
stops at what it takes for the end of the initial values; it came back empty once in CI for a
bucket that held the key. ``live_keys`` asks the stream instead, as the ledger's own listing
does: its info names every subject that holds a message, and each key's last entry is read
(deleted and purged keys left out)."""

from __future__ import annotations

import nats.js.errors
from nats.js.kv import KeyValue


async def live_keys(kv: KeyValue, pattern: str = ">") -> list[str]:
    """The keys of ``kv`` matching ``pattern`` (a subject wildcard below the bucket, e.g.
    ``run.<tenant>.*``) that hold a value now, sorted. Raises what nats-py raises when the
    server cannot be asked."""
    prefix: str = kv._pre
    info = await kv._js.stream_info(kv._stream, subjects_filter=f"{prefix}{pattern}")
    keys = []
    for subject in sorted(info.state.subjects or {}):
        key = subject.removeprefix(prefix)
        try:
            await kv.get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            continue
        keys.append(key)
    return keys
