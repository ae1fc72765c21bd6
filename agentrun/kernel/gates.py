"""Budget gates: may the next model call (or tool batch) start, and within which allowance?

Pure verdicts (``Gate``) from the run's state, its limits and the clock the caller passes in;
``plan_turn`` turns them into what the worker does next.
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal

from agentrun.kernel.limits import Limits, Pricing
from agentrun.kernel.records import Ending, Gate
from agentrun.kernel.state import RunState
from agentrun.kernel.terminal import Phase
from agentrun.kernel.usage import Usage


def _pct_left(used: Decimal, cap: Decimal) -> str:
    return f"{used} of {cap}"


def admit_model_call(
    state: RunState,
    limits: Limits,
    *,
    pricing: Pricing,
    prompt_estimate: int,
    now: float,
    deadline: float,
) -> Gate:
    """May the next model call start, and with how many output tokens at most?

    Checks, in order: the wall-clock deadline (``now``/``deadline`` in epoch seconds), a pending
    summary at a cap (allowed once, with at most ``summary_output_tokens``, only within what
    the run's token and cost caps leave), the step cap, then the
    token and cost caps against the worst case of this call (``prompt_estimate`` input tokens
    plus the output allowance). The output allowance is cut to what the budgets
    leave; below ``limits.min_output_tokens`` the call is not made.
    """
    if now >= deadline:
        return Gate(
            Phase.DEADLINE_EXCEEDED, message="the run's timeout passed before the next model call"
        )
    if state.pending_cap is not None:
        return _summary_gate(state, limits, pricing=pricing, prompt_estimate=prompt_estimate)
    if state.steps >= limits.max_steps:
        return Gate(Phase.MAX_STEPS, message=f"maxSteps {limits.max_steps} reached")
    allowance = _token_allowance(state, limits, prompt_estimate=prompt_estimate)
    if isinstance(allowance, Gate):
        return allowance
    allowance = _cost_allowance(
        state, limits, pricing=pricing, prompt_estimate=prompt_estimate, allowance=allowance
    )
    if isinstance(allowance, Gate):
        return allowance
    return Gate(None, max_output_tokens=allowance)


def _summary_gate(
    state: RunState, limits: Limits, *, pricing: Pricing, prompt_estimate: int
) -> Gate:
    """The summary call at a cap, within what the run's token and cost caps leave (at most
    ``summary_output_tokens``); when they leave less than ``min_output_tokens``, no summary:
    the run ends with its cap (a summary would spend past it)."""
    assert state.pending_cap is not None
    bounded = dataclasses.replace(limits, max_output_tokens=limits.summary_output_tokens)
    allowance = _token_allowance(state, bounded, prompt_estimate=prompt_estimate)
    if not isinstance(allowance, Gate):
        allowance = _cost_allowance(
            state, bounded, pricing=pricing, prompt_estimate=prompt_estimate, allowance=allowance
        )
    if isinstance(allowance, Gate):
        return Gate(state.pending_cap, message=f"{state.message}; no budget left for a summary")
    return Gate(None, max_output_tokens=allowance, summary=True)


def _token_allowance(state: RunState, limits: Limits, *, prompt_estimate: int) -> int | Gate:
    """The output allowance ``maxTokens`` leaves after the run's usage and this prompt, or the
    gate that ends the run when it is below ``limits.min_output_tokens``."""
    if limits.max_tokens is None:
        return limits.max_output_tokens
    left = limits.max_tokens - state.usage.total_tokens - prompt_estimate
    if left < limits.min_output_tokens:
        return Gate(
            Phase.TOKEN_BUDGET_EXHAUSTED,
            message=f"maxTokens {limits.max_tokens}: {state.usage.total_tokens} used, "
            f"the next prompt needs about {prompt_estimate}",
        )
    return min(limits.max_output_tokens, left)


def _cost_allowance(
    state: RunState, limits: Limits, *, pricing: Pricing, prompt_estimate: int, allowance: int
) -> int | Gate:
    """``allowance`` cut to the output tokens ``maxCostUSD`` still pays for after the run's
    spend and this prompt, or the gate that ends the run when that is below
    ``limits.min_output_tokens``."""
    if limits.max_cost_usd is None:
        return allowance
    left_usd = limits.max_cost_usd - state.usage.cost_usd
    left_usd -= pricing.most(input_tokens=prompt_estimate, output_tokens=0)
    if pricing.output_per_million > 0:
        affordable = int(left_usd * Decimal(1_000_000) / pricing.output_per_million)
    else:
        affordable = allowance if left_usd >= 0 else -1
    if affordable < limits.min_output_tokens:
        return Gate(
            Phase.COST_BUDGET_EXHAUSTED,
            message=f"maxCostUSD: {_pct_left(state.usage.cost_usd, limits.max_cost_usd)} "
            "spent; the next call could exceed it",
        )
    return min(allowance, affordable)


def overrun(before: RunState, limits: Limits, usage: Usage) -> Ending | None:
    """The run's own cap that a model call using ``usage`` on top of ``before``'s spend went
    past, if it did: a provider that ignored the call's ``max_tokens``, or counted more prompt
    tokens than the gate's bound (hidden template text). Reaching a cap exactly is no overrun
    (``used ≤ limit`` holds); going past it ends the run with the cap's reason at once — no
    summary call, no tool of the reply run — its answer kept. ``None`` within every cap."""
    after = before.usage + usage
    if limits.max_tokens is not None and after.total_tokens > limits.max_tokens:
        over = after.total_tokens - limits.max_tokens
        return Ending(
            Phase.TOKEN_BUDGET_EXHAUSTED,
            f"maxTokens {limits.max_tokens} overrun by {over} tokens: one call used "
            f"{usage.input_tokens} input and {usage.output_tokens} output tokens "
            f"({after.total_tokens} in all{', estimated' if usage.estimated else ''})",
        )
    if limits.max_cost_usd is not None and after.cost_usd > limits.max_cost_usd:
        over_usd = after.cost_usd - limits.max_cost_usd
        return Ending(
            Phase.COST_BUDGET_EXHAUSTED,
            f"maxCostUSD {limits.max_cost_usd} overrun by {over_usd} USD: one call used "
            f"{usage.input_tokens} input and {usage.output_tokens} output tokens "
            f"({after.cost_usd} USD in all)",
        )
    return None


def admit_tool_batch(
    state: RunState, limits: Limits, *, calls: int, now: float, deadline: float
) -> Gate:
    """May a batch of ``calls`` valid tool calls run within the deadline and ``maxToolCalls``?

    All or none: a batch that does not fit is not started (its calls get "not run" results).
    """
    if calls and now >= deadline:
        return Gate(
            Phase.DEADLINE_EXCEEDED, message="the run's timeout passed before the tool batch"
        )
    if state.tool_calls + calls > limits.max_tool_calls:
        return Gate(
            Phase.TOOL_BUDGET_EXHAUSTED,
            message=f"maxToolCalls {limits.max_tool_calls}: {state.tool_calls} made, "
            f"{calls} more requested",
        )
    return Gate(None)
