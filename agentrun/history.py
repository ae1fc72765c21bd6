"""Rebuild a run's state from its committed events (the checkpoint), for worker and operator.

The run's event subject is the source of truth: replaying it through the kernel gives the
exact state the next turn builds on. Pure: the caller reads the events.

The replay trusts no event the operator must have written without its seal
(``agentrun.trust``): a reviewer's ``approval`` must be sealed for its run and turn, and an
``admitted`` event after the first must be the operator's seal of the very same config (it
re-seals a run admitted before seals existed; anything else is refused). The first admission
may be unsealed only in a run admitted before seals existed: the replay says so
(``LoadedRun.sealed``) and the caller acts on such a run only once it is sealed.
"""

from __future__ import annotations

import dataclasses

from agentrun import kernel
from agentrun.protocol import RunConfig, RunEvent
from agentrun.trust import SealFault, Untrusted, Verifier, refusal


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
    sealed: bool = True
    """Whether the operator's seal of ``config`` verified (on its admission or a re-seal);
    False: an admission written before seals existed, not yet re-sealed."""
    stored: int = 0
    """Bytes of the run's events up to ``seq`` (``RunEvent.stored``; for events written
    before it was counted, the sum of the sizes read)."""


def _apply(loaded: LoadedRun, event: RunEvent) -> kernel.RunState:
    if event.kind == "turn" and event.record is not None:
        return kernel.advance(loaded.state, event.record, loaded.config.limits)
    if event.kind == "approval" and event.approval is not None:
        return kernel.resolve_approval(
            loaded.state,
            digest=event.approval.digest,
            approved=event.approval.approved,
            reviewer=event.approval.reviewer,
        )
    return kernel.stop(loaded.state, event.phase, event.summary.message)


def _admit(loaded: LoadedRun | None, event: RunEvent, seals: Verifier) -> LoadedRun:
    """The run after an ``admitted`` event: its first admission (sealed, or unsealed from
    before seals), or the operator's re-seal of the same config. Raises ``Untrusted``."""
    if event.config is None:
        raise CorruptHistory(f"admission event {event.seq} has no config")
    fault = seals.event_fault(event)
    if loaded is None:
        if fault is not None and fault is not SealFault.UNSIGNED:
            raise Untrusted(fault, refusal(event, fault))
        config = event.config
        state = kernel.initial_state(goal=config.goal, instructions=config.instructions)
        return LoadedRun(config, state, event.seq, sealed=fault is None, stored=event.stored)
    if fault is not None:
        raise Untrusted(fault, refusal(event, fault))
    if event.config != loaded.config:
        raise Untrusted(SealFault.CHANGED_CONFIG, refusal(event, SealFault.CHANGED_CONFIG))
    stored = max(event.stored_before, loaded.stored) + event.size
    return dataclasses.replace(loaded, seq=event.seq, sealed=True, stored=stored)


def _check_placed(loaded: LoadedRun, event: RunEvent) -> None:
    """Raise ``Untrusted`` (``REPLAYED``) unless the sealed ``approval`` event is decided on
    the very state it follows: the run's turn (its seal's ``turn``) and, when it names one
    (every approval this release seals), the event it was decided on (``after``: the
    sequence of the event before it). The seal alone binds neither: a copy of a sealed
    decision is still sealed, wherever it is appended."""
    assert event.approval is not None
    if event.summary.turn != loaded.state.turn or (
        event.approval.after and event.approval.after != loaded.seq
    ):
        raise Untrusted(SealFault.REPLAYED, refusal(event, SealFault.REPLAYED))


def fold(
    events: list[RunEvent],
    *,
    run_uid: str,
    seals: Verifier,
    base: LoadedRun | None = None,
) -> LoadedRun | None:
    """Replay ``events`` (oldest first) on top of ``base``; ``None`` if the run was never
    admitted. ``seals`` checks every ``admitted`` and ``approval`` event.

    Raises ``CorruptHistory`` when an event belongs to another run or does not apply, and
    ``trust.Untrusted`` when an event the operator must have sealed is not its (an unsealed
    first admission is not refused here: ``LoadedRun.sealed`` is False).
    """
    loaded = base
    for event in events:
        if event.run_uid != run_uid:
            raise CorruptHistory(f"event {event.seq} belongs to run {event.run_uid}, not {run_uid}")
        if event.kind == "admitted":
            loaded = _admit(loaded, event, seals)
            continue
        if loaded is None:
            raise CorruptHistory(f"event {event.seq} comes before the run's admission")
        if event.kind == "approval":
            seals.check(event)
            _check_placed(loaded, event)
        try:
            state = _apply(loaded, event)
        except ValueError as err:
            raise CorruptHistory(f"event {event.seq}: {err}") from err
        committer = event.owner if event.kind == "turn" else loaded.committer
        stored = max(event.stored_before, loaded.stored) + event.size
        loaded = dataclasses.replace(
            loaded, state=state, seq=event.seq, committer=committer, stored=stored
        )
    return loaded


MESSAGE_WEIGHT = 1024
"""Bytes a message of a run's conversation is counted beside the bytes of its events (a
replay kept in memory: the worker's cache of runs, the operator's of approvals): what
Python holds for one beyond its text (its dict, its tool calls' dicts, their ids; measured:
8 MiB of events of 64 tool results of 60 bytes a turn held 25 MiB in 26,001 messages, 3.4 times
the events, and counted 1.35 times what it held; 64 turns of 8 results of 16 KB, 1.03 times)."""


def weight(run: LoadedRun) -> int:
    """The bytes ``run`` is counted where it is kept: its events' stored bytes and
    ``MESSAGE_WEIGHT`` a message of its conversation (no walk of the state: the same work
    whatever the run's size)."""
    return run.stored + MESSAGE_WEIGHT * len(run.state.messages)
