"""What a run that is not running shows: the ``Queued`` status of a waiting run, the terminal
status of a run that ends without being admitted, and the Kubernetes Events of both.

What belongs here: projecting a tenant queue's waiting runs into their status (position and
reason, written only when either changed; one Event per reason) and ending a run that was never
admitted (rejected spec, no tenant, no budget under ``whenExhausted: Fail``, cancelled while
queued), counted once. What does not: deciding which run is admitted or waits (``pump``), the
status bodies themselves and writing them (``runs``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from agentrun import kernel
from agentrun.ledger import QueuedRun
from agentrun.protocol import DEFAULT_TENANT

from .. import runs, tenants
from ..platform.events import EventRecorder, EventType, Involved

log = logging.getLogger(__name__)


class StatusSubmitter(Protocol):
    """Where run status bodies go (``StatusWriter``)."""

    def submit(
        self,
        run: runs.RunKey,
        body: Mapping[str, Any],
        *,
        seq: int,
        terminal: bool,
        on_end: Callable[[], None] | None = None,
    ) -> None:
        """Queue ``body`` as the run's status; ``on_end`` runs once this write ends the run."""


@dataclasses.dataclass(slots=True)
class Waiting:
    """What this operator knows of a queued run's status."""

    generation: int = 1
    """The AgentRun's ``metadata.generation``, written as the status' observed generation."""
    shown: tuple[int, str] | None = None
    """(position, reason) last written to the run's status."""


@dataclasses.dataclass(frozen=True, slots=True)
class QueueStatus:
    """Writes the status of runs that wait in a queue or end without being admitted."""

    writer: StatusSubmitter
    counter: runs.LiveRuns
    """Counts a run's end once (``count_end``)."""
    events: EventRecorder
    clock: Callable[[], float]
    """Epoch seconds."""

    def end_unadmitted(
        self,
        key: runs.RunKey,
        phase: kernel.Phase,
        message: str,
        *,
        tenant: str | None,
        generation: int,
        seq: int = 0,
    ) -> None:
        """End a run that was never admitted (or is not admitted again: ``seq`` is the event
        sequence its status shows, so the end is not taken for an older projection): write
        its terminal status; the write that ends the object counts the end and records its
        Event."""
        log.info("%s/%s ends unadmitted (%s): %s", key.namespace, key.name, phase.value, message)
        body = runs.rejected_status(
            message, at=self.clock(), generation=generation, phase=phase, tenant=tenant
        )
        state = kernel.stop(kernel.initial_state(goal=""), phase, message)

        def ended() -> None:  # counted once: only by the write that ended the object
            if self.counter.count_end(key.uid, state, tenant=tenant or DEFAULT_TENANT):
                runs.record_end(self.events, key, state.summary(), model=None)

        self.writer.submit(key, body, seq=seq, terminal=True, on_end=ended)

    def show_queued(
        self,
        tenant: str,
        waiting: list[QueuedRun],
        wait: tenants.QueueWait,
        *,
        seen: dict[str, Waiting],
    ) -> None:
        """Show ``waiting`` (the tenant's queue from its blocked head on) as ``Queued`` with
        their positions and why the head waits; ``seen`` (uid → what the status shows) is
        updated, so an unchanged position and reason is not written again."""
        now = self.clock()
        for position, run in enumerate(waiting, start=1):
            known = seen.setdefault(run.uid, Waiting())
            shown = (position, wait.reason)
            if known.shown == shown:
                continue
            if known.shown is None or known.shown[1] != wait.reason:  # an event per reason
                self.events.record(
                    Involved("AgentRun", run.name, run.namespace, run.uid),
                    type=EventType.NORMAL,
                    reason="Queued",
                    message=f"queued in AgentTenant {tenant!r} ({wait.reason}): {wait.message}",
                    key=(run.uid, "Queued", wait.reason),
                )
            known.shown = shown
            why = (
                wait.message
                if position == 1
                else f"behind {position - 1} run(s); the first waits because {wait.message}"
            )
            body = runs.queued_status(
                tenant=tenant,
                reason=wait.reason.value,
                message=f"queued in AgentTenant {tenant!r} at position {position}: {why}",
                position=position,
                at=now,
                generation=known.generation,
            )
            self.writer.submit(
                runs.RunKey(run.namespace, run.name, run.uid), body, seq=0, terminal=False
            )
