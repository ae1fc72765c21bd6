"""Rebuild a run's state from its committed events (the checkpoint), for worker and operator.

The run's event subject is the source of truth: replaying it through the kernel gives the
exact state the next turn builds on. Pure: the caller reads the events.
"""

from __future__ import annotations

import dataclasses

from agentrun import kernel
from agentrun.protocol import RunConfig, RunEvent


class CorruptHistory(Exception):
    """The run's events cannot be replayed (wrong run, missing admission, out-of-order turns)."""


@dataclasses.dataclass(frozen=True, slots=True)
class LoadedRun:
    """A run's config and its state as of event ``seq``."""

    config: RunConfig
    state: kernel.RunState
    seq: int
    committer: str = ""
    """The delivery (ledger hold owner) that committed the run's last turn, as its turn event
    names it ("" if none did)."""
    stored: int = 0
    """Bytes of the run's events up to ``seq`` (``RunEvent.stored``; for events written
    before it was counted, the sum of the sizes read)."""


def _apply(loaded: LoadedRun, event: RunEvent) -> kernel.RunState:
    if event.kind == "turn" and event.record is not None:
        return kernel.advance(loaded.state, event.record, loaded.config.limits)
    if event.kind == "approval" and event.approval is not None:
        return kernel.resolve_approval(
            loaded.state, digest=event.approval.digest, approved=event.approval.approved
        )
    return kernel.stop(loaded.state, event.phase, event.summary.message)


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
            loaded = LoadedRun(config, state, event.seq, stored=event.stored)
            continue
        if loaded is None:
            raise CorruptHistory(f"event {event.seq} comes before the run's admission")
        try:
            state = _apply(loaded, event)
        except ValueError as err:
            raise CorruptHistory(f"event {event.seq}: {err}") from err
        committer = event.owner if event.kind == "turn" else loaded.committer
        stored = max(event.stored_before, loaded.stored) + event.size
        loaded = LoadedRun(loaded.config, state, event.seq, committer, stored)
    return loaded
