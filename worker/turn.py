"""One turn of a run: gate, call the model, classify, validate, gate the batch, run the tools.

Returns a ``TurnRecord``; it decides nothing about the phase (``kernel.advance`` does) and
commits nothing (``consumer`` does). Every I/O dependency comes in through ``TurnDeps``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from opentelemetry import trace

from agentrun import kernel, metrics, telemetry
from agentrun.protocol import RunConfig, SecretRef
from agentrun.tools.catalog import Catalog, ToolContext

from . import toolrunner
from .budget import TurnBudget, worst_case
from .model import ModelClient, ModelError


class SecretSource(Protocol):
    """Reads a model API key (``ModelError`` when it cannot)."""

    async def api_key(self, ref: SecretRef) -> str:
        """The key's value."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class TurnDeps:
    """What a turn needs from the outside world."""

    model: ModelClient
    catalog: Catalog
    secrets: SecretSource
    tool_settings: toolrunner.ToolRunSettings = dataclasses.field(
        default_factory=toolrunner.ToolRunSettings
    )
    kube: Any | None = None
    """A kubernetes_asyncio ``ApiClient`` for tools that read the cluster (or ``None``)."""
    clock: Callable[[], float] = time.time
    schemas: dict[str, kernel.ToolSchema] = dataclasses.field(default_factory=dict)
    """Compiled tool schemas, filled lazily (one compile per tool per process)."""
    openai_tools: dict[tuple[str, ...], list[dict[str, Any]]] = dataclasses.field(
        default_factory=dict
    )
    """The OpenAI ``tools`` list per tool set, built once."""

    def tools_param(self, names: tuple[str, ...]) -> list[dict[str, Any]]:
        """The OpenAI ``tools`` request parameter for ``names`` (cached)."""
        found = self.openai_tools.get(names)
        if found is None:
            found = self.catalog.specs(names) if names else []
            self.openai_tools[names] = found
        return found

    def schema(self, name: str) -> kernel.ToolSchema:
        """The compiled schema of a catalog tool."""
        compiled = self.schemas.get(name)
        if compiled is None:
            spec = self.catalog[name].spec
            compiled = kernel.ToolSchema(spec.name, spec.parameters, spec.pollable)
            self.schemas[name] = compiled
        return compiled


class PhaseClock:
    """Seconds a turn spent per phase (``model``, ``tools``), for the turn-duration metric."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {"model": 0.0, "tools": 0.0}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the time spent inside the block to ``name``."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started


def _tool_schemas(deps: TurnDeps, config: RunConfig) -> Mapping[str, kernel.ToolSchema]:
    return {name: deps.schema(name) for name in config.tools if name in deps.catalog}


async def execute_turn(
    deps: TurnDeps,
    config: RunConfig,
    state: kernel.RunState,
    *,
    clock: PhaseClock | None = None,
    budget: TurnBudget | None = None,
) -> kernel.TurnRecord:
    """Run turn ``state.turn`` of the run ``config``; never raises for model or tool faults.

    ``clock``, when given, receives the seconds spent calling the model and running tools.
    ``budget``, when given, reserves the model call's worst case in the tenant ledger after the
    run's own gates pass; a call that does not fit is not made and the run ends
    ``tenant_budget_exhausted`` (a summary call at a cap ends with the cap's reason instead).
    Ledger errors (``LedgerUnavailable``, NATS errors) propagate: the turn is retried.

    Raises ``asyncio.CancelledError`` when cancelled (the turn is then abandoned uncommitted).
    """
    clock = clock or PhaseClock()
    limits = config.limits
    pricing = config.model.pricing
    missing = [name for name in config.tools if name not in deps.catalog]
    if missing:
        message = f"this worker's catalog lacks tool(s) {', '.join(missing)}"
        return kernel.TurnRecord(
            turn=state.turn, gate=kernel.Gate(kernel.Phase.TOOL_UNAVAILABLE, message=message)
        )
    if state.pending is not None and state.pending.next_undecided is None:
        with clock.phase("tools"):
            return await resume_turn(deps, config, state)
    openai_tools = deps.tools_param(config.tools)
    fitted = kernel.fit_context(state.messages, limits=limits, tools=openai_tools)
    prompt, estimate = fitted.messages, fitted.tokens
    gate = kernel.admit_model_call(
        state,
        limits,
        pricing=pricing,
        prompt_estimate=estimate,
        now=deps.clock(),
        deadline=config.deadline,
    )
    if gate.phase is not None:
        return kernel.TurnRecord(turn=state.turn, gate=gate)
    if gate.summary:  # the last, tool-free call at a cap (spec.budget.onExhausted: summarize)
        assert state.pending_cap is not None
        prompt += (kernel.summary_request(state.pending_cap),)
        openai_tools = []
    if budget is not None:
        refused = await _reserve(budget, state, gate, prompt_estimate=estimate, pricing=pricing)
        if refused is not None:
            return refused
    try:
        with clock.phase("model"):
            response, usage = await _call_model(
                deps,
                config,
                prompt,
                openai_tools,
                max_output_tokens=gate.max_output_tokens,
                prompt_estimate=estimate,
                budget=budget,
            )
    except ModelError as err:
        if deps.clock() >= config.deadline:
            gate = kernel.Gate(
                kernel.Phase.DEADLINE_EXCEEDED,
                message=f"the run's timeout passed during the model call ({err})",
            )
            return kernel.TurnRecord(turn=state.turn, gate=gate)
        return kernel.TurnRecord(
            turn=state.turn, failure=kernel.ModelFailure(str(err)), summary=gate.summary
        )
    decision = kernel.classify(response)
    if gate.summary:
        return kernel.TurnRecord(turn=state.turn, decision=decision, usage=usage, summary=True)
    if not isinstance(decision, kernel.ToolCalls):
        return kernel.TurnRecord(turn=state.turn, decision=decision, usage=usage)
    calls = kernel.check_calls(
        decision.calls, turn=state.turn, tools=_tool_schemas(deps, config), used_ids=state.call_ids
    )
    held = kernel.held_calls(calls, limits.approval_tools)
    runnable = tuple(c for c in calls if c.id not in held)
    valid = sum(isinstance(c, kernel.CheckedCall) for c in runnable)
    batch_gate = kernel.admit_tool_batch(
        state, limits, calls=valid, now=deps.clock(), deadline=config.deadline
    )
    if batch_gate.phase is not None:
        return kernel.TurnRecord(
            turn=state.turn,
            gate=batch_gate,
            decision=decision,
            calls=calls,
            results=toolrunner.not_run(calls, batch_gate.message),
            usage=usage,
        )
    with clock.phase("tools"):
        results = await _run(deps, config, runnable)
    return kernel.TurnRecord(
        turn=state.turn, decision=decision, calls=calls, results=results, usage=usage, held=held
    )


async def _reserve(
    budget: TurnBudget,
    state: kernel.RunState,
    gate: kernel.Gate,
    *,
    prompt_estimate: int,
    pricing: kernel.Pricing,
) -> kernel.TurnRecord | None:
    """Reserve the call's worst case; the record that ends the run if it does not fit."""
    tokens, cost = worst_case(
        prompt_tokens=prompt_estimate, output_tokens=gate.max_output_tokens, pricing=pricing
    )
    refusal = await budget.reserve(tokens=tokens, cost_usd=cost, before=state)
    if refusal is None:
        return None
    if gate.summary:  # the run's own cap came first: end with it, without a summary
        return kernel.TurnRecord(turn=state.turn, summary=True)
    return kernel.TurnRecord(
        turn=state.turn,
        gate=kernel.Gate(kernel.Phase.TENANT_BUDGET_EXHAUSTED, message=refusal.message),
    )


async def _call_model(
    deps: TurnDeps,
    config: RunConfig,
    prompt: tuple[Mapping[str, Any], ...],
    tools: list[dict[str, Any]],
    *,
    max_output_tokens: int,
    prompt_estimate: int,
    budget: TurnBudget | None = None,
) -> tuple[dict[str, Any], kernel.Usage]:
    """One chat call inside a ``chat {model}`` span, with the GenAI client metrics; what it
    used is noted on ``budget`` at once (charged if the turn is abandoned after this).

    Raises ``ModelError`` (the span and metrics then carry ``error.type``).
    """
    model = config.model.model
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": telemetry.PROVIDER_NAME,
        "gen_ai.request.model": model,
        "gen_ai.request.max_tokens": max_output_tokens,
        "server.address": urllib.parse.urlsplit(config.model.base_url).hostname or "",
    }
    started = time.perf_counter()
    with telemetry.tracer().start_as_current_span(
        f"chat {model}", kind=trace.SpanKind.CLIENT, attributes=attributes
    ) as span:
        try:
            secret = config.model.secret
            api_key = await deps.secrets.api_key(secret) if secret else ""
            response, _attempts = await deps.model.complete(
                base_url=config.model.base_url,
                api_key=api_key,
                model=model,
                messages=prompt,
                tools=tools,
                max_output_tokens=max_output_tokens,
                deadline=config.deadline,
            )
        except ModelError as err:
            span.set_attribute("error.type", type(err).__name__)
            span.set_status(trace.Status(trace.StatusCode.ERROR, str(err)[:200]))
            metrics.record_model_call(
                model=model,
                seconds=time.perf_counter() - started,
                usage=None,
                error_type=type(err).__name__,
            )
            raise
        usage = kernel.read_usage(
            response, pricing=config.model.pricing, prompt_estimate=prompt_estimate
        )
        if budget is not None:
            budget.spent = usage
        span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
        if isinstance(response.get("id"), str):
            span.set_attribute("gen_ai.response.id", response["id"])
        metrics.record_model_call(
            model=model, seconds=time.perf_counter() - started, usage=usage, error_type=None
        )
        return response, usage


async def _run(
    deps: TurnDeps, config: RunConfig, calls: tuple[kernel.CheckedCall | kernel.InvalidCall, ...]
) -> tuple[kernel.ToolResult, ...]:
    context = ToolContext(
        namespace=config.namespace,
        run_name=config.name,
        run_uid=config.uid,
        call_id="",
        kube=deps.kube,
    )
    return await toolrunner.run_batch(
        calls,
        tools=deps.catalog,
        context=context,
        settings=deps.tool_settings,
        deadline=config.deadline,
    )


async def resume_turn(
    deps: TurnDeps, config: RunConfig, state: kernel.RunState
) -> kernel.TurnRecord:
    """Settle a decided approval: run the approved held calls, deny the others (never run)."""
    pending = state.pending
    assert pending is not None and pending.next_undecided is None
    approved = tuple(
        kernel.CheckedCall(h.id, h.name, h.arguments) for h in pending.held if h.approved
    )
    gate = kernel.admit_tool_batch(
        state, config.limits, calls=len(approved), now=deps.clock(), deadline=config.deadline
    )
    if gate.phase is not None:
        ran = toolrunner.not_run(approved, gate.message)
    else:
        ran = await _run(deps, config, approved)
    by_id = {r.tool_call_id: r for r in ran}
    results = tuple(
        by_id[h.id] if h.approved else kernel.ToolResult(h.id, h.name, kernel.DENIED, True)
        for h in pending.held
    )
    return kernel.TurnRecord(
        turn=state.turn, results=results, resume=True, gate=gate if gate.phase else None
    )
