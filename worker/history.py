"""Rebuild a run's state from its committed events, with a per-process cache.

The run's event subject is the checkpoint (DESIGN.md §5): replaying it through
``kernel.advance`` gives the exact state a turn builds on. The cache keeps the state after the
last commit this worker saw, so a run whose turns land on the same worker costs no reads.
"""

from __future__ import annotations

import collections
import dataclasses

from agentrun import kernel
from agentrun.bus import Bus
from agentrun.protocol import RunConfig, RunEvent, TurnRequest


class CorruptHistory(Exception):
    """The run's events cannot be replayed (wrong run, missing admission, out-of-order turns)."""


@dataclasses.dataclass(frozen=True, slots=True)
class LoadedRun:
    """A run's config and its state as of event ``seq``."""

    config: RunConfig
    state: kernel.RunState
    seq: int


def fold(
    events: list[RunEvent], *, run_uid: str, base: LoadedRun | None = None
) -> LoadedRun | None:
    """Replay ``events`` (oldest first) on top of ``base``; ``None`` if the run was never admitted.

    Raises ``CorruptHistory`` when an event belongs to another run or does not apply.
    """
    loaded = base
    for event in events:
        if event.run_uid != run_uid:
            raise CorruptHistory(f"event {event.seq} belongs to run {event.run_uid}, not {run_uid}")
        if event.kind == "admitted":
            if event.config is None:
                raise CorruptHistory(f"admission event {event.seq} has no config")
            config = event.config
            state = kernel.initial_state(goal=config.goal, instructions=config.instructions)
            loaded = LoadedRun(config, state, event.seq)
            continue
        if loaded is None:
            raise CorruptHistory(f"event {event.seq} comes before the run's admission")
        if event.kind == "turn" and event.record is not None:
            try:
                state = kernel.advance(loaded.state, event.record, loaded.config.limits)
            except ValueError as err:
                raise CorruptHistory(str(err)) from err
        else:
            state = kernel.stop(loaded.state, event.phase, str(event.summary.get("message", "")))
        loaded = LoadedRun(loaded.config, state, event.seq)
    return loaded


class RunCache:
    """LRU of ``run uid → LoadedRun`` (bounded: ``capacity`` runs)."""

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self._runs: collections.OrderedDict[str, LoadedRun] = collections.OrderedDict()

    def get(self, run_uid: str) -> LoadedRun | None:
        """The cached run, marked as recently used."""
        run = self._runs.get(run_uid)
        if run is not None:
            self._runs.move_to_end(run_uid)
        return run

    def put(self, run: LoadedRun) -> None:
        """Remember ``run`` (evicting the least recently used past capacity)."""
        self._runs[run.config.uid] = run
        self._runs.move_to_end(run.config.uid)
        while len(self._runs) > self.capacity:
            self._runs.popitem(last=False)

    def drop(self, run_uid: str) -> None:
        """Forget a run."""
        self._runs.pop(run_uid, None)


async def load(bus: Bus, cache: RunCache, request: TurnRequest) -> LoadedRun | None:
    """The run as of ``request.expected_seq`` or later; ``None`` if it has no admission.

    Reads only the events after the cached ones. The caller compares ``seq`` with
    ``request.expected_seq`` to spot a stale request.
    """
    cached = cache.get(request.run_uid)
    if cached is not None and cached.seq == request.expected_seq:
        return cached
    base = cached if cached is not None and cached.seq < request.expected_seq else None
    events = await bus.read_events(
        request.namespace, request.name, after_seq=base.seq if base else 0
    )
    loaded = fold(events, run_uid=request.run_uid, base=base)
    if loaded is not None:
        cache.put(loaded)
    return loaded
