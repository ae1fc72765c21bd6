"""The run state: one immutable value folded over committed turns."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from agentrun.kernel.approval import HeldCall, PendingBatch
from agentrun.kernel.terminal import Phase
from agentrun.kernel.usage import Usage

Message = Mapping[str, Any]
"""A chat message in the OpenAI chat-completions shape (role, content, tool_calls, tool_call_id)."""


@dataclasses.dataclass(frozen=True, slots=True)
class RunSummary:
    """A run's counters and phase after an event: what the event carries and ``.status``
    projects (the transcript stays in the events). Its JSON shape is ``protocol``'s."""

    phase: Phase
    turn: int = 0
    """Committed turns so far (= the index of the next turn)."""
    steps: int = 0
    tool_calls: int = 0
    tool_failures: int = 0
    corrections: int = 0
    usage: Usage = dataclasses.field(default_factory=Usage)
    answer: str | None = None
    message: str = ""
    pending_approval: HeldCall | None = None
    """The held call a reviewer must decide next (only while awaiting approval)."""
    held_for_approval: tuple[HeldCall, ...] = ()
    """Every call of that batch a reviewer decides, in call order, with the decisions made so
    far (``approved``: ``None`` still undecided); empty unless awaiting approval."""
    tool_calls_not_run: int = 0
    """Valid calls that never ran: their batch did not fit a budget, or a reviewer denied them."""

    @property
    def last_turn(self) -> int:
        """The last committed turn (-1: none yet), the turn the ledger settles up to."""
        return self.turn - 1


@dataclasses.dataclass(frozen=True, slots=True)
class RunState:
    """Everything the loop knows about a run after ``turn`` committed turns."""

    messages: tuple[Message, ...]
    """The conversation sent to the model next: system, goal, then every committed turn."""
    turn: int = 0
    """Index of the next turn (= committed turns so far)."""
    steps: int = 0
    """Model calls made (corrective turns included)."""
    tool_calls: int = 0
    """Tool calls that ran (valid calls only)."""
    tool_failures: int = 0
    """Tool calls that ran and failed, plus calls rejected before running (invalid calls);
    calls that were not run are counted in ``tool_calls_not_run`` only."""
    tool_calls_not_run: int = 0
    """Valid calls that never ran: their batch did not fit a budget, or a reviewer denied them."""
    corrections: int = 0
    """Corrective turns sent back to the model."""
    malformed_streak: int = 0
    """Consecutive malformed turns; a good turn resets it."""
    usage: Usage = dataclasses.field(default_factory=Usage)
    """Tokens and cost so far."""
    phase: Phase = Phase.RUNNING
    """Running, or how the run ended."""
    answer: str | None = None
    """The final answer (only for ``completed``)."""
    message: str = ""
    """A one-line human explanation of the current phase."""
    call_ids: frozenset[str] = frozenset()
    """Every ``tool_call_id`` in history, to keep them unique."""
    signatures: frozenset[str] = frozenset()
    """Result signatures of every turn that ran tools (the no-progress breaker's memory)."""
    stale_streak: int = 0
    """Consecutive turns whose result signature had been seen before."""
    unavailable: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Per tool: consecutive turns in which every call of it failed for infrastructure
    reasons (``faults.next_unavailable``); treat as read-only."""
    output_failures: int = 0
    """Final answers that failed ``spec.output.schema``."""
    pending_cap: Phase | None = None
    """A cap reached with ``onExhausted: summarize``: the next call is the tool-free summary."""
    pending: PendingBatch | None = None
    """A turn held for human approval (``awaiting_approval``) or decided but not yet resumed."""

    def summary(self) -> RunSummary:
        """The counters and phase (what an event carries and ``.status`` projects)."""
        waiting: HeldCall | None = None
        batch: tuple[HeldCall, ...] = ()
        if self.phase is Phase.AWAITING_APPROVAL and self.pending is not None:
            waiting, batch = self.pending.next_undecided, self.pending.for_approval
        return RunSummary(
            self.phase,
            self.turn,
            self.steps,
            self.tool_calls,
            self.tool_failures,
            self.corrections,
            self.usage,
            self.answer,
            self.message,
            waiting,
            batch,
            self.tool_calls_not_run,
        )


def initial_state(*, goal: str, instructions: str = "") -> RunState:
    """The state before turn 0: the system prompt (if any) and the goal as the user message."""
    messages: list[Message] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    messages.append({"role": "user", "content": goal})
    return RunState(messages=tuple(messages), message="admitted")
