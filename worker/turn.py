"""One turn of a run: carry out what the kernel plans — call the model, run the tools.

The kernel plans the turn (``kernel.plan_turn``, then ``kernel.plan_answer``) and makes every
record; this module only does the I/O in between, and decides no phase. It commits nothing
(``consumer`` does). Every I/O dependency comes in through ``TurnDeps``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ParamSpec, Protocol, TypeVar, assert_never

import cachetools
from opentelemetry import trace

from agentrun import kernel, metrics, telemetry
from agentrun.ledger import BudgetRefusal, BudgetWait, CallNeed
from agentrun.protocol import RemoteTool, RunConfig, SecretRef
from agentrun.tools import http_get, remote
from agentrun.tools.catalog import Catalog, Tool, ToolContext, ToolError

from . import budget, toolrunner
from .delivery import CUT_KEY, DELIVERED_KEY, ESTIMATE_KEY
from .effects import EffectLedger
from .model import ChatRequest, ModelClient, ModelError

log = logging.getLogger(__name__)


class SecretSource(Protocol):
    """Reads a model API key (``ModelError`` when it cannot)."""

    async def api_key(self, ref: SecretRef) -> str:
        """The key's value."""
        ...


class HeaderSecrets(Protocol):
    """Reads an MCP tool server's headers from a Secret (``ToolError`` when it cannot)."""

    async def headers(
        self, namespace: str, name: str, *, keys: tuple[str, ...]
    ) -> Mapping[str, str]:
        """Header name → value, one per key of ``keys`` (no other key of the Secret)."""
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
    headers: HeaderSecrets | None = None
    """Where MCP tool servers' ``headersFrom`` Secrets are read (``None``: such calls fail)."""
    remote_schemas: dict[tuple[str, str, str], kernel.ToolSchema] = dataclasses.field(
        default_factory=dict
    )
    """Compiled schemas of MCP tools, by (function name, effect, schema JSON): a server may
    change a tool's schema between runs, and an admin its effect class."""
    effects: EffectLedger | None = None
    """Where write and idempotent calls are recorded (``None``: nowhere; tests)."""
    mcp_sessions: remote.SessionPool | None = None
    """The process's reused MCP sessions (``None``: each MCP call opens its own)."""
    message_cap: int = kernel.MESSAGE_CAP
    """Bytes a turn's event may take (``Bus.event_cap``); its tool results get a share."""
    calibration: budget.PromptCalibration = dataclasses.field(
        default_factory=lambda: budget.PromptCalibration()
    )
    """Hidden prompt tokens seen per model, added to later prompts' bounds."""

    def tools_param(self, names: tuple[str, ...]) -> list[dict[str, Any]]:
        """The OpenAI ``tools`` request parameter for ``names`` (cached)."""
        found = self.openai_tools.get(names)
        if found is None:
            found = self.catalog.specs(names) if names else []
            self.openai_tools[names] = found
        return found

    def remote_schema(self, tool: RemoteTool) -> kernel.ToolSchema:
        """The compiled schema of an admitted MCP tool (cached by its schema)."""
        key = (tool.name, tool.effect, json.dumps(tool.parameters, sort_keys=True, default=str))
        compiled = self.remote_schemas.get(key)
        if compiled is None:
            compiled = kernel.ToolSchema(tool.name, tool.parameters, False, tool.effect)
            self.remote_schemas[key] = compiled
        return compiled

    def run_tools(self, config: RunConfig) -> dict[str, Tool]:
        """The tools ``config`` may call by function name: its built-in catalog tools
        (``http_get`` with the run's URL rules) and its MCP tools (calls of which read their
        headers Secret from ``headers`` and go through ``mcp_sessions``)."""
        tools: dict[str, Tool] = {n: self.catalog[n] for n in config.tools if n in self.catalog}
        if http_get.SPEC.name in tools:  # with the URLs the run's tenant allows
            tools[http_get.SPEC.name] = http_get.HttpGet(config.url_rules)
        pool = self.mcp_sessions
        for remote_tool in config.remote_tools:
            secret, keys, source = remote_tool.headers_secret, remote_tool.headers_keys, None
            if secret is not None and keys:
                source = functools.partial(_headers, self.headers, config.namespace, secret, keys)
            tools[remote_tool.name] = remote.mcp_tool(remote_tool, headers=source, pool=pool)
        return tools

    def schema(self, name: str) -> kernel.ToolSchema:
        """The compiled schema of a catalog tool."""
        compiled = self.schemas.get(name)
        if compiled is None:
            spec = self.catalog[name].spec
            compiled = kernel.ToolSchema(spec.name, spec.parameters, spec.pollable, spec.effect)
            self.schemas[name] = compiled
        return compiled


P = ParamSpec("P")
R = TypeVar("R")


def checks_untrusted_schemas(config: RunConfig) -> bool:
    """Whether the run's turns apply JSON Schemas a user or a tool server wrote: its
    ``spec.output.schema`` (``kernel.advance`` checks each final answer) or an MCP tool's
    ``inputSchema`` (``kernel.plan_answer`` checks each call's arguments)."""
    return config.output_schema is not None or bool(config.remote_tools)


async def off_loop(config: RunConfig, work: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """``work(*args, **kwargs)``: kernel work that checks the run's schemas, in a thread when
    they are a user's or a tool server's (``checks_untrusted_schemas``). Each check is
    bounded (``kernel.schemas.WORK_LIMIT``: at most about half a second of CPU) and always
    ends by itself, so a thread suffices where a process would also cost the run's state
    pickled per turn; meanwhile the event loop keeps serving the other runs' turns and
    heartbeats (RE2 releases the GIL while it matches; jsonschema's Python hands it over every
    few milliseconds). The platform's own tools' schemas are checked in place."""
    if checks_untrusted_schemas(config):
        return await asyncio.to_thread(work, *args, **kwargs)
    return work(*args, **kwargs)


async def _headers(
    source: HeaderSecrets | None, namespace: str, name: str, keys: tuple[str, ...]
) -> Mapping[str, str]:
    if source is None:
        why = f"cannot read Secret {namespace}/{name}: this worker reads no Secrets"
        raise ToolError(why, fault=kernel.ToolFault.TRANSPORT, unsent=True)
    return await source.headers(namespace, name, keys=keys)


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


async def execute_turn(
    deps: TurnDeps,
    config: RunConfig,
    state: kernel.RunState,
    *,
    clock: PhaseClock | None = None,
    hold: budget.BudgetHold | None = None,
) -> kernel.TurnRecord:
    """Run turn ``state.turn`` of the run ``config`` as the kernel plans it; never raises for
    model or tool faults.

    ``clock``, when given, receives the seconds spent calling the model and running tools.
    ``hold``, when given, reserves the model call's worst case in the tenant ledger after the
    run's own gates pass; a call that does not fit is not made (``kernel.refused_by_tenant``
    says how the run ends). Ledger errors (``LedgerUnavailable``, NATS errors) propagate: the
    turn is retried.

    Raises ``asyncio.CancelledError`` when cancelled (the turn is then abandoned uncommitted).
    """
    clock = clock or PhaseClock()
    tools = deps.run_tools(config)
    missing = [name for name in config.tools if name not in tools]
    plan = kernel.plan_turn(
        state,
        config.limits,
        pricing=config.model.pricing,
        offer=kernel.Offer(
            [] if missing else _tools_param(deps, config),
            missing,
            deps.calibration.hidden(config),
        ),
        clock=_now(deps, config),
    )
    match plan:
        case kernel.EndRun(record):
            return record
        case kernel.ResumeHeld():
            with clock.phase("tools"):
                return await _run(deps, config, tools, plan)
        case kernel.CallModel():
            turn = _Turn(deps, config, state, tools, clock)
            return await _answer(turn, plan, hold=hold)
        case _:
            assert_never(plan)


@dataclasses.dataclass(frozen=True, slots=True)
class _Turn:
    """The turn being carried out: the run, the state it builds on, what it uses."""

    deps: TurnDeps
    config: RunConfig
    state: kernel.RunState
    tools: Mapping[str, Tool]
    """The run's tools by the name the model sees."""
    clock: PhaseClock


async def _answer(
    turn: _Turn, call: kernel.CallModel, *, hold: budget.BudgetHold | None
) -> kernel.TurnRecord:
    """Reserve, call the model, and carry out what the kernel makes of its answer."""
    deps, config, state, tools, clock = turn.deps, turn.config, turn.state, turn.tools, turn.clock
    offered = _tools_param(deps, config) if call.sends_tools else []
    if hold is not None:
        need = CallNeed(
            prompt_tokens=call.prompt_estimate,
            output_tokens=call.max_output_tokens,
            pricing=config.model.pricing,
            min_output_tokens=budget.MIN_OUTPUT_TOKENS,
        )
        answer = await budget.hold_budget(
            hold, need, state=state, deadline=config.deadline, clock=deps.clock
        )
        if isinstance(answer, BudgetRefusal):
            return kernel.refused_by_tenant(call, answer.message)
        if isinstance(answer, BudgetWait):
            return kernel.model_failed(call, answer.message, clock=_now(deps, config))
        if answer.output_tokens < call.max_output_tokens:
            call = dataclasses.replace(call, max_output_tokens=answer.output_tokens)
    watch = None if hold is None else budget.SpendWatch(hold, call, config.model.pricing)
    try:
        with clock.phase("model"):
            response, usage = await _call_model(deps, config, call, offered, watch=watch)
    except ModelError as err:
        if watch is not None:  # a call abandoned (the deadline, a broken stream) is billed
            await watch.charge_abandoned()
        return kernel.model_failed(call, str(err), clock=_now(deps, config), fault=err.fault)
    budget.saw_usage(deps.calibration, config, call, usage)
    if hold is not None:
        await hold.spend(usage)
    step = await off_loop(
        config,
        kernel.plan_answer,
        state,
        config.limits,
        call,
        (kernel.classify(response), usage),
        tools=_tool_schemas(deps, config),
        clock=_now(deps, config),
    )
    if not isinstance(step, kernel.RunTools):
        return step
    with clock.phase("tools"):
        return await _run(deps, config, tools, step)


def _now(deps: TurnDeps, config: RunConfig) -> kernel.Timing:
    return kernel.Timing(now=deps.clock(), deadline=config.deadline)


def _tool_schemas(deps: TurnDeps, config: RunConfig) -> Mapping[str, kernel.ToolSchema]:
    schemas = {name: deps.schema(name) for name in config.tools if name in deps.catalog}
    schemas.update((t.name, deps.remote_schema(t)) for t in config.remote_tools)
    return schemas


def _tools_param(deps: TurnDeps, config: RunConfig) -> list[dict[str, Any]]:
    """The OpenAI ``tools`` of the run, in ``config.tools`` order (MCP tools with the schemas
    their server listed at admission)."""
    if not config.remote_tools:
        return deps.tools_param(config.tools)
    remote_specs = {t.name: remote.spec_of(t) for t in config.remote_tools}
    return [
        remote_specs[n].as_openai_tool() if n in remote_specs else deps.tools_param((n,))[0]
        for n in config.tools
    ]


async def _call_model(
    deps: TurnDeps,
    config: RunConfig,
    call: kernel.CallModel,
    tools: list[dict[str, Any]],
    *,
    watch: budget.SpendWatch | None,
) -> tuple[dict[str, Any], kernel.Usage]:
    """One chat call inside a ``chat {model}`` span, with the GenAI client metrics: the raw
    response and what the call used.

    Raises ``ModelError`` (the span and metrics then carry ``error.type``).
    """
    model = config.model.model
    started = time.perf_counter()
    with telemetry.tracer().start_as_current_span(
        f"chat {model}", kind=trace.SpanKind.CLIENT, attributes=_chat_attributes(config, call)
    ) as span:
        try:
            request = await _chat_request(deps, config, call, tools)
            response = await deps.model.complete(request, deadline=config.deadline, watch=watch)
        except ModelError as err:
            _record_failure(span, err, config=config, start=started)
            raise
        usage = await _read_usage(response, config=config, call=call, tools=tools)
        span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
        # OTel GenAI: the reasoning part, which gen_ai.usage.output_tokens includes
        span.set_attribute("gen_ai.usage.reasoning.output_tokens", usage.reasoning_tokens)
        if isinstance(response.get("id"), str):
            span.set_attribute("gen_ai.response.id", response["id"])
        metrics.record_model_call(config, seconds=time.perf_counter() - started, usage=usage)
        return response, usage


IN_THREAD_TOKENS = 1 << 20
"""The prompt's bound (``CallModel.prompt_estimate``: at least a token a byte of the
conversation) above which a call's usage is read in a thread: checking a provider's count
against the text's floor (``kernel.least_tokens``) may read it all (about 40 ms a megabyte),
and the event loop serves the other runs meanwhile."""


async def _read_usage(
    response: dict[str, Any],
    *,
    config: RunConfig,
    call: kernel.CallModel,
    tools: Sequence[Mapping[str, Any]],
) -> kernel.Usage:
    """``_usage_of``, in a thread for a prompt whose bound passes ``IN_THREAD_TOKENS``."""
    if call.prompt_estimate > IN_THREAD_TOKENS:
        return await asyncio.to_thread(_usage_of, response, config=config, call=call, tools=tools)
    return _usage_of(response, config=config, call=call, tools=tools)


def _usage_of(
    response: dict[str, Any],
    *,
    config: RunConfig,
    call: kernel.CallModel,
    tools: Sequence[Mapping[str, Any]] = (),
) -> kernel.Usage:
    """What the call used: the provider's usage (``kernel.read_usage``: estimated from what
    was delivered when there is none, capped at the allowance only for a streamed answer);
    for a response the worker cut, the prompt's bound and the output it had delivered,
    flagged estimated."""
    cut = response.get(CUT_KEY)
    if not isinstance(cut, int):
        floor, estimate = response.get(DELIVERED_KEY), response.get(ESTIMATE_KEY)
        streamed = isinstance(floor, int)  # else sent whole: not cut, its estimate not capped
        return kernel.read_usage(
            _believable(response, config=config, call=call),
            pricing=config.model.pricing,
            prompt_estimate=call.prompt_estimate,
            max_output_tokens=call.max_output_tokens if streamed else None,
            prompt_texts=kernel.prompt_texts(call.prompt, tools),
            delivered=kernel.Delivered(
                floor if isinstance(floor, int) else 0,
                estimate if isinstance(estimate, int) else 0,
            ),
        )
    prompt, pricing = call.prompt_estimate, config.model.pricing
    cost = pricing.cost(input_tokens=prompt, cached_input_tokens=0, output_tokens=cut)
    return kernel.Usage(prompt, cut, 0, cost, estimated=True)


def _believable(
    response: dict[str, Any], *, config: RunConfig, call: kernel.CallModel
) -> dict[str, Any]:
    """``response``, less its ``usage`` when a count in it is more than the call could bill
    (``kernel.implausible_usage`` past ``kernel.most_billable`` of the AgentModel's
    ``contextWindow`` and the prompt's bound): it is then estimated as a missing one is, and a
    warning names the count."""
    most = kernel.most_billable(
        context_window=config.model.context_window, prompt_bound=call.prompt_estimate
    )
    beyond = kernel.implausible_usage(response, most=most)
    if beyond is None:
        return response
    told = (config.namespace, config.name, config.model.name)
    with _TOLD_LOCK:  # reached on the loop and, for a long prompt, on a thread (``_read_usage``)
        first = told not in _TOLD_IMPLAUSIBLE  # once a run and model an hour
        if first:
            _TOLD_IMPLAUSIBLE[told] = True
    if first:
        log.warning(
            "AgentModel %r reported usage no call could bill (%s, the most its contextWindow "
            "and the prompt's bound allow) for run %s/%s; charged the estimate instead (said "
            "once an hour a run; agentrun_usage_estimated_total counts every call)",
            config.model.name,
            beyond[:200],
            config.namespace,
            config.name,
        )
    return {key: value for key, value in response.items() if key != "usage"}


_TOLD_IMPLAUSIBLE: cachetools.TTLCache[tuple[str, str, str], bool] = cachetools.TTLCache(
    maxsize=4096, ttl=3600
)
"""The runs (namespace, name, AgentModel) whose model's implausible usage was logged within
the hour: a tenant's model reporting it at every call wrote a warning of up to 4 KB each."""
_TOLD_LOCK = threading.Lock()
"""Guards ``_TOLD_IMPLAUSIBLE`` (``cachetools`` caches are not thread-safe)."""


def _chat_attributes(config: RunConfig, call: kernel.CallModel) -> dict[str, Any]:
    """The ``chat`` span's request attributes (OpenTelemetry GenAI conventions)."""
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": telemetry.PROVIDER_NAME,
        "gen_ai.request.model": config.model.model,
        "gen_ai.request.max_tokens": call.max_output_tokens,
        "server.address": urllib.parse.urlsplit(config.model.base_url).hostname or "",
    }


async def _chat_request(
    deps: TurnDeps, config: RunConfig, call: kernel.CallModel, tools: list[dict[str, Any]]
) -> ChatRequest:
    """The wire request of the call, with the model's API key read from its Secret (raises
    ``ModelError`` when it cannot be read)."""
    secret = config.model.secret
    return ChatRequest(
        base_url=config.model.base_url,
        api_key=await deps.secrets.api_key(secret) if secret else "",
        model=config.model.model,
        messages=call.prompt,
        tools=tools,
        max_output_tokens=call.max_output_tokens,
        tool_choice=call.tool_choice if tools else None,
    )


def _record_failure(span: trace.Span, err: ModelError, *, config: RunConfig, start: float) -> None:
    """A failed call on its span (``error.type``, status) and in the model-call metrics."""
    span.set_attribute("error.type", type(err).__name__)
    span.set_status(trace.Status(trace.StatusCode.ERROR, str(err)[:200]))
    metrics.record_model_call(
        config,
        seconds=time.perf_counter() - start,
        usage=None,
        error_type=err.error_type,
        error_class=type(err).__name__,
    )


async def _run(
    deps: TurnDeps,
    config: RunConfig,
    tools: Mapping[str, Tool],
    step: kernel.RunTools | kernel.ResumeHeld,
) -> kernel.TurnRecord:
    """Run ``step``'s calls and make its record, the results bounded to ``deps.message_cap``."""
    context = ToolContext(config.namespace, config.name, config.uid, call_id="", kube=deps.kube)
    results = await toolrunner.run_batch(
        step.runnable,
        tools=tools,
        context=context,
        settings=deps.tool_settings,
        deadline=config.deadline,
        effects=deps.effects,
    )
    return step.finish(results, cap=deps.message_cap)
