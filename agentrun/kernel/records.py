"""The values a turn produces: gate verdicts, tool results, and the turn record itself.

A turn record is a tagged union, one class per way a turn can go (the Agents SDK's
``NextStep*`` habit): the run stopped before the model call (``Stopped``), the model call
failed (``ModelFailed``), the model answered (``Answered``: a decision, maybe tool calls and
their results, or its calls pending: held for a person or deferred because the batch has
effects), the tool-free summary at a cap (``Summarized``), or a committed batch's pending calls
were settled (``Resumed``). Plain frozen data shared by the kernel's modules; no logic
beyond construction.
"""

from __future__ import annotations

import dataclasses

from agentrun.kernel.decision import Decision
from agentrun.kernel.faults import ToolFault
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
class Ending:
    """A terminal phase and the one-line reason a gate gave for it."""

    phase: Phase
    message: str


@dataclasses.dataclass(frozen=True, slots=True)
class ToolResult:
    """The result of one call, correlated by ``tool_call_id`` (one per call, always)."""

    tool_call_id: str
    name: str
    content: str
    is_error: bool = False
    fault: ToolFault | None = None
    """Why an error result failed (``None`` for a success, and for errors recorded before
    faults were classified, which count as the model's)."""

    @property
    def infrastructure_failure(self) -> bool:
        """True for an error the model cannot have caused (see ``faults.ToolFault``)."""
        return self.is_error and self.fault is not None and self.fault.infrastructure


@dataclasses.dataclass(frozen=True, slots=True)
class Stopped:
    """The turn ended the run before any model call: a budget gate, the tenant's ledger, or a
    tool this worker lacks. Nothing was spent."""

    turn: int
    ending: Ending


@dataclasses.dataclass(frozen=True, slots=True)
class ModelFailed:
    """The model could not be reached or kept failing (after retries): ``model_error``."""

    turn: int
    error: str


@dataclasses.dataclass(frozen=True, slots=True)
class Answered:
    """The model answered: its classified decision and, for tool calls, what became of them."""

    turn: int
    decision: Decision
    usage: Usage = dataclasses.field(default_factory=Usage)
    """This turn's model usage."""
    calls: tuple[CheckedCall | InvalidCall, ...] = ()
    """The validated calls, in the assistant's order, with their final ids."""
    results: tuple[ToolResult, ...] = ()
    """One result per call in ``calls`` (held calls excepted), same order."""
    held: tuple[str, ...] = ()
    """Ids of valid calls held for human approval (``spec.approval.tools``): not run, no
    result yet; ``results`` then covers only the other calls."""
    stopped: Ending | None = None
    """The tool batch did not fit a budget: none of it ran (every call has a "not run" error
    result) and the run ends so."""
    deferred: tuple[str, ...] = ()
    """Ids of the valid calls committed with the decision before they run, because the batch
    holds a ``write`` or ``idempotent`` call: not run, no result yet; the next turn runs them
    (``Resumed``) under these committed ids, so a turn run again never asks the model for a new
    decision (with new call ids) after an effect may have happened. ``results`` then covers
    only the invalid calls (and ``held`` the calls that also wait for a person)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Summarized:
    """The tool-free summary call made at a cap; the run ends with the cap's reason."""

    turn: int
    decision: Decision | None
    """``None`` when no summary came back (the call failed, or the tenant refused it)."""
    usage: Usage = dataclasses.field(default_factory=Usage)
    error: str = ""
    """Why no summary came back, when none did."""


@dataclasses.dataclass(frozen=True, slots=True)
class Resumed:
    """The turn that settled a committed batch's pending calls: the held calls of a decided
    approval (ran or denied them) and the deferred calls of a batch with effects (ran them)."""

    turn: int
    results: tuple[ToolResult, ...]
    """One result per pending call (held or deferred), in call order (denied ones say so)."""
    stopped: Ending | None = None
    """The approved calls did not fit a budget: none ran, and the run ends so."""


TurnRecord = Stopped | ModelFailed | Answered | Summarized | Resumed
"""What one turn did; the content of a committed turn event."""


def record_usage(record: TurnRecord) -> Usage:
    """The model usage a turn spent (zero for turns that made no model call)."""
    if isinstance(record, Answered | Summarized):
        return record.usage
    return Usage()


def record_results(record: TurnRecord) -> tuple[ToolResult, ...]:
    """The tool results a turn produced (empty for turns that ran no tools)."""
    if isinstance(record, Answered | Resumed):
        return record.results
    return ()
