"""Closed vocabularies of a run's life: loop phases, terminal reasons, outcomes.

The terminal vocabulary is public API (written to ``.status`` and metric labels).
``conclude`` is the one exhaustive mapping from a loop phase to what a run's ``.status`` says
about its end.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import assert_never


class TerminalReason(enum.StrEnum):
    """Why a run ended: a closed set (public API), written to ``.status.terminalReason``."""

    COMPLETED = "completed"
    CANCELLED = "cancelled"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    MAX_STEPS = "max_steps"
    TOOL_BUDGET_EXHAUSTED = "tool_budget_exhausted"
    TOKEN_BUDGET_EXHAUSTED = "token_budget_exhausted"
    COST_BUDGET_EXHAUSTED = "cost_budget_exhausted"
    TENANT_BUDGET_EXHAUSTED = "tenant_budget_exhausted"
    NO_PROGRESS = "no_progress"
    INVALID_DECISION = "invalid_decision"
    INVALID_OUTPUT = "invalid_output"
    REFUSED = "refused"
    MODEL_ERROR = "model_error"
    TOOL_UNAVAILABLE = "tool_unavailable"
    CHECKPOINT_FAILED = "checkpoint_failed"
    EFFECT_UNKNOWN = "effect_unknown"
    INVALID_SPEC = "invalid_spec"


class Outcome(enum.StrEnum):
    """What a finished run delivered: ``ok`` only for ``completed``; ``partial`` for a run that
    worked (the model answered at least once) but ended without an answer; ``none`` for a run
    that did nothing — its spec rejected, a budget exhausted before the first call, the
    provider refusing to serve it (an error or a content filter), cancelled before any answer.
    """

    OK = "ok"
    PARTIAL = "partial"
    NONE = "none"


class ResourcePhase(enum.StrEnum):
    """``.status.phase`` of an AgentRun: a high-level summary (Kubernetes API conventions)."""

    PENDING = "Pending"
    QUEUED = "Queued"
    RUNNING = "Running"
    AWAITING_APPROVAL = "AwaitingApproval"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


class Phase(enum.StrEnum):
    """The loop's own phase: running, waiting for a person, or the one way it ended.

    Every terminal member has the value of its ``TerminalReason`` so the two convert by value.
    """

    RUNNING = "running"
    AWAITING_APPROVAL = "awaiting_approval"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    MAX_STEPS = "max_steps"
    TOOL_BUDGET_EXHAUSTED = "tool_budget_exhausted"
    TOKEN_BUDGET_EXHAUSTED = "token_budget_exhausted"
    COST_BUDGET_EXHAUSTED = "cost_budget_exhausted"
    TENANT_BUDGET_EXHAUSTED = "tenant_budget_exhausted"
    NO_PROGRESS = "no_progress"
    INVALID_DECISION = "invalid_decision"
    INVALID_OUTPUT = "invalid_output"
    REFUSED = "refused"
    MODEL_ERROR = "model_error"
    TOOL_UNAVAILABLE = "tool_unavailable"
    CHECKPOINT_FAILED = "checkpoint_failed"
    EFFECT_UNKNOWN = "effect_unknown"
    INVALID_SPEC = "invalid_spec"

    @property
    def is_terminal(self) -> bool:
        """True for every phase but ``running`` and ``awaiting_approval``."""
        return self not in (Phase.RUNNING, Phase.AWAITING_APPROVAL)


@dataclasses.dataclass(frozen=True, slots=True)
class Terminal:
    """How a finished loop is reported on the resource."""

    reason: TerminalReason
    """The typed terminal reason (``.status.terminalReason``)."""
    outcome: Outcome
    """``ok`` for a completed run, ``partial`` when it worked, ``none`` when it did nothing."""
    resource_phase: ResourcePhase
    """``Succeeded``, ``Failed`` or ``Cancelled``."""


def conclude(phase: Phase, *, steps: int) -> Terminal | None:
    """Map a loop phase to its terminal report; ``None`` while the run is still running.

    ``steps`` is the number of model calls the model answered (``RunState.steps``): a run that
    ended with none has outcome ``none``, whatever the reason. Exhaustive over ``Phase``
    (checked by ``assert_never``): adding a phase without deciding how it ends is a type error.
    """
    terminal = _conclude(phase)
    if terminal is None or terminal.outcome is Outcome.OK or steps > 0:
        return terminal
    return dataclasses.replace(terminal, outcome=Outcome.NONE)


def _conclude(phase: Phase) -> Terminal | None:
    match phase:
        case Phase.RUNNING | Phase.AWAITING_APPROVAL:
            return None
        case Phase.COMPLETED:
            return Terminal(TerminalReason.COMPLETED, Outcome.OK, ResourcePhase.SUCCEEDED)
        case Phase.CANCELLED:
            return Terminal(TerminalReason.CANCELLED, Outcome.PARTIAL, ResourcePhase.CANCELLED)
        case (
            Phase.DEADLINE_EXCEEDED
            | Phase.MAX_STEPS
            | Phase.TOOL_BUDGET_EXHAUSTED
            | Phase.TOKEN_BUDGET_EXHAUSTED
            | Phase.COST_BUDGET_EXHAUSTED
            | Phase.TENANT_BUDGET_EXHAUSTED
            | Phase.NO_PROGRESS
            | Phase.INVALID_DECISION
            | Phase.INVALID_OUTPUT
            | Phase.REFUSED
            | Phase.MODEL_ERROR
            | Phase.TOOL_UNAVAILABLE
            | Phase.CHECKPOINT_FAILED
            | Phase.EFFECT_UNKNOWN
            | Phase.INVALID_SPEC
        ):
            return Terminal(TerminalReason(phase.value), Outcome.PARTIAL, ResourcePhase.FAILED)
        case _:
            assert_never(phase)
