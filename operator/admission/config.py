"""Admission's rules: an AgentRun spec plus its AgentModel → a ``RunConfig``, or why not; what
its first model call may cost at worst, and whether that can ever fit its tenant.

Pure: the caller fetches the objects (``lookup``); nothing here talks to the API server.
Everything a run can spend is read from here once and frozen into the admitted event (prices
come only from the cluster-scoped AgentModel, never from the run).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from agentrun import kernel
from agentrun.ledger import TenantLimits, worst_case
from agentrun.protocol import DEFAULT_TENANT, ModelConfig, RemoteTool, RunConfig, UrlRule

from .. import agents, runs
from ..platform.spec import ReferenceMissing, SpecError, not_found, with_hints

UNPRICED_HINT = (
    "set its spec.pricing input and output prices (USD per 1M tokens), or spec.pricing.free: "
    "true if its calls cost nothing"
)


def check_metered(
    name: str, model: Mapping[str, Any], *, spec: runs.AgentRunSpec, tenant: str, tenant_cost: bool
) -> None:
    """Refuse a run whose cost budget its AgentModel could not enforce: the model has no
    prices, or only one of input and output (``PricingSpec.unpriced``), and the run has
    ``spec.budget.maxCostUSD`` or its AgentTenant a cost budget (``tenant_cost``). Raises
    ``SpecError`` naming the field."""
    try:
        pricing = agents.AgentModelSpec.of(name, model.get("spec")).pricing
    except SpecError as err:
        raise SpecError(str(err)) from None
    if not pricing.unpriced:
        return
    if spec.budget.max_cost_usd is not None:
        where = f"spec.budget.maxCostUSD {spec.budget.max_cost_usd}"
    elif tenant_cost:
        where = f"AgentTenant {tenant!r} spec.budget.costUSD"
    else:
        return
    raise SpecError(
        f"spec.model: AgentModel {name!r} has {pricing.unpriced_text()}, so {where} cannot be "
        f"enforced (its calls would cost 0 USD for what it leaves unpriced): {UNPRICED_HINT}"
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Resolved:
    """What admission resolved for a run beyond its spec."""

    tenant: str = DEFAULT_TENANT
    """The AgentTenant that admits and pays for the run."""
    remote_tools: Sequence[RemoteTool] = ()
    """The run's MCP tools (``SERVER/TOOL`` in the spec), resolved against AgentToolServers."""
    url_rules: Sequence[UrlRule] = ()
    """What ``http_get`` may fetch (the tenant's rules)."""


def run_timeout(spec: runs.AgentRunSpec) -> float:
    """Seconds from a run's admission to its deadline: ``spec.budget.timeout``, or the implicit
    one."""
    timeout = spec.budget.timeout or runs.IMPLICIT_BUDGET.timeout
    assert timeout is not None
    return timeout.seconds


def build_run_config(
    run: runs.RunKey,
    spec: runs.AgentRunSpec,
    *,
    model: ModelConfig | None,
    known_tools: Mapping[str, bool],
    start_time: float,
    resolved: Resolved = Resolved(),
) -> RunConfig:
    """Validate ``spec`` against its AgentModel and the worker's tool catalog.

    ``spec`` is the run's spec as its tenant admits it (``TenantPolicy.apply``); budget
    fields it still leaves unset get the implicit defaults. ``model`` is the AgentModel's
    ``ModelConfig`` or ``None`` when it does not exist. ``known_tools`` maps the worker
    catalog's tool names to whether each is pollable (exempt from the no-progress breaker, like
    ``spec.budget.noProgress.pollable``). In the config every name of a remote tool (tools,
    approval, pollable) is the function name the model sees (``SERVER__TOOL``). ``start_time``
    is epoch seconds (the deadline counts from it). Raises ``SpecError`` with a message
    naming the field (unknown model, unknown tools, approval of tools the run does not have).
    """
    if model is None:
        raise ReferenceMissing(f"spec.model: {not_found('AgentModel', spec.model)}")
    rename = {f"{t.server}/{t.tool}": t.name for t in resolved.remote_tools}
    _check_tools(spec, known_tools=known_tools, remote=set(rename))
    limits = run_limits(spec, model=model, known_tools=known_tools, rename=rename)
    return RunConfig(
        uid=run.uid,
        namespace=run.namespace,
        name=run.name,
        goal=spec.goal,
        instructions=spec.instructions or "",
        tools=tuple(rename.get(t, t) for t in spec.tools),
        limits=limits,
        model=model,
        deadline=start_time + run_timeout(spec),
        tenant=resolved.tenant,
        output_schema=limits.output_schema,
        remote_tools=tuple(resolved.remote_tools),
        url_rules=tuple(resolved.url_rules),
    )


def _check_tools(
    spec: runs.AgentRunSpec, *, known_tools: Mapping[str, bool], remote: set[str]
) -> None:
    """Raises ``SpecError`` for a tool neither in the catalog nor ``remote`` (``SERVER/TOOL``
    names), or an approval of a tool the run does not have."""
    unknown = sorted(set(spec.tools) - set(known_tools) - remote)
    if unknown:
        raise SpecError(
            f"spec.tools: unknown tool(s) {with_hints(unknown, [*known_tools, *remote])}; "
            f"the worker's catalog has "
            f"{', '.join(sorted(known_tools))} (an AgentToolServer's tools are named SERVER/TOOL)"
        )
    approval = set(spec.approval.tools)
    if approval - set(spec.tools):
        raise SpecError(
            f"spec.approval.tools: {', '.join(sorted(approval - set(spec.tools)))} not in "
            "spec.tools"
        )


def run_limits(
    spec: runs.AgentRunSpec,
    *,
    model: ModelConfig,
    known_tools: Mapping[str, bool],
    rename: Mapping[str, str] | None = None,
) -> kernel.Limits:
    """The kernel's limits of a run: its budget (unset caps from ``runs.IMPLICIT_BUDGET``), its
    model's window, its pollable tools (declared, or pollable in the catalog). ``rename`` maps
    ``SERVER/TOOL`` names to the function names the kernel sees."""
    names = rename or {}
    budget = spec.budget
    caps = budget.filled_from(runs.IMPLICIT_BUDGET)
    assert caps.max_steps is not None and caps.max_tool_calls is not None
    pollable = set(budget.no_progress.pollable) | {t for t in spec.tools if known_tools.get(t)}
    return kernel.Limits(
        max_steps=caps.max_steps,
        max_tool_calls=caps.max_tool_calls,
        max_tokens=caps.max_tokens,
        max_cost_usd=caps.max_cost_usd,
        context_window=model.context_window,
        max_output_tokens=model.max_output_tokens,
        no_progress_window=budget.no_progress.window,
        pollable=frozenset(names.get(t, t) for t in pollable),
        output_schema=spec.output.json_schema,
        on_exhausted=budget.on_exhausted,
        approval_tools=frozenset(names.get(t, t) for t in spec.approval.tools),
    )


def first_call_need(config: RunConfig, *, tools: Sequence[Any]) -> tuple[int, Decimal]:
    """The smallest worst case (tokens, USD) of the run's first model call, as its worker's
    reservation would shrink it: the prompt's upper bound (``kernel.plan_turn``'s, the same
    the worker reserves) and ``kernel.MIN_SHRUNK_OUTPUT_TOKENS`` of output (fewer if the run's
    own allowance is smaller); (0, 0) if its own limits stop it before any call. ``tools``:
    the OpenAI ``tools`` list its worker sends.

    Admission asks the tenant's budget for this much — what the worker's reservation needs
    at least — so a run is admitted whenever its first call can be made at all, its output
    allowance then shrinking to what is left; a run that waits ``Queued`` for budget is
    admitted once that much is free.
    """
    state = kernel.initial_state(goal=config.goal, instructions=config.instructions)
    plan = kernel.plan_turn(
        state,
        config.limits,
        pricing=config.model.pricing,
        offer=kernel.Offer(tools),
        clock=kernel.Timing(now=0.0, deadline=math.inf),
    )
    if not isinstance(plan, kernel.CallModel):
        return 0, Decimal(0)
    return worst_case(
        prompt_tokens=plan.prompt_estimate,
        output_tokens=min(plan.max_output_tokens, kernel.MIN_SHRUNK_OUTPUT_TOKENS),
        pricing=config.model.pricing,
    )


def never_fits(need: tuple[int, Decimal], *, tenant: str, limits: TenantLimits) -> str | None:
    """Why a run's first call (``need``: tokens, USD) exceeds its tenant's whole budget per
    window, if it does; such a run would block everyone queued behind it for ever."""
    tokens, cost = need
    hint = (
        f"; even its smallest call (its prompt and {kernel.MIN_SHRUNK_OUTPUT_TOKENS} output "
        "tokens) cannot fit: shorten its goal and instructions, or raise the tenant's budget"
    )
    if limits.tokens is not None and tokens > limits.tokens:
        return (
            f"its first model call may use up to {tokens} tokens, more than AgentTenant "
            f"{tenant!r} allows per window ({limits.tokens}){hint}"
        )
    if limits.cost_usd is not None and cost > limits.cost_usd:
        return (
            f"its first model call may cost up to {cost} USD, more than AgentTenant "
            f"{tenant!r} allows per window ({limits.cost_usd}){hint}"
        )
    return None


def too_large_to_checkpoint(config: RunConfig, *, cap: int | None) -> str:
    """Why ``config`` cannot be admitted: its ``admitted`` event is over the event stream's
    message cap (``cap`` bytes, ``None`` when the server did not say), naming the run's largest
    part (``spec.goal``, ``spec.instructions``, ``spec.output.schema`` or the input schemas of
    its MCP tools) with its size in UTF-8 bytes of JSON."""
    parts = {
        "spec.goal": len(json.dumps(config.goal, ensure_ascii=False).encode()),
        "spec.instructions": len(json.dumps(config.instructions, ensure_ascii=False).encode()),
        "spec.output.schema": len(
            json.dumps(config.output_schema, ensure_ascii=False, separators=(",", ":")).encode()
        )
        if config.output_schema is not None
        else 0,
        "the input schemas of its MCP tools (spec.tools)": sum(
            len(json.dumps(t.parameters, ensure_ascii=False, separators=(",", ":")).encode())
            for t in config.remote_tools
        ),
    }
    field, size = max(parts.items(), key=lambda part: part[1])
    limit = f"the {cap} bytes" if cap is not None else "what"
    return (
        f"{field}: {size} bytes; the run's admitted event, which checkpoints its spec, is over "
        f"{limit} one event on the bus may hold: shorten it"
    )
