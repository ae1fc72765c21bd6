"""The worker's view of a run's history: the shared fold (``agentrun.history``) plus a cache.

The cache keeps the state after the last commit this worker saw, so a run whose turns land on
the same worker costs no reads. Only a run whose config the operator sealed, for the run the
TurnRequest names, is loaded at all (``trust.Untrusted`` otherwise), and only such runs are
cached: a cached run was checked once, and every event read after it is checked as it is
folded in.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import time
from collections.abc import Callable

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


PROTECTED_SECONDS = 300.0
"""A run used within this many seconds is not let go for another tenant's run while its own
tenant's cached runs weigh no more than a fair part of the cache (the capacity over the tenants
cached): a tenant churning heavy runs cannot push out the runs other tenants are using. A run
unused longer is let go in turn, whoever's, so the room of tenants gone quiet is taken back."""


@dataclasses.dataclass(slots=True)
class _Cached:
    run: LoadedRun
    size: int
    used: float
    """When it was last put or got (``RunCache``'s clock)."""


class RunCache:
    """Runs by uid, least recently used let go first, bounded by weight: at most ``capacity``
    bytes (``weight``) and ``runs`` runs (each weighing at least ``capacity // runs``). A run
    is let go for another tenant's only when unused for ``PROTECTED_SECONDS`` or when its
    tenant's runs weigh more than a fair part of the cache (``_room``): a tenant alone uses it
    all, in plain least-recently-used order, and a tenant whose runs are heavy (up to the event
    cap, some 35 MB counted each) pushes out its own runs, not the runs other tenants use. A
    run that cannot fit so (heavier than the capacity, or than what the others leave) is not
    cached: it is read again at its next turn. ``clock``: monotonic seconds."""

    def __init__(
        self,
        capacity: int = RUN_CACHE_BYTES,
        *,
        runs: int = RUN_CACHE_RUNS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``capacity``: bytes; ``runs``: at least 1."""
        self.capacity = capacity
        self.clock = clock
        self._least = max(capacity // max(runs, 1), 1)
        self._runs: collections.OrderedDict[str, _Cached] = collections.OrderedDict()
        """uid → the cached run, least recently used first."""
        self._weights: collections.Counter[str] = collections.Counter()
        """Tenant → what its cached runs weigh."""
        self._weight = 0

    @property
    def weight(self) -> int:
        """What the cached runs weigh together (bytes)."""
        return self._weight

    def tenant_weight(self, tenant: str) -> int:
        """What tenant ``tenant``'s cached runs weigh together (bytes)."""
        return self._weights[tenant]

    def __len__(self) -> int:
        return len(self._runs)

    def get(self, run_uid: str) -> LoadedRun | None:
        """The cached run, marked as recently used."""
        found = self._runs.get(run_uid)
        if found is None:
            return None
        self._runs.move_to_end(run_uid)
        found.used = self.clock()
        return found.run

    def put(self, run: LoadedRun) -> None:
        """Remember ``run``, letting go what ``_room`` chooses; when nothing may be let go
        so that it fits, ``run`` is forgotten instead (and nothing let go)."""
        uid, tenant = run.config.uid, run.config.tenant
        self.drop(uid)
        size, now = max(weight(run), self._least), self.clock()
        room = self._room(tenant, size, now)
        if room is None:
            return
        for other in room:
            self.drop(other)
        self._runs[uid] = _Cached(run, size, now)
        self._weights[tenant] += size
        self._weight += size

    def _room(self, tenant: str, size: int, now: float) -> list[str] | None:
        """The runs to let go, least recently used first, so that a run of ``size`` bytes of
        ``tenant`` fits: ``tenant``'s own, any unused for ``PROTECTED_SECONDS``, and another
        tenant's while that tenant weighs more than a fair part (``capacity`` over the tenants
        cached, ``tenant`` included, counted with the new run); None when those are not
        enough."""
        need = self._weight + size - self.capacity
        if need <= 0:
            return []
        fair = self.capacity // len({*self._weights, tenant})
        weights = collections.Counter(self._weights)
        weights[tenant] += size
        chosen = []
        for uid, cached in self._runs.items():
            owner = cached.run.config.tenant
            if owner == tenant or now - cached.used >= PROTECTED_SECONDS or weights[owner] > fair:
                chosen.append(uid)
                weights[owner] -= cached.size
                need -= cached.size
                if need <= 0:
                    return chosen
        return None

    def drop(self, run_uid: str) -> None:
        """Forget a run."""
        cached = self._runs.pop(run_uid, None)
        if cached is None:
            return
        tenant = cached.run.config.tenant
        self._weights[tenant] -= cached.size
        self._weight -= cached.size
        if self._weights[tenant] <= 0:
            del self._weights[tenant]


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
