"""Run a validated tool batch concurrently and correlate every result by ``tool_call_id``.

Invariant (OpenAI tool calling): every call in the batch gets exactly one
result, in the order of the assistant's ``tool_calls`` — never completion order — whether it
succeeded, raised, timed out or was cancelled. A tool failure is a result value, never an
exception into the loop. A call that failed for infrastructure reasons (timeout, connection,
server or transport error) is retried a bounded number of times with backoff, within the run's
deadline, unless its tool is a ``write``; an error the model caused is never retried (it goes
back to the model as the result). A ``write`` call that failed after it may have been sent has
an unknown outcome: its result is ``effect_unknown`` (the run ends naming it), so the model
never gets the chance to repeat it under a new call id. Write and idempotent calls go through
the effect ledger when one is given, so a turn run again never sends one twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Coroutine, Mapping, Sequence
from typing import Any

from opentelemetry import trace

from agentrun import display, kernel, telemetry
from agentrun.kernel.decision import clean_text
from agentrun.tools.catalog import Tool, ToolContext, ToolError

from .effects import EffectLedger, EffectLedgerUnavailable

log = logging.getLogger(__name__)

MAX_RESULT_BYTES = 16_384
"""Default cap of one tool result, in UTF-8 bytes (``AGENTRUN_TOOL_RESULT_MAX_BYTES``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ToolRunSettings:
    """Bounds of a tool batch."""

    concurrency: int = 4
    """Calls of one batch running at once."""
    call_timeout: float = 60.0
    """Seconds one call may take, its retries included, before it is reported as timed out
    (a tool's own ``ToolSpec.timeout`` takes precedence, up to ``max_call_timeout``)."""
    max_call_timeout: float = 300.0
    """The most seconds any call may take, whatever its tool asks (an AgentToolServer's
    ``spec.timeouts.call`` is the tenant's to set): a turn holds its worker slot while its
    tools run, and the fair shares of the slots between tenants count on turns ending."""
    max_result_bytes: int = MAX_RESULT_BYTES
    """Results longer than this (UTF-8), error messages included, are cut with a visible
    marker (a turn's results together are bounded too: ``kernel.bound_results``)."""
    retries: int = 2
    """Extra attempts of a call that failed for infrastructure reasons (read and idempotent
    tools only; see ``kernel.may_retry``)."""
    retry_backoff: float = 0.5
    """Seconds before the first retry; doubled for each further one (``kernel.backoff``)."""


async def _traced(
    call: kernel.CheckedCall, attempt: Awaitable[kernel.ToolResult]
) -> kernel.ToolResult:
    """Await one call's ``attempt`` inside its ``execute_tool {name}`` span."""
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": call.name,
        "gen_ai.tool.call.id": call.id,
        "gen_ai.tool.type": "function",
    }
    if telemetry.capture_content():
        attributes["gen_ai.tool.call.arguments"] = telemetry.arguments_json(call.arguments)
    with telemetry.tracer().start_as_current_span(
        f"execute_tool {call.name}", attributes=attributes
    ) as span:
        result = await attempt
        if result.is_error:
            span.set_attribute("error.type", result.fault or "tool_error")
            span.set_status(trace.Status(trace.StatusCode.ERROR, result.content[:200]))
        return result


@dataclasses.dataclass(frozen=True, slots=True)
class _Deadline:
    """When one call must have ended, its retries included: its timeout after it started, or
    the run's deadline if that comes first."""

    at: float
    """Epoch seconds."""
    timeout: float
    """The call's timeout in seconds."""
    by_run: bool
    """The run's deadline comes first."""

    @classmethod
    def of(cls, tool: Tool, settings: ToolRunSettings, *, run_deadline: float) -> _Deadline:
        timeout = min(tool.spec.timeout or settings.call_timeout, settings.max_call_timeout)
        ends = time.time() + timeout
        return cls(min(ends, run_deadline), timeout, run_deadline < ends)


def _shown(error: str) -> str:
    """A failed call's text as the model and the run's events see it: every secret this
    process read (``display.KNOWN``: model keys, tool servers' header values) taken out, then
    made clean (``clean_text``)."""
    return clean_text(display.KNOWN.redact(error))


async def _attempt(
    call: kernel.CheckedCall,
    tool: Tool,
    ctx: ToolContext,
    settings: ToolRunSettings,
    deadline: _Deadline,
) -> kernel.ToolResult:
    """One attempt of ``call``, bounded by what is left of the call's one deadline; an
    infrastructure failure of a ``write`` call that may have been sent is ``effect_unknown``
    (``_outcome_unknown``)."""
    unsent = False
    try:
        async with asyncio.timeout(max(0.0, deadline.at - time.time())):
            output = await tool.run(call.arguments, ctx)
    except ToolError as err:
        unsent = err.unsent
        # an error may quote a secret this process read: out before the cut (``display.KNOWN``)
        message = kernel.clip_result(_shown(str(err)), settings.max_result_bytes)
        result = kernel.ToolResult(call.id, call.name, message, True, err.fault)
    except TimeoutError:
        why = (
            "the run's deadline passed while the tool ran"
            if deadline.by_run
            else f"the call timed out after {deadline.timeout:g}s"
        )
        result = kernel.ToolResult(call.id, call.name, why, True, kernel.ToolFault.TIMEOUT)
    except Exception as err:  # a tool bug must not break the loop: it becomes a result
        log.exception("tool %s raised", call.name)
        why = _shown(f"the tool failed: {type(err).__name__}: {err}")
        why = kernel.clip_result(why, settings.max_result_bytes)
        result = kernel.ToolResult(call.id, call.name, why, True, kernel.ToolFault.CRASHED)
    else:
        return kernel.ToolResult(
            call.id,
            call.name,
            kernel.clip_result(clean_text(str(output)), settings.max_result_bytes),
        )
    if tool.spec.effect == "write" and not unsent:
        return _outcome_unknown(result)
    return result


def _outcome_unknown(result: kernel.ToolResult) -> kernel.ToolResult:
    """``result`` of a ``write`` call that failed after it may have been sent: an
    infrastructure failure (timeout, reset or closed connection, a server or transport error,
    a crash of the tool's own code) can come after the effect happened, so the call's outcome
    is unknown. It becomes an ``effect_unknown`` result, which ends the run naming the call —
    never an error the model could answer by calling the write again under a new call id.
    Errors the model caused (arguments, domain, rejected) are answers and stay as they are."""
    fault = result.fault
    if fault is None or not fault.infrastructure or fault is kernel.ToolFault.EFFECT_UNKNOWN:
        return result
    content = (
        f"{result.name} ({result.tool_call_id}) failed after it may have been sent ({fault}: "
        f"{result.content}); its outcome is unknown and it is not sent again"
    )
    return dataclasses.replace(result, content=content, fault=kernel.ToolFault.EFFECT_UNKNOWN)


@dataclasses.dataclass(frozen=True, slots=True)
class _Batch:
    """What every call of one batch shares."""

    gate: asyncio.Semaphore
    settings: ToolRunSettings
    deadline: float
    effects: EffectLedger | None


async def _run_one(
    call: kernel.CheckedCall, tool: Tool, ctx: ToolContext, batch: _Batch
) -> kernel.ToolResult:
    """``call``, once per the effect ledger for write and idempotent tools (see
    ``effects``): a call already recorded is answered from the ledger, never sent
    again; a new call's result is the one the ledger recorded. Raises
    ``EffectLedgerUnavailable`` when the ledger cannot be read or written (the turn is then not
    committed)."""
    ledger = batch.effects
    if ledger is None or tool.spec.effect == "read":
        return await _with_retries(call, tool, ctx, batch)
    recorded = await ledger.claim(ctx.run_uid, call)
    if recorded is not None:
        log.info("tool %s (%s) answered from the effect ledger", call.name, call.id)
        return recorded
    return await _complete(_send_and_record(call, tool, ctx, batch, ledger))


async def _send_and_record(
    call: kernel.CheckedCall, tool: Tool, ctx: ToolContext, batch: _Batch, ledger: EffectLedger
) -> kernel.ToolResult:
    """Send a claimed call and record its outcome in the effect ledger; returns the result as
    recorded (cut should it not fit an entry), so a replay answers the same."""
    result = await _with_retries(call, tool, ctx, batch)
    return await ledger.done(ctx.run_uid, call, result)


async def _complete(work: Coroutine[Any, Any, kernel.ToolResult]) -> kernel.ToolResult:
    """Await ``work`` (a claimed write or idempotent call being sent and recorded) to its end
    even when the turn is cancelled meanwhile — a stopping worker past its drain time, a
    cancelled run, a sibling call that failed the batch —, then pass the cancellation on.
    Cut off, the call would stay ``prepared`` in the effect ledger with its outcome unknown
    (the run would end ``effect_unknown`` when the turn runs again); completed, a turn run
    again replays its recorded result. Bounded by the call's own timeout and its retries."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():  # the call itself was cancelled: nothing left to wait for
                raise
            cancelled = True
            log.info("turn stopping: a write call in flight completes and records its outcome")
            continue
        if cancelled:
            raise asyncio.CancelledError
        return result


async def _with_retries(
    call: kernel.CheckedCall, tool: Tool, ctx: ToolContext, batch: _Batch
) -> kernel.ToolResult:
    """``call`` with bounded retries: an infrastructure failure of a tool that may be retried
    (``kernel.may_retry``) is sent again after ``kernel.backoff`` seconds, at most
    ``settings.retries`` times, and only while the wait still ends before the call's one
    deadline (its timeout — ``ToolSpec.timeout``, else ``settings.call_timeout`` — counted
    from its first attempt, never restarted for a retry; the run's deadline if sooner). The
    last attempt's result stands (an error result says how many attempts were made)."""
    settings = batch.settings
    attempts = 0
    async with batch.gate:
        deadline = _Deadline.of(tool, settings, run_deadline=batch.deadline)
        while True:
            attempts += 1
            result = await _attempt(call, tool, ctx, settings, deadline)
            fault = result.fault
            if fault is None or not kernel.may_retry(fault, effect=tool.spec.effect):
                break
            if attempts > settings.retries:
                break
            delay = kernel.backoff(attempts, base=settings.retry_backoff)
            if time.time() + delay >= deadline.at:
                break
            log.info("tool %s failed (%s); retry %d in %.1fs", call.name, fault, attempts, delay)
            await asyncio.sleep(delay)
    if attempts > 1 and result.is_error:
        content = f"{result.content} (after {attempts} attempts)"
        result = dataclasses.replace(result, content=content)
    return result


async def run_batch(
    calls: Sequence[kernel.CheckedCall | kernel.InvalidCall],
    *,
    tools: Mapping[str, Tool],
    context: ToolContext,
    settings: ToolRunSettings,
    deadline: float,
    effects: EffectLedger | None = None,
) -> tuple[kernel.ToolResult, ...]:
    """One result per call, in call order. Invalid calls get their validation error.

    ``effects``, when given (the effect ledger, ``EffectLedger``), records every write and
    idempotent call: a call of this run already recorded is answered from it, never sent twice.
    Raises ``EffectLedgerUnavailable`` when it cannot be used (the turn must not commit).

    ``context`` is shared by the batch; each call gets it with its own ``call_id``. A call still
    running at ``deadline`` (epoch seconds) is cancelled and reported as such. On
    cancellation, calls still running are cancelled and the ``CancelledError`` propagates
    (the turn is then abandoned, not committed).
    """
    batch = _Batch(asyncio.Semaphore(settings.concurrency), settings, deadline, effects)
    tasks: dict[int, asyncio.Task[kernel.ToolResult]] = {}
    try:
        async with asyncio.TaskGroup() as group:
            for index, call in enumerate(calls):
                if isinstance(call, kernel.CheckedCall):
                    ctx = dataclasses.replace(context, call_id=call.id)
                    tasks[index] = group.create_task(
                        _traced(call, _run_one(call, tools[call.name], ctx, batch))
                    )
    except* EffectLedgerUnavailable as failed:
        raise failed.exceptions[0] from None
    results: list[kernel.ToolResult] = []
    for index, call in enumerate(calls):
        if isinstance(call, kernel.InvalidCall):
            results.append(
                kernel.ToolResult(call.id, call.name, call.error, True, kernel.ToolFault.ARGUMENTS)
            )
        else:
            results.append(tasks[index].result())
    return tuple(results)
