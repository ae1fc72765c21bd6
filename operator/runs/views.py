"""The operator's view of a live run, and the vitals read off it: the run span and the phase
gauge's counts.

What belongs here: ``RunView`` (everything in it derivable from the run's events) and pure
functions of views. What does not: consuming events or writing status (``dispatch``).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from agentrun import kernel, telemetry
from agentrun.protocol import RunConfig

from . import status
from .keys import RunKey


@dataclasses.dataclass(slots=True)
class RunView:
    """What the operator keeps about a live run (all of it derivable from the run's events)."""

    namespace: str
    name: str
    uid: str
    tenant: str
    deadline: float
    start_time: float
    generation: int = 1
    seq: int = 0
    """Sequence of the last event processed."""
    stored: int = 0
    """Bytes the run's events take, after the last event processed (its ``stored``)."""
    summary: kernel.RunSummary | None = None
    """The run's counters and phase after the last event processed."""
    terminal: bool = False
    traceparent: str | None = None
    """The run span's W3C context (from the admitted event)."""
    model: str = ""
    """The provider's model name (``gen_ai.request.model``)."""
    agent_model: str = ""
    """The AgentModel's name (events about the model are recorded on it)."""
    timer: asyncio.Task[None] | None = None
    queued_seq: int = 0
    """Stream sequence of the run's last TurnRequest in the work queue (0: none published)."""
    checked_at: float = 0.0
    """When that TurnRequest was published or last seen still queued; with none published,
    when the turn was handed to the turn gate (epoch seconds)."""
    queued_at: float = 0.0
    """When that TurnRequest was published (epoch seconds; 0: none published)."""
    awaiting_since: float = 0.0
    """When the run last started waiting for a person's decision (epoch seconds; 0 while it
    does not wait)."""
    redispatches: int = 0
    """Times the pending turn was published again after its TurnRequest was lost."""
    admitted_seq: int = 0
    """Stream sequence of the run's (sealed or vouched-for) first admission: events before it
    belong to something else on the subject, and an ``admitted`` event after it is a re-seal
    to check."""
    life: int = 0
    """The life of the run followed (the ``reruns`` its admission sealed): its ledger close
    names it, so a rerun's slot is left alone (``LedgerStore.close_run``)."""
    budget: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """The caps it was admitted with, as ``.status.budget`` shows them
    (``status.admitted_budget``)."""

    @property
    def key(self) -> RunKey:
        """The object this view projects to."""
        return RunKey(self.namespace, self.name, self.uid)

    def advance(self, seq: int, summary: kernel.RunSummary, *, at: float, stored: int = 0) -> None:
        """Take the event at stream sequence ``seq``, made at ``at`` (epoch seconds), whose
        summary is ``summary`` and after which the run's events take ``stored`` bytes: note
        when the run started waiting for a person."""
        waiting = summary.phase is kernel.Phase.AWAITING_APPROVAL
        if not waiting:
            self.awaiting_since = 0.0
        elif not self.awaiting_since:
            self.awaiting_since = at
        self.seq, self.summary, self.stored = seq, summary, stored

    @classmethod
    def of(
        cls, config: RunConfig, *, start_time: float, generation: int = 1, admitted_seq: int = 0
    ) -> RunView:
        """A fresh view of an admitted run (admitted at stream sequence ``admitted_seq``)."""
        return cls(
            config.namespace,
            config.name,
            config.uid,
            config.tenant,
            config.deadline,
            start_time,
            generation,
            traceparent=config.traceparent,
            model=config.model.model,
            agent_model=config.model.name,
            admitted_seq=admitted_seq,
            life=config.reruns,
            budget=status.admitted_budget(config, start_time=start_time),
        )


def run_span(view: RunView, summary: kernel.RunSummary, *, end: float) -> telemetry.RunSpan:
    """The ``invoke_agent`` span of a run that ended with ``summary`` at ``end`` (epoch s)."""
    terminal = kernel.conclude(summary.phase, steps=summary.steps)
    assert terminal is not None, "only an ended run has a run span"
    usage = summary.usage
    return telemetry.RunSpan(
        traceparent=view.traceparent,
        name=view.name,
        run_uid=view.uid,
        model=view.model,
        start=view.start_time,
        end=end,
        vitals={
            "gen_ai.usage.input_tokens": usage.input_tokens,
            "gen_ai.usage.output_tokens": usage.output_tokens,
            "gen_ai.usage.reasoning.output_tokens": usage.reasoning_tokens,
            "agentrun.terminal_reason": terminal.reason.value,
            "agentrun.outcome": terminal.outcome.value,
            "agentrun.steps": summary.steps,
            "agentrun.tool_calls": summary.tool_calls,
            "agentrun.tool_failures": summary.tool_failures,
            "agentrun.corrections": summary.corrections,
            "agentrun.cost_usd": float(usage.cost_usd),
            "agentrun.tenant": view.tenant,
            "k8s.namespace.name": view.namespace,
        },
        error_type=None if terminal.outcome is kernel.Outcome.OK else terminal.reason.value,
    )


def phase_counts(
    live: Iterable[RunView], queued: Mapping[str, int]
) -> collections.Counter[tuple[str, str]]:
    """Runs per ``(tenant, resource phase)``: live views that have not ended (Running or
    AwaitingApproval) plus the runs waiting in each tenant's queue (Queued)."""
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for view in live:
        phase = view.summary.phase if view.summary is not None else kernel.Phase.RUNNING
        if not phase.is_terminal:
            resource = (
                kernel.ResourcePhase.AWAITING_APPROVAL
                if phase is kernel.Phase.AWAITING_APPROVAL
                else kernel.ResourcePhase.RUNNING
            )
            counts[(view.tenant, resource.value)] += 1
    for tenant, waiting in queued.items():
        if waiting:
            counts[(tenant, kernel.ResourcePhase.QUEUED.value)] += waiting
    return counts


def oldest_approvals(live: Iterable[RunView]) -> dict[str, float]:
    """Per tenant, when its longest-waiting run started waiting for a person's decision
    (epoch seconds); tenants with no run waiting are left out."""
    oldest: dict[str, float] = {}
    for view in live:
        if view.awaiting_since and not view.terminal:
            oldest[view.tenant] = min(
                oldest.get(view.tenant, view.awaiting_since), view.awaiting_since
            )
    return oldest
