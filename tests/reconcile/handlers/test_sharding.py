"""kopf's storages with several shards (``handlers.sharding``): a run of another shard reads as
waiting far ahead and nothing is written to it; a run of an owned shard is kopf's as before."""

from __future__ import annotations

import datetime
from typing import Any

import kopf

from agentrun.operator.handlers import sharding
from agentrun.operator.handlers import startup as handlers
from agentrun.operator.platform.shards import Ownership, RunShards, shard_of
from agentrun.operator.runs.handled import HandledActions

MINE = next(f"t{i}" for i in range(100) if shard_of(f"t{i}", 3) == 1)
THEIRS = next(f"t{i}" for i in range(100) if shard_of(f"t{i}", 3) == 2)


def body(tenant: str, annotations: dict[str, str] | None = None) -> kopf.Body:
    meta: dict[str, Any] = {"name": "r", "namespace": "ns", "uid": f"u-{tenant}"}
    meta["annotations"] = annotations or {}
    return kopf.Body({"kind": "AgentRun", "metadata": meta, "status": {"tenant": tenant}})


def storages() -> tuple[sharding.ShardProgressStorage, sharding.ShardDiffBaseStorage]:
    shards = RunShards(Ownership(3, frozenset({1})))
    progress = sharding.ShardProgressStorage(
        kopf.AnnotationsProgressStorage(prefix="kopf.agentrun.dev"), shards
    )
    diffbase = sharding.ShardDiffBaseStorage(handlers.RunDiffBaseStorage(HandledActions()), shards)
    return progress, diffbase


def test_another_shards_run_reads_as_delayed_and_is_never_written() -> None:
    progress, diffbase = storages()
    theirs = body(THEIRS, {"kopf.agentrun.dev/admit_run": '{"success": true}'})
    record = progress.fetch(key=kopf.HandlerId("admit_run"), body=theirs)
    assert record is not None and not record.get("success")  # the owner's record is not read
    delayed = datetime.datetime.fromisoformat(str(record["delayed"]))
    assert delayed > datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=30)
    patch = kopf.Patch()
    progress.store(key=kopf.HandlerId("admit_run"), record=record, body=theirs, patch=patch)
    progress.purge(key=kopf.HandlerId("admit_run"), body=theirs, patch=patch)
    progress.touch(body=theirs, patch=patch, value="x")
    diffbase.store(body=theirs, patch=patch, essence=diffbase.build(body=theirs))
    cancelled = body(THEIRS, {"agentrun.dev/cancel": "true"})
    diffbase.store(body=cancelled, patch=patch, essence=diffbase.build(body=cancelled))
    assert not patch
    assert diffbase.fetch(body=cancelled) != diffbase.build(body=cancelled)  # not remembered


def test_an_owned_runs_progress_is_written_and_its_last_handled_essence_remembered() -> None:
    progress, diffbase = storages()
    mine = body(MINE)
    assert progress.fetch(key=kopf.HandlerId("admit_run"), body=mine) is None
    patch = kopf.Patch()
    record = kopf.ProgressRecord(started="2026-01-01T00:00:00+00:00", success=True)
    progress.store(key=kopf.HandlerId("admit_run"), record=record, body=mine, patch=patch)
    diffbase.store(body=mine, patch=patch, essence=diffbase.build(body=mine))
    written = patch["metadata"]["annotations"]
    assert list(written) == ["kopf.agentrun.dev/admit_run"]  # the last-handled: in memory
    cancelled = body(MINE, {"agentrun.dev/cancel": "true"})
    assert diffbase.fetch(body=cancelled) != diffbase.build(body=cancelled)
    diffbase.store(body=cancelled, patch=patch, essence=diffbase.build(body=cancelled))
    assert diffbase.fetch(body=cancelled) == diffbase.build(body=cancelled)


async def test_kopf_runs_no_handler_of_another_shards_run_and_never_calls_it_done() -> None:
    """kopf's own progression over the storage: every handler of the run sleeps (none is
    awakened to run), the state is not done (so the change is not recorded as handled), and
    kopf waits long before it looks again."""
    from kopf._core.actions import progression

    from agentrun.operator import handlers as registered

    assert registered.REGISTERED
    handlers = list(kopf.get_default_registry()._changing.get_all_handlers())
    assert {"admit_run", "cancel_run", "rerun_run"} <= {str(h.id) for h in handlers}
    progress, _ = storages()
    theirs = body(THEIRS)
    state = progression.State.from_storage(body=theirs, storage=progress, handlers=handlers)
    state = state.with_purpose(kopf.Reason.CREATE).with_handlers(handlers)
    assert not any(state[h.id].awakened for h in handlers)
    assert not state.done
    assert min(state.delays) > 1800
    mine = body(MINE)
    fresh = progression.State.from_storage(body=mine, storage=progress, handlers=handlers)
    fresh = fresh.with_purpose(kopf.Reason.CREATE).with_handlers(handlers)
    assert all(fresh[h.id].awakened for h in handlers)


def test_no_agentrun_handler_needs_a_finalizer() -> None:
    """Deletion is handled from the watch (``run_seen`` on ``DELETED``): no handler kopf runs
    for AgentRuns asks for a finalizer, so kopf adds none (and ``run_seen`` takes the one
    earlier versions added off a run once it ends or is deleted: test_deletion)."""
    from agentrun.operator import handlers as registered

    assert registered.REGISTERED
    registry = kopf.get_default_registry()
    changing = list(registry._changing.get_all_handlers())
    spawning = list(registry._spawning.get_all_handlers())
    assert "run_seen" in {str(h.id) for h in registry._watching.get_all_handlers()}
    assert changing and not [str(h.id) for h in changing + spawning if h.requires_finalizer]
    assert handlers.LEGACY_FINALIZER == "agentrun.dev/finalizer"  # what earlier versions added
