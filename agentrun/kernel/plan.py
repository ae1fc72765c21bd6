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
from agentrun.kernel.gates import admit_model_call, admit_tool_batch
from agentrun.kernel.limits import Limits, Pricing
from agentrun.kernel.state import Message, RunState
from agentrun.kernel.terminal import Phase
from agentrun.kernel.transcript import summary_request
from agentrun.kernel.usage import Usage
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
    """Estimated prompt tokens, tools included (what the gates and the ledger reserve use)."""
    max_output_tokens: int
    """The output allowance every budget leaves."""
    summary: bool = False
    """The tool-free summary call at a cap: send no tools; its answer ends the run."""


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


def plan_turn(
    state: RunState,
    limits: Limits,
    *,
    pricing: Pricing,
    tools: Sequence[Mapping[str, Any]],
    missing_tools: Collection[str],
    clock: Timing,
) -> TurnPlan:
    """The first step of turn ``state.turn`` of a running run.

    ``tools`` is the OpenAI ``tools`` list of the run (it counts toward the prompt estimate);
    ``missing_tools`` the run's tools this worker's catalog lacks (the run then ends
    ``tool_unavailable``). Otherwise a decided approval is settled before anything else, and
    the model call is gated by ``admit_model_call``. Every prompt goes through
    ``wire.conform`` (role order, wire ids and names) before it is fitted and estimated.
    """
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
    history = state.messages
    if state.pending_cap is not None:
        history += (summary_request(state.pending_cap),)
    fitted = fit_context(wire.conform(history), limits=limits, tools=tools)
    gate = admit_model_call(
        state,
        limits,
        pricing=pricing,
        prompt_estimate=fitted.tokens,
        now=clock.now,
        deadline=clock.deadline,
    )
    if gate.phase is not None:
        return EndRun(records.Stopped(state.turn, records.Ending(gate.phase, gate.message)))
    return CallModel(
        state.turn, fitted.messages, fitted.tokens, gate.max_output_tokens, gate.summary
    )


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
    effects. A batch of ``read`` calls runs in this turn, with no extra commit.
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
    if gate.phase is not None:
        ending = records.Ending(gate.phase, gate.message)
        stopped = records.Answered(call.turn, decision, usage, calls, stopped=ending)
        return RunTools(stopped, ()).finish(not_run(calls, gate.message))  # bounded, as any
    effects = {name: schema.effect for name, schema in tools.items()}
    deferred = approval.deferred_calls(calls, held=held, effects=effects)
    runnable = tuple(c for c in calls if c.id not in held and c.id not in deferred)
    record = records.Answered(call.turn, decision, usage, calls=calls, held=held, deferred=deferred)
    if deferred and not runnable:
        return record  # commit the decision first: its calls run next turn (``ResumeHeld``)
    return RunTools(record, runnable)
