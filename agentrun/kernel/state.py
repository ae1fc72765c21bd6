"""The run state: one immutable value folded over committed turns."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from agentrun.kernel.approval import PendingBatch
from agentrun.kernel.terminal import Phase
from agentrun.kernel.usage import Usage

Message = Mapping[str, Any]
"""A chat message in the OpenAI chat-completions shape (role, content, tool_calls, tool_call_id)."""


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
    """Tool calls whose result was an error (invalid calls included)."""
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
    error_streak: int = 0
    """Consecutive tool results (of calls that ran) that were errors."""
    output_failures: int = 0
    """Final answers that failed ``spec.output.schema``."""
    pending_cap: Phase | None = None
    """A cap reached with ``onExhausted: summarize``: the next call is the tool-free summary."""
    pending: PendingBatch | None = None
    """A turn held for human approval (``awaiting_approval``) or decided but not yet resumed."""

    def summary(self) -> dict[str, Any]:
        """The counters and phase as JSON (what an event carries and ``.status`` projects)."""
        return {
            "phase": self.phase.value,
            "turn": self.turn,
            "steps": self.steps,
            "toolCalls": self.tool_calls,
            "toolFailures": self.tool_failures,
            "corrections": self.corrections,
            "usage": self.usage.as_dict(),
            "answer": self.answer,
            "message": self.message,
            "pendingApproval": self._pending_approval(),
        }

    def _pending_approval(self) -> dict[str, Any] | None:
        if self.phase is not Phase.AWAITING_APPROVAL or self.pending is None:
            return None
        waiting = self.pending.next_undecided
        return waiting.as_status() if waiting is not None else None


def initial_state(*, goal: str, instructions: str = "") -> RunState:
    """The state before turn 0: the system prompt (if any) and the goal as the user message."""
    messages: list[Message] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    messages.append({"role": "user", "content": goal})
    return RunState(messages=tuple(messages), message="admitted")
