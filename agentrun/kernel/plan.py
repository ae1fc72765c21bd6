"""Planning a turn: what the worker does next, decided here and only interpreted there.

A turn is planned in two pure steps around the model call:

1. ``plan_turn`` before it: stop the run (``EndRun``: a tool this worker lacks, a budget
   gate), settle a committed batch's pending calls (``ResumeHeld``: a decided approval, or
   the calls of a batch with effects, deferred when their decision was committed), or call
   the model (``CallModel``: the
   fitted prompt, its estimate, the output allowance, and whether it is the tool-free summary
   at a cap).
2. ``plan_answer`` after it: the turn's record (a batch with write or idempotent calls is
   committed as a record with its calls deferred, before any of them runs), or the tool batch
   to run (``RunTools``) whose ``finish`` makes the record from the batch's results.

The ends a worker meets in between are records made here too: ``refused_by_tenant`` (the
tenant's ledger did not fit the call) and ``model_failed`` (the model errored, or the run's
deadline passed during the call). The worker decides no phase itself.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from agentrun.kernel import approval, bounds, records, wire
from agentrun.kernel.context import fit_context
from agentrun.kernel.decision import Decision, ToolCalls
from agentrun.kernel.faults import ToolFault
from agentrun.kernel.gates import admit_model_call, admit_tool_batch, overrun
from agentrun.kernel.limits import Limits, Pricing
from agentrun.kernel.state import Message, RunState
from agentrun.kernel.terminal import Phase
from agentrun.kernel.transcript import summary_request
from agentrun.kernel.usage import Usage, prompt_token_bound
from agentrun.kernel.validate import CheckedCall, InvalidCall, ToolSchema, check_calls


@dataclasses.dataclass(frozen=True, slots=True)
class Timing:
    """When the plan is made and the run's deadline, both epoch seconds."""

    now: float
    deadline: float


@dataclasses.dataclass(frozen=True, slots=True)
class EndRun:
    """Stop the run without calling the model; commit ``record``."""

    record: records.Stopped


@dataclasses.dataclass(frozen=True, slots=True)
class CallModel:
    """Call the model with ``prompt``."""

    turn: int
    prompt: tuple[Message, ...]
    """The history plus the summary request for a summary call, in wire form
    (``wire.conform``), then fitted to the context window."""
    prompt_estimate: int
    """An upper bound of the prompt tokens, tools included (``usage.prompt_token_bound``,
    never below the four-characters estimate, plus the hidden prompt tokens the provider was
    seen to add): what the run's gates and the tenant's reservation hold for the prompt."""
    max_output_tokens: int
    """The output allowance every budget leaves: sent as ``max_tokens``, and where the worker
    cuts a streamed response whose provider ignores it."""
    summary: bool = False
    """The tool-free summary call at a cap: its answer ends the run."""
    tool_choice: str | None = None
    """``"none"`` when the tools are sent but must not be called: the summary call of a run
    whose history holds tool calls (providers that require ``tools`` whenever the history
    holds tool calls answer 400 without them; the prompt cache stays warm)."""

    @property
    def sends_tools(self) -> bool:
        """Whether the run's ``tools`` go with the request: every call but a summary of a
        history without tool calls."""
        return not self.summary or self.tool_choice is not None


@dataclasses.dataclass(frozen=True, slots=True)
class ResumeHeld:
    """Settle a committed batch's pending calls: run ``approved`` (unless ``stopped``), deny
    the rest. The calls are the held calls of a decided approval and the deferred calls of a
    batch with effects, under the ids committed with their decision."""

    state: RunState
    approved: tuple[CheckedCall, ...]
    """The approved held calls and the deferred calls, in call order."""
    stopped: records.Ending | None
    """The approved calls do not fit a budget: none runs, and the run ends so."""

    @property
    def runnable(self) -> tuple[CheckedCall, ...]:
        """The calls to run: the approved ones, or none when the batch was stopped."""
        return () if self.stopped is not None else self.approved

    def finish(
        self, ran: Sequence[records.ToolResult], *, cap: int = bounds.MESSAGE_CAP
    ) -> records.Resumed:
        """The record, given one result per call of ``runnable``; the results are bounded
        for a bus whose messages hold ``cap`` bytes (``bounds.bound_results``)."""
        pending = self.state.pending
        assert pending is not None
        if self.stopped is not None:
            ran = not_run(self.approved, self.stopped.message)
        ran = bounds.bound_for_cap(ran, cap=cap)
        by_id = {r.tool_call_id: r for r in ran}
        results = tuple(
            by_id[h.id] if h.approved else records.ToolResult(h.id, h.name, approval.DENIED, True)
            for h in pending.held
        )
        return records.Resumed(self.state.turn, results, self.stopped)


TurnPlan = EndRun | CallModel | ResumeHeld
"""What the worker does first in a turn."""


@dataclasses.dataclass(frozen=True, slots=True)
class RunTools:
    """Run the tool batch ``runnable``, then commit ``finish(results)``."""

    record: records.Answered
    """The turn's record without results: ``finish`` fills them in."""
    runnable: tuple[CheckedCall | InvalidCall, ...]
    """The calls to run, in order (invalid calls get their validation error as result)."""

    def finish(
        self, results: tuple[records.ToolResult, ...], *, cap: int = bounds.MESSAGE_CAP
    ) -> records.Answered:
        """The turn's record with the batch's results (one per runnable call, same order),
        bounded for a bus whose messages hold ``cap`` bytes: together they take at most
        ``bounds.results_budget`` of it, less what the model's reply takes."""
        bounded = bounds.bound_for_cap(results, cap=cap, reply=self.record)
        return dataclasses.replace(self.record, results=bounded)


def not_run(calls: Sequence[CheckedCall | InvalidCall], why: str) -> tuple[records.ToolResult, ...]:
    """Error results for a batch that a gate stopped: every call still gets its one result."""
    return tuple(
        records.ToolResult(c.id, c.name, c.error, True, ToolFault.ARGUMENTS)
        if isinstance(c, InvalidCall)
        else records.ToolResult(c.id, c.name, f"not run: {why}", True)
        for c in calls
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Offer:
    """What the worker can send with a model call."""

    tools: Sequence[Mapping[str, Any]]
    """The OpenAI ``tools`` list of the run (it counts toward the prompt's size)."""
    missing_tools: Collection[str] = ()
    """The run's tools this worker's catalog lacks (the run then ends ``tool_unavailable``)."""
    hidden_prompt_tokens: int = 0
    """Prompt tokens the provider was seen to count beyond the bound of what is sent (template
    and tool-definition text it adds), added to the prompt's size."""


def plan_turn(
    state: RunState, limits: Limits, *, pricing: Pricing, offer: Offer, clock: Timing
) -> TurnPlan:
    """The first step of turn ``state.turn`` of a running run.

    A run whose tools this worker lacks (``offer.missing_tools``) ends ``tool_unavailable``.
    Otherwise a decided approval is settled before anything else, and the model call is gated
    by ``admit_model_call`` with ``prompt_bound`` (plus ``offer.hidden_prompt_tokens``) as the
    prompt's size. Every prompt goes through ``wire.conform`` (role order, wire ids and names)
    before it is fitted and estimated.
    """
    missing_tools = offer.missing_tools
    if missing_tools:
        message = f"this worker's catalog lacks tool(s) {', '.join(missing_tools)}"
        return EndRun(records.Stopped(state.turn, records.Ending(Phase.TOOL_UNAVAILABLE, message)))
    pending = state.pending
    if pending is not None and pending.next_undecided is None:
        approved = tuple(CheckedCall(h.id, h.name, h.arguments) for h in pending.held if h.approved)
        gate = admit_tool_batch(
            state, limits, calls=len(approved), now=clock.now, deadline=clock.deadline
        )
        stopped = records.Ending(gate.phase, gate.message) if gate.phase is not None else None
        return ResumeHeld(state, approved, stopped)
    return _plan_call(
        state,
        limits,
        pricing=pricing,
        tools=offer.tools,
        clock=clock,
        hidden=offer.hidden_prompt_tokens,
    )


def _plan_call(
    state: RunState,
    limits: Limits,
    *,
    pricing: Pricing,
    tools: Sequence[Mapping[str, Any]],
    clock: Timing,
    hidden: int,
) -> EndRun | CallModel:
    """The model call of the turn (or the gate that stops the run before it): the history in
    wire form (with the summary request at a cap), fitted, its bound plus ``hidden``."""
    history = state.messages
    if state.pending_cap is not None:
        history += (summary_request(state.pending_cap),)
    fitted = fit_context(wire.conform(history), limits=limits, tools=tools)
    estimate = prompt_bound(fitted.messages, tools, estimate=fitted.tokens) + max(0, hidden)
    gate = admit_model_call(
        state,
        limits,
        pricing=pricing,
        prompt_estimate=estimate,
        now=clock.now,
        deadline=clock.deadline,
    )
    if gate.phase is not None:
        return EndRun(records.Stopped(state.turn, records.Ending(gate.phase, gate.message)))
    choice = "none" if gate.summary and tools and _holds_tool_calls(fitted.messages) else None
    return CallModel(
        state.turn, fitted.messages, estimate, gate.max_output_tokens, gate.summary, choice
    )


def prompt_bound(
    messages: Sequence[Message], tools: Sequence[Mapping[str, Any]], *, estimate: int
) -> int:
    """The prompt size the gates and the reservation hold: ``usage.prompt_token_bound`` of the
    request (an upper bound for any byte-level BPE tokenizer), never below ``estimate`` (the
    four-characters estimate ``fit_context`` made)."""
    return max(estimate, prompt_token_bound(messages, tools))


def _holds_tool_calls(messages: Sequence[Message]) -> bool:
    return any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)


def refused_by_tenant(call: CallModel, message: str) -> records.TurnRecord:
    """The record when the tenant's ledger cannot hold ``call``'s worst case: the run ends
    ``tenant_budget_exhausted`` — unless it was the summary at a cap, which ends with the
    run's own cap (it came first), without a summary."""
    if call.summary:
        return records.Summarized(call.turn, None, error=message)
    return records.Stopped(call.turn, records.Ending(Phase.TENANT_BUDGET_EXHAUSTED, message))


class ModelFault(enum.StrEnum):
    """What kind of failure a failed model call was (the worker's adapter sorts provider
    answers into these; the kernel decides what each ends as)."""

    UNAVAILABLE = "unavailable"
    """No answer: transport errors, retries run out, a permanent error (an
    ``insufficient_quota`` 429 included): ``model_error`` naming the cause."""
    FILTERED = "filtered"
    """The provider's content filter rejected the request (HTTP 400 ``content_filter``):
    ``refused``, naming the filter and its categories."""
    WAIT_BEYOND_DEADLINE = "wait_beyond_deadline"
    """The provider asked to retry after the run's deadline (``Retry-After``):
    ``deadline_exceeded`` at once, without waiting."""


def model_failed(
    call: CallModel, error: str, *, clock: Timing, fault: ModelFault = ModelFault.UNAVAILABLE
) -> records.TurnRecord:
    """The record when the model call raised: ``deadline_exceeded`` if the run's timeout passed
    meanwhile or the provider asked to wait past it, no summary for a summary call,
    ``refused`` for a content filter, else ``model_error``."""
    if clock.now >= clock.deadline:
        message = f"the run's timeout passed during the model call ({error})"
        return records.Stopped(call.turn, records.Ending(Phase.DEADLINE_EXCEEDED, message))
    if fault is ModelFault.WAIT_BEYOND_DEADLINE:
        return records.Stopped(call.turn, records.Ending(Phase.DEADLINE_EXCEEDED, error))
    if call.summary:
        return records.Summarized(call.turn, None, error=error)
    if fault is ModelFault.FILTERED:
        return records.Stopped(call.turn, records.Ending(Phase.REFUSED, error))
    return records.ModelFailed(call.turn, error)


def plan_answer(
    state: RunState,
    limits: Limits,
    call: CallModel,
    answer: tuple[Decision, Usage],
    *,
    tools: Mapping[str, ToolSchema],
    clock: Timing,
) -> records.TurnRecord | RunTools:
    """The second step: the record of a classified answer, or the tool batch to run.

    Tool calls are validated against ``tools`` (the compiled schemas of the run's tools),
    approval tools' calls are held, and the rest is gated by ``admit_tool_batch``; a batch that
    does not fit ends the run with "not run" results for each call. A batch holding a
    ``write`` or ``idempotent`` call runs nothing in this turn but its invalid calls: the
    record (decision, usage, every call id) is committed with the valid calls ``deferred``,
    and the next turn runs them (``ResumeHeld``) under those committed ids — the effect
    ledger's keys — so the model is never asked again for a decision that may have had
    effects. A batch of ``read`` calls runs in this turn, with no extra commit. A reply whose
    usage took the run past its token or cost cap (``gates.overrun``) runs none of its calls.
    """
    decision, usage = answer
    if call.summary:
        return records.Summarized(call.turn, decision, usage)
    if not isinstance(decision, ToolCalls):
        return records.Answered(call.turn, decision, usage)
    calls = check_calls(decision.calls, turn=call.turn, tools=tools, used_ids=state.call_ids)
    held = approval.held_calls(calls, limits.approval_tools)
    valid = sum(isinstance(c, CheckedCall) and c.id not in held for c in calls)
    gate = admit_tool_batch(state, limits, calls=valid, now=clock.now, deadline=clock.deadline)
    ending = overrun(state, limits, usage)
    if ending is None and gate.phase is not None:
        ending = records.Ending(gate.phase, gate.message)
    if ending is not None:
        stopped = records.Answered(call.turn, decision, usage, calls, stopped=ending)
        return RunTools(stopped, ()).finish(not_run(calls, ending.message))  # bounded, as any
    effects = {name: schema.effect for name, schema in tools.items()}
    deferred = approval.deferred_calls(calls, held=held, effects=effects)
    runnable = tuple(c for c in calls if c.id not in held and c.id not in deferred)
    record = records.Answered(call.turn, decision, usage, calls=calls, held=held, deferred=deferred)
    if deferred and not runnable:
        return record  # commit the decision first: its calls run next turn (``ResumeHeld``)
    return RunTools(record, runnable)
