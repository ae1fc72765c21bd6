"""Admission: turn an AgentRun spec plus its AgentModel into a ``RunConfig``, or say why not.

Pure: the caller fetches the objects; nothing here talks to the API server. Everything a run
can spend is read from here once and frozen into the admitted event (prices come only from the
cluster-scoped AgentModel, never from the run).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from agentrun import kernel
from agentrun.ledger import TenantLimits, worst_case
from agentrun.protocol import DEFAULT_TENANT, ModelConfig, RunConfig, SecretRef

from .runs import RunKey

DEFAULT_TIMEOUT = "10m"
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


class InvalidSpec(Exception):
    """The run cannot be admitted as written; the message names the field."""


def parse_duration(text: str) -> float:
    """Seconds in a Go-style duration (``90s``, ``1h30m``, ``1.5s``, ``250ms``).

    Raises ``InvalidSpec`` for anything else (the CRD pattern rejects most of it first).
    """
    text = text.strip()
    pos = 0
    total = 0.0
    for match in _DURATION.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise InvalidSpec(f"spec.budget.timeout: {text!r} is not a duration like 90s, 10m or 1h30m")
    return total


def _decimal(value: Any, field: str) -> Decimal:
    try:
        number = Decimal(str(value))
    except InvalidOperation as err:
        raise InvalidSpec(f"{field}: {value!r} is not a decimal number") from err
    if not number.is_finite() or number < 0:
        raise InvalidSpec(f"{field}: {value!r} must be a non-negative decimal")
    return number


def model_config(name: str, model: Mapping[str, Any]) -> ModelConfig:
    """The AgentModel object (as a dict) as a ``ModelConfig``; raises ``InvalidSpec``."""
    spec = model.get("spec") or {}
    pricing = spec.get("pricing") or {}
    secret = (spec.get("credentials") or {}).get("secretRef")
    where = f"AgentModel {name!r} spec.pricing"
    return ModelConfig(
        name=name,
        base_url=str(spec.get("baseURL", "")),
        model=str(spec.get("model", "")),
        pricing=kernel.Pricing(
            _decimal(pricing.get("inputPerMillionUSD", "0"), f"{where}.inputPerMillionUSD"),
            _decimal(
                pricing.get("cachedInputPerMillionUSD", "0"), f"{where}.cachedInputPerMillionUSD"
            ),
            _decimal(pricing.get("outputPerMillionUSD", "0"), f"{where}.outputPerMillionUSD"),
        ),
        context_window=int(spec.get("contextWindow", 128_000)),
        max_output_tokens=int(spec.get("maxOutputTokens", 4096)),
        secret=SecretRef(
            name=str(secret["name"]),
            namespace=str(secret["namespace"]),
            key=str(secret.get("key", "apiKey")),
        )
        if secret
        else None,
    )


def build_run_config(
    run: RunKey,
    spec: Mapping[str, Any],
    *,
    model: Mapping[str, Any] | None,
    known_tools: Mapping[str, bool],
    start_time: float,
    tenant: str = DEFAULT_TENANT,
) -> RunConfig:
    """Validate ``spec`` against its AgentModel and the worker's tool catalog.

    ``known_tools`` maps the worker catalog's tool names to whether each is pollable (exempt
    from the no-progress breaker, like ``spec.budget.noProgress.pollable``).
    ``model`` is the AgentModel object or ``None`` when it does not exist; ``start_time`` is
    epoch seconds (the deadline counts from it). Raises ``InvalidSpec`` with a message naming
    the field (unknown model, unknown tools, unusable budget).
    """
    model_name = str(spec.get("model", ""))
    if model is None:
        raise InvalidSpec(f"spec.model: AgentModel {model_name!r} not found")
    tools = tuple(spec.get("tools") or ())
    unknown = sorted(set(tools) - set(known_tools))
    if unknown:
        raise InvalidSpec(
            f"spec.tools: unknown tool(s) {', '.join(unknown)}; the worker's catalog has "
            f"{', '.join(sorted(known_tools))}"
        )
    approval = set((spec.get("approval") or {}).get("tools") or ())
    if approval - set(tools):
        raise InvalidSpec(
            f"spec.approval.tools: {', '.join(sorted(approval - set(tools)))} not in spec.tools"
        )
    budget = spec.get("budget") or {}
    resolved = model_config(model_name, model)
    timeout = parse_duration(str(budget.get("timeout", DEFAULT_TIMEOUT)))
    cost = budget.get("maxCostUSD")
    max_tokens = budget.get("maxTokens")
    no_progress = budget.get("noProgress") or {}
    pollable = set(no_progress.get("pollable") or ()) | {t for t in tools if known_tools.get(t)}
    limits = kernel.Limits(
        max_steps=int(budget.get("maxSteps", 20)),
        max_tool_calls=int(budget.get("maxToolCalls", 50)),
        max_tokens=int(max_tokens) if max_tokens is not None else None,
        max_cost_usd=_decimal(cost, "spec.budget.maxCostUSD") if cost is not None else None,
        context_window=resolved.context_window,
        max_output_tokens=resolved.max_output_tokens,
        no_progress_window=int(no_progress.get("window", 3)),
        pollable=frozenset(pollable),
        output_schema=(spec.get("output") or {}).get("schema"),
        on_exhausted=kernel.OnExhausted(str(budget.get("onExhausted", "summarize"))),
        approval_tools=frozenset(approval),
    )
    return RunConfig(
        uid=run.uid,
        namespace=run.namespace,
        name=run.name,
        goal=str(spec.get("goal", "")),
        instructions=str(spec.get("instructions") or ""),
        tools=tools,
        limits=limits,
        model=resolved,
        deadline=start_time + timeout,
        tenant=tenant,
        output_schema=limits.output_schema,
    )


def first_call_need(config: RunConfig, tools: Sequence[Any]) -> tuple[int, Decimal]:
    """The worst case (tokens, USD) of the run's first model call, as its worker will reserve
    it (the same prompt estimate and output allowance); (0, 0) if its own limits stop it
    before any call. ``tools``: the OpenAI ``tools`` list its worker sends.

    Admission asks the tenant's budget for this much, so a run that waits ``Queued`` for
    budget is admitted only once its first call can actually be made.
    """
    state = kernel.initial_state(goal=config.goal, instructions=config.instructions)
    prompt = kernel.fit_context(state.messages, limits=config.limits, tools=tools)
    gate = kernel.admit_model_call(
        state,
        config.limits,
        pricing=config.model.pricing,
        prompt_estimate=prompt.tokens,
        now=0.0,
        deadline=math.inf,
    )
    if gate.phase is not None:
        return 0, Decimal(0)
    return worst_case(
        prompt_tokens=prompt.tokens,
        output_tokens=gate.max_output_tokens,
        pricing=config.model.pricing,
    )


def never_fits(tenant: str, limits: TenantLimits, need: tuple[int, Decimal]) -> str | None:
    """Why a run's first call (``need``: tokens, USD) exceeds its tenant's whole budget per
    window, if it does; such a run would block everyone queued behind it for ever."""
    tokens, cost = need
    hint = (
        "; give the run a lower spec.budget.maxTokens or maxCostUSD (or the tenant a "
        "runBudget.default), which bounds each call's output allowance"
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
