"""The worker's view of a run's history: the shared fold (``agentrun.history``) plus a cache.

The cache keeps the state after the last commit this worker saw, so a run whose turns land on
the same worker costs no reads. Only a run whose config the operator sealed, for the run the
TurnRequest names, is loaded at all (``trust.Untrusted`` otherwise), and only such runs are
cached: a cached run was checked once, and every event read after it is checked as it is
folded in.
"""

from __future__ import annotations

import asyncio
import contextlib

import cachetools

from agentrun.bus import Bus
from agentrun.history import CorruptHistory, LoadedRun, fold, weight
from agentrun.protocol import TurnRequest
from agentrun.trust import SealFault, Untrusted, Verifier

__all__ = ["CorruptHistory", "LoadedRun", "RunCache", "fold", "load", "weight"]


RUN_CACHE_BYTES = 128 * 2**20
"""What the runs a worker caches may weigh together (`RunCache`, by `weight`).
A run's state holds its whole conversation: at ``AGENTRUN_RUN_EVENT_MAX_BYTES`` (8 MiB) of
events made of small tool results it took 25 MiB parsed, so 1,024 such runs of one tenant
(the count the cache was bounded by alone) would hold some 25 GiB of a worker limited to 1 GiB
(the chart's default)."""
RUN_CACHE_RUNS = 1024
"""Runs a worker caches at most, however light: each weighs at least ``bytes // runs``."""


class RunCache:
    """LRU of ``run uid → LoadedRun``, bounded by weight: at most ``capacity`` bytes
    (``weight``) and ``runs`` runs (each weighing at least ``capacity // runs``). A run
    heavier than the whole capacity is not cached (read again at its next turn)."""

    def __init__(self, capacity: int = RUN_CACHE_BYTES, *, runs: int = RUN_CACHE_RUNS) -> None:
        """``capacity``: bytes; ``runs``: at least 1."""
        self.capacity = capacity
        self._least = max(capacity // max(runs, 1), 1)
        self._runs: cachetools.LRUCache[str, LoadedRun] = cachetools.LRUCache(
            capacity, getsizeof=self._weight
        )

    def _weight(self, run: LoadedRun) -> int:
        return max(weight(run), self._least)

    @property
    def weight(self) -> int:
        """What the cached runs weigh together (bytes)."""
        return int(self._runs.currsize)

    def __len__(self) -> int:
        return len(self._runs)

    def get(self, run_uid: str) -> LoadedRun | None:
        """The cached run, marked as recently used."""
        return self._runs.get(run_uid)

    def put(self, run: LoadedRun) -> None:
        """Remember ``run`` (evicting the least recently used past the capacity); a run
        heavier than the capacity is forgotten instead."""
        if self._weight(run) > self.capacity:
            self.drop(run.config.uid)
            return
        self._runs[run.config.uid] = run

    def drop(self, run_uid: str) -> None:
        """Forget a run."""
        self._runs.pop(run_uid, None)


FOLD_BYTES = 2**20
"""Bytes of a run's events read before they are folded into its state (and let go): a load
holds the state and at most this much more (plus one event), however long the run. Read
whole, a run at the 8 MiB event cap of small tool results held its events parsed (some 25
MiB) beside its state (as much again) at each load, up to ``AGENTRUN_WORKER_CONCURRENCY``
loads at once."""


async def _read_folded(
    bus: Bus, request: TurnRequest, *, base: LoadedRun | None, seals: Verifier
) -> LoadedRun | None:
    """``base`` (the cached run, or ``None``) with the run's events after it folded in,
    ``FOLD_BYTES`` of them at a time (off the loop: a replay checks final answers against the
    run's output schema). An admission among the events after a cached run is a re-seal, or
    the run's events were purged and the run admitted again (a rerun), whose history the
    cache does not hold: every event is then read and folded afresh. Raises as ``fold``."""
    loaded, chunk, size, afresh = base, [], 0, False
    events = bus.iter_events(request.namespace, request.name, after_seq=base.seq if base else 0)
    async with contextlib.aclosing(events):
        async for event in events:
            if base is not None and event.kind == "admitted":
                afresh = True
                break
            chunk.append(event)
            size += event.size
            if size >= FOLD_BYTES:
                loaded = await asyncio.to_thread(
                    fold, chunk, run_uid=request.run_uid, base=loaded, seals=seals
                )
                chunk, size = [], 0
    if afresh:  # what was folded onto the cached run let go before the run is read again
        loaded = base = None
        chunk.clear()
        return await _read_folded(bus, request, base=None, seals=seals)
    if chunk:
        loaded = await asyncio.to_thread(
            fold, chunk, run_uid=request.run_uid, base=loaded, seals=seals
        )
    return loaded


async def load(
    bus: Bus, cache: RunCache, request: TurnRequest, *, seals: Verifier
) -> LoadedRun | None:
    """The run as of ``request.expected_seq`` or later; ``None`` if it has no admission.

    Reads only the events after the cached ones, unless one of them is an admission: then
    the run's events may have been purged and the run admitted again (a rerun keeps its uid
    and starts over at turn 0), so all of them are read and folded afresh, never on top of
    the cached state. The caller compares ``seq`` with ``request.expected_seq`` to spot a
    stale request.

    Raises ``CorruptHistory``, and ``trust.Untrusted`` when the run's config is not sealed by
    the operator (not yet re-sealed, forged, or sealed for another run than ``request``'s) or
    an event the operator must have sealed is not its.
    """
    cached = cache.get(request.run_uid)
    if cached is not None and cached.seq == request.expected_seq:
        return cached
    base = cached if cached is not None and cached.seq < request.expected_seq else None
    loaded = await _read_folded(bus, request, base=base, seals=seals)
    if loaded is None:
        return None
    config = loaded.config
    if (config.namespace, config.name) != (request.namespace, request.name):
        raise Untrusted(
            SealFault.WRONG_RUN,
            f"run {request.run_uid} on {request.namespace}/{request.name} carries the config of "
            f"{config.namespace}/{config.name}",
        )
    if not loaded.sealed:
        raise Untrusted(
            SealFault.UNSIGNED,
            f"run {request.run_uid}'s config carries no seal of the operator (admitted before "
            "seals: the operator re-seals it, or refuses it)",
        )
    cache.put(loaded)
    return loaded
