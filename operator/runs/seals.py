"""Zero trust in what a run's subject holds, on the operator's side: seal what the operator
appends, judge what it reads, re-seal the runs admitted before seals, refuse and report the
rest.

The operator is the only holder of the run-signing key. It seals every ``admitted`` event (the
run's whole config) and every reviewer's ``approval`` it appends, and it follows a run only
through a config whose seal verifies for that run's subject (``trust.Verifier``): an event it
did not seal — a forged admission on a new subject, a second admission of a running run with
another config, a forged approval — is refused. A refused run ends ``checkpoint_failed`` (its
checkpoint, the event stream, holds what the operator did not write; no other reason of the
closed vocabulary says so), with a ``MessageRefused`` Warning Event on the AgentRun and
``agentrun_messages_refused_total{reason}`` counting the message.

Runs admitted before seals existed (an upgrade from an open bus) have an unsealed first
admission. Such a run is re-sealed once — the operator appends the same config under its seal,
and the run goes on from there — only when the API server vouches for it: the AgentRun with
that uid exists and its status, which only the operator writes, shows it admitted on this
stream and running (``vouched``). Anything else unsealed is refused.

What belongs here: those judgements, the re-seal, the refusal and its report. What does not:
following runs and acting on their events (``dispatch``, which alone holds the live views),
the signature arithmetic (``agentrun.trust``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Protocol

import cachetools

from agentrun import history, kernel, metrics
from agentrun.bus import CommitConflict
from agentrun.protocol import RunConfig, RunEvent
from agentrun.trust import SealFault, Signer, Untrusted, Verifier, refusal

from ..platform.events import EventRecorder, EventType
from ..platform.kubeapi import KubeApi
from .keys import RunKey
from .news import involved

log = logging.getLogger(__name__)

REFUSED_REASON = "MessageRefused"
"""The Warning Event's reason when a run's event is refused."""
VOUCHING_PHASES = frozenset({"Running", "AwaitingApproval"})
"""Phases of an AgentRun's status that show an admitted run still going."""
STOP_ATTEMPTS = 8
"""Compare-and-set attempts at ending a refused run before giving up (logged)."""
REFUSED_MEMORY = 100_000
"""Refused runs remembered (the oldest forgotten first)."""
REPLAYS_MEMORY = 64 * 2**20
"""What the runs replayed for approvals (``RunSeals.replay``) may weigh together
(``history.weight``), the least recently replayed forgotten first. Replayed afresh at each
decision and again at its event, a batch of 128 held calls of a run of 6.7 MB of events cost
the operator 2.2 s of CPU a call, 280 s for the batch that one model call held."""


class SealedLog(Protocol):
    """The run event streams as the seals read and write them (``Bus``)."""

    async def read_events(self, namespace: str, name: str, *, after_seq: int = 0) -> list[RunEvent]:
        """Every event of the run after ``after_seq``, oldest first."""

    async def first_event(self, namespace: str, name: str) -> RunEvent | None:
        """The run subject's first event, if any."""

    async def last_event(self, namespace: str, name: str) -> RunEvent | None:
        """The run subject's last event, if any."""

    async def append_event(
        self, namespace: str, name: str, event: RunEvent, *, expected_seq: int | None
    ) -> int:
        """Append by compare-and-set (``CommitConflict``); the event's sequence."""

    async def broadcast_cancel(self, run_uid: str) -> None:
        """Tell workers to drop the run's turn in flight."""


@dataclasses.dataclass(frozen=True, slots=True)
class Trusted:
    """A run the operator may follow: its sealed config and where the seal is."""

    config: RunConfig
    admitted_seq: int
    """Sequence of its first sealed (or vouched-for) admission: events before it are not
    applied (another object's, or a legacy run's past, summed up in its re-seal)."""
    start_time: float
    """Epoch seconds of its first admission."""


class RunSeals:
    """The operator's seals: signing, judging, vouching for runs from before seals, refusing."""

    def __init__(
        self,
        signer: Signer,
        verifier: Verifier,
        *,
        streams: SealedLog,
        api: KubeApi,
        events: EventRecorder,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``signer``: seals with the operator's key; ``verifier``: the trusted keys; ``streams``:
        the run event streams; ``api``: reads an AgentRun's status (``vouched``); ``events``:
        where refusals are told; ``clock``: epoch seconds."""
        self.signer = signer
        self.verifier = verifier
        self.streams = streams
        self.api = api
        self.events = events
        self.clock = clock
        self._refused: cachetools.FIFOCache[str, None] = cachetools.FIFOCache(REFUSED_MEMORY)
        """Runs refused while not followed (their later events are ignored, not refused
        again)."""
        self._replays: cachetools.LRUCache[str, history.LoadedRun] = cachetools.LRUCache(
            REPLAYS_MEMORY, getsizeof=history.weight
        )
        """Each run's last replay (``replay``) by uid."""

    async def replay(self, key: RunKey, *, through: int | None = None) -> history.LoadedRun | None:
        """Run ``key`` replayed from its events (``history.fold``: every ``admitted`` and
        ``approval`` event's seal checked) up to the sequence ``through`` (``None``: its last),
        on top of its last replay here when that ends before: only the events after it are
        read and folded. An admission among them (a re-seal, or a rerun after its events were
        purged) replays every event afresh. Raises as ``fold``."""
        kept = self._replays.get(key.uid)
        if kept is not None and through is not None and kept.seq > through:
            kept = None
        if kept is not None and kept.seq == through:
            return kept
        events = await self.streams.read_events(
            key.namespace, key.name, after_seq=kept.seq if kept else 0
        )
        events = [e for e in events if through is None or e.seq <= through]
        if kept is not None and any(e.kind == "admitted" for e in events):
            kept = None
            events = await self.streams.read_events(key.namespace, key.name)
            events = [e for e in events if through is None or e.seq <= through]
        # a replay checks final answers against the run's output schema: off the loop
        loaded = await asyncio.to_thread(
            history.fold, events, run_uid=key.uid, base=kept, seals=self.verifier
        )
        if loaded is not None and history.weight(loaded) <= REPLAYS_MEMORY:
            self._replays[key.uid] = loaded
        return loaded

    def seal(self, event: RunEvent) -> RunEvent:
        """``event`` (``admitted`` or ``approval``) with the operator's seal."""
        return self.signer.seal_event(event)

    def fault(self, event: RunEvent, *, key: RunKey) -> SealFault | None:
        """Why ``event`` is not the operator's for run ``key`` (its subject's namespace and
        name, its uid), or ``None``. Events of kinds that carry no seal are never refused."""
        if event.kind not in ("admitted", "approval"):
            return None
        if event.run_uid != key.uid:
            return SealFault.WRONG_RUN
        return self.verifier.event_fault(event, namespace=key.namespace, name=key.name)

    def is_refused(self, uid: str) -> bool:
        """Whether run ``uid`` was refused while not followed."""
        return uid in self._refused

    # --- following a run ---------------------------------------------------------------------

    async def trusted(self, key: RunKey, first: RunEvent) -> Trusted | None:
        """Run ``key`` as the operator may follow it from its ``first`` event: sealed for this
        subject; or admitted before seals and re-sealed since, or ended before it could be, or
        vouched for and re-sealed now (followed once the re-seal is read: ``None`` now). Anything
        else is refused (``None``)."""
        assert first.config is not None
        fault = self.fault(first, key=key)
        if fault is None:
            return Trusted(first.config, first.seq, first.time)
        if fault is not SealFault.UNSIGNED:
            await self.refuse(key, untrusted(first, fault), base=None, followed=False)
            return None
        return await self._legacy(key, first)

    async def _legacy(self, key: RunKey, first: RunEvent) -> Trusted | None:
        events = await self.streams.read_events(key.namespace, key.name)
        try:
            loaded = history.fold(events, run_uid=key.uid, seals=self.verifier)
        except history.CorruptHistory:
            return None  # another run's events, or a deleted one's
        except Untrusted as err:
            await self.refuse(key, err, base=None, followed=False)
            return None
        if loaded is None:
            return None
        if loaded.sealed:  # from its re-seal on (the replay checked it), whose summary holds
            # what came before
            resealed = min(e.seq for e in events if e.kind == "admitted" and e.seal is not None)
            return Trusted(loaded.config, resealed, first.time)
        if not await self.vouched(key, first):
            await self.refuse(key, untrusted(first, SealFault.UNSIGNED), base=None, followed=False)
            return None
        if events[-1].phase.is_terminal:
            return Trusted(loaded.config, first.seq, first.time)  # its end is still projected
        event = self.seal(
            RunEvent(
                "admitted", key.uid, events[-1].summary, config=loaded.config, time=self.clock()
            )
        )
        with contextlib.suppress(CommitConflict):  # it moved on: its next event returns here
            await self.streams.append_event(key.namespace, key.name, event, expected_seq=loaded.seq)
            log.info("re-sealed %s/%s, admitted before seals existed", key.namespace, key.name)
        return None

    async def vouched(self, key: RunKey, first: RunEvent) -> bool:
        """Whether the API server vouches for ``first``, an unsealed admission of run ``key``
        written before seals existed: the AgentRun with that uid exists, its status shows it
        running (``VOUCHING_PHASES``), of the config's tenant, with events up to at least
        ``first``'s sequence. Raises ``ApiError`` when the API server cannot be asked."""
        obj = await self.api.get(key.ref)
        if obj is None or (obj.get("metadata") or {}).get("uid") != key.uid:
            return False
        status = obj.get("status") or {}
        tenant = first.config.tenant if first.config is not None else None
        try:
            seen = int(status.get("lastEventSequence") or 0)
        except (TypeError, ValueError):
            return False
        return (
            status.get("phase") in VOUCHING_PHASES
            and status.get("tenant") == tenant
            and seen >= first.seq > 0
        )

    async def judge(
        self,
        key: RunKey,
        event: RunEvent,
        *,
        admitted_seq: int,
        seen: int,
        base: kernel.RunSummary | None,
    ) -> bool:
        """Whether ``event`` of the followed run ``key`` (admitted at ``admitted_seq``, applied
        up to ``seen``, last trusted summary ``base``) may be applied: not one before the
        admission (another object's), and, for an ``admitted`` or ``approval`` event other than
        the admission, the operator's — a re-seal of the same config, a decision sealed for
        this run and turn. A refused event ends the run."""
        if event.seq < admitted_seq:
            return False
        if event.kind not in ("admitted", "approval") or event.seq == admitted_seq:
            return True
        if event.seq <= seen:
            return True  # seen before; it is dropped as such
        fault = self.fault(event, key=key)
        if fault is None and event.kind == "admitted":
            first = await self.streams.first_event(key.namespace, key.name)
            if first is None or first.config != event.config:
                fault = SealFault.CHANGED_CONFIG
        if fault is None and event.kind == "approval":
            fault = await self.misplaced(key, event)
        if fault is None:
            return True
        await self.refuse(key, untrusted(event, fault), base=base, followed=True)
        return False

    async def misplaced(self, key: RunKey, event: RunEvent) -> SealFault | None:
        """Why the sealed ``approval`` event of run ``key`` is not the decision on the state
        it follows (``history``'s replay: its turn, the event it names), or ``None``. A seal
        binds no place: a copy of an earlier batch's decision, or of the run's first life
        before a rerun, verifies. Replays the run up to it (``replay``: from the decision's own
        replay on, one event); a history that does not replay is left to whoever acts on it."""
        try:
            await self.replay(key, through=event.seq)
        except Untrusted as err:
            return err.fault
        except history.CorruptHistory:
            return None
        return None

    # --- refusing ---------------------------------------------------------------------------

    async def refuse(
        self, key: RunKey, error: Untrusted, *, base: kernel.RunSummary | None, followed: bool
    ) -> None:
        """Refuse run ``key``: count and tell it (``report``), and end it ``checkpoint_failed``
        with a ``stop`` event built on ``base`` (the last summary the operator trusted;
        ``None``: nothing of the run was trusted), whatever the last event on the subject says.
        A run not ``followed`` is remembered, so its later events are not refused again."""
        message = self.report(key, error)
        if not followed:
            self._refused[key.uid] = None
        state = kernel.initial_state(goal="") if base is None else kernel.state_from_summary(base)
        state = kernel.stop(state, kernel.Phase.CHECKPOINT_FAILED, message)
        stop = RunEvent("stop", key.uid, state.summary(), time=self.clock())
        for _ in range(STOP_ATTEMPTS):
            last = await self.streams.last_event(key.namespace, key.name)
            try:
                await self.streams.append_event(
                    key.namespace, key.name, stop, expected_seq=last.seq if last else 0
                )
            except CommitConflict:
                continue
            await self.streams.broadcast_cancel(key.uid)
            return
        log.error("could not end refused run %s/%s: it keeps moving", key.namespace, key.name)

    def report(self, key: RunKey, error: Untrusted) -> str:
        """Count the refused message and tell it as a Warning Event on the AgentRun; returns
        the message the run ends with."""
        metrics.record_refusal(error.fault)
        message = f"refused: {error}; nothing of it was acted on"
        log.warning("run %s/%s: %s", key.namespace, key.name, message)
        self.events.record(
            involved(key),
            type=EventType.WARNING,
            reason=REFUSED_REASON,
            message=message,
            key=(key.uid, REFUSED_REASON, error.fault.value),
        )
        return message


def untrusted(event: RunEvent, fault: SealFault) -> Untrusted:
    """The refusal of ``event`` for ``fault``."""
    return Untrusted(fault, refusal(event, fault))
