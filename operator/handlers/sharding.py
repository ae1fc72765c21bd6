"""kopf's view of the operator shards: every process watches every AgentRun, and only the
owner of a run's shard handles it (``platform.shards``).

kopf keeps some of its bookkeeping in the objects (each handler's progress, in annotations,
while a handler is retried) and some in each process (the last handled essence of a run:
``startup.RunDiffBaseStorage``). With several processes watching one AgentRun, a process that
merely skipped a run (a ``when=`` filter) would still record it as handled, and, once it
became the run's owner, would miss what it had skipped (its creation, a cancel). So ownership
is applied in kopf's storages instead: for a run of a shard this process does not own, every
handler reads as "waiting for a retry far in the future" (nothing runs, nothing is done, so
kopf does not record the change as handled), nothing is written and nothing remembered. The
owner's kopf reads and writes as with one shard; a process that becomes a run's owner reads
from the object what it did not handle itself (``RunDiffBaseStorage``). No AgentRun handler
needs a finalizer, so kopf adds none; a run an earlier version gave one has it taken off by
its owner's ``runs.run_seen`` once it ends or is deleted.

A run's shard is its admitted tenant's (``status.tenant``); before admission, the tenant its
namespace resolves to, which ``RunShards.learn`` records from the watch-event handler that kopf
runs before the changing handlers of the same event.
"""

from __future__ import annotations

import datetime
from typing import Any

import kopf

from ..platform.shards import RunShards

NOT_MINE_DELAY = datetime.timedelta(hours=1)
"""How far ahead a non-owner's handlers read as delayed (any new event wakes kopf sooner)."""


class ShardProgressStorage(kopf.ProgressStorage):
    """``inner`` for the objects this process owns; for the others every handler reads as
    delayed (``NOT_MINE_DELAY``) and nothing is written."""

    def __init__(self, inner: kopf.ProgressStorage, shards: RunShards) -> None:
        """``inner``: the storage of owned objects (kopf's annotations storage)."""
        super().__init__()
        self.inner = inner
        self.shards = shards

    def fetch(self, *, key: Any, body: kopf.Body) -> kopf.ProgressRecord | None:
        """See ``kopf.ProgressStorage.fetch``."""
        if self.shards.owns(body):
            return self.inner.fetch(key=key, body=body)
        now = datetime.datetime.now(datetime.UTC)  # kopf compares aware times
        later = (now + NOT_MINE_DELAY).isoformat(timespec="microseconds")
        return kopf.ProgressRecord(started=now.isoformat(timespec="microseconds"), delayed=later)

    def store(
        self, *, key: Any, record: kopf.ProgressRecord, body: kopf.Body, patch: kopf.Patch
    ) -> None:
        """See ``kopf.ProgressStorage.store``."""
        if self.shards.owns(body):
            self.inner.store(key=key, record=record, body=body, patch=patch)

    def purge(self, *, key: Any, body: kopf.Body, patch: kopf.Patch) -> None:
        """See ``kopf.ProgressStorage.purge``."""
        if self.shards.owns(body):
            self.inner.purge(key=key, body=body, patch=patch)

    def touch(self, *, body: kopf.Body, patch: kopf.Patch, value: str | None) -> None:
        """See ``kopf.ProgressStorage.touch``."""
        if self.shards.owns(body):
            self.inner.touch(body=body, patch=patch, value=value)

    def clear(self, *, essence: kopf.BodyEssence) -> kopf.BodyEssence:
        """See ``kopf.ProgressStorage.clear``."""
        return self.inner.clear(essence=essence)


class ShardDiffBaseStorage(kopf.DiffBaseStorage):
    """``inner``, whose ``store`` records only objects this process owns."""

    def __init__(self, inner: kopf.DiffBaseStorage, shards: RunShards) -> None:
        """``inner``: the last-handled storage of owned objects."""
        super().__init__()
        self.inner = inner
        self.shards = shards

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        """See ``kopf.DiffBaseStorage.build``."""
        return self.inner.build(body=body, extra_fields=extra_fields)

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        """See ``kopf.DiffBaseStorage.fetch``."""
        return self.inner.fetch(body=body)

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        """See ``kopf.DiffBaseStorage.store``."""
        if self.shards.owns(body):
            self.inner.store(body=body, patch=patch, essence=essence)
