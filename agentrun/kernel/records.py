"""The values a turn produces: gate verdicts, tool results, and the turn record itself.

Plain frozen data shared by the kernel's modules; no logic beyond construction.
"""

from __future__ import annotations

import dataclasses

from agentrun.kernel.decision import Decision
from agentrun.kernel.terminal import Phase
from agentrun.kernel.usage import Usage
from agentrun.kernel.validate import CheckedCall, InvalidCall

ERROR_PREFIX = "ERROR: "
"""Tool messages have no error flag in the OpenAI shape; an error result's content starts so."""


@dataclasses.dataclass(frozen=True, slots=True)
class Gate:
    """The verdict of a budget gate: allowed (``phase is None``) or the cap that stops the run."""

    phase: Phase | None
    """``None`` when allowed, else the terminal phase."""
    max_output_tokens: int = 0
    """For a model call: the most output tokens the call may produce within every budget."""
    message: str = ""
    summary: bool = False
    """The allowed call is the tool-free summary at a cap (``onExhausted: summarize``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ToolResult:
    """The result of one call, correlated by ``tool_call_id`` (one per call, always)."""

    tool_call_id: str
    name: str
    content: str
    is_error: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class ModelFailure:
    """The model could not be reached or kept failing (after retries): ``model_error``."""

    error: str


@dataclasses.dataclass(frozen=True, slots=True)
class TurnRecord:
    """What one turn did; the content of a committed turn event."""

    turn: int
    gate: Gate | None = None
    """A gate that stopped the turn (before the model call, or before the tool batch)."""
    decision: Decision | None = None
    """The classified response; ``None`` when no model call returned."""
    calls: tuple[CheckedCall | InvalidCall, ...] = ()
    """The validated calls, in the assistant's order, with their final ids."""
    results: tuple[ToolResult, ...] = ()
    """One result per call in ``calls`` (held calls excepted), same order."""
    usage: Usage = dataclasses.field(default_factory=Usage)
    """This turn's model usage."""
    failure: ModelFailure | None = None
    summary: bool = False
    """This turn was the tool-free summary call made at a cap."""
    held: tuple[str, ...] = ()
    """Ids of valid calls held for human approval (``spec.approval.tools``): not run, no
    result yet; ``results`` then covers only the other calls."""
    resume: bool = False
    """This turn only settled the held calls of an approval (ran or denied them)."""
