"""Per-run limits and model pricing, as plain values (converted from the CRDs at the edge)."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

MILLION = Decimal(1_000_000)
MIN_SHRUNK_OUTPUT_TOKENS = 128
"""The smallest output allowance a call is shrunk to when its tenant's budget left cannot hold
its full allowance: what a call needs at least to be made (the worker's reservation and the
operator's admission agree on it)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Pricing:
    """USD per one million tokens, from the cluster-scoped AgentModel (never from a run)."""

    input_per_million: Decimal = Decimal(0)
    """Price of uncached input (prompt) tokens."""
    cached_input_per_million: Decimal = Decimal(0)
    """Price of input tokens served from the provider's prompt cache."""
    output_per_million: Decimal = Decimal(0)
    """Price of output (completion) tokens."""

    def cost(self, *, input_tokens: int, cached_input_tokens: int, output_tokens: int) -> Decimal:
        """Cost in USD; ``cached_input_tokens`` is the cached part of ``input_tokens``.

        Follows the OpenAI usage shape: ``prompt_tokens`` includes
        ``prompt_tokens_details.cached_tokens``, which are billed at the cached rate.
        """
        cached = min(cached_input_tokens, input_tokens)
        return (
            Decimal(input_tokens - cached) * self.input_per_million
            + Decimal(cached) * self.cached_input_per_million
            + Decimal(output_tokens) * self.output_per_million
        ) / MILLION

    def most(self, *, input_tokens: int, output_tokens: int) -> Decimal:
        """The most ``input_tokens`` prompt tokens and ``output_tokens`` can cost in USD,
        whichever part of the prompt the provider serves from its cache: the prompt at the
        dearer of the two input prices (the cached one is never dearer on an AgentModel the
        operator accepts; a run admitted before that rule may carry one)."""
        cached = input_tokens if self.cached_input_per_million > self.input_per_million else 0
        return self.cost(
            input_tokens=input_tokens, cached_input_tokens=cached, output_tokens=output_tokens
        )


class OnExhausted(enum.StrEnum):
    """``spec.budget.onExhausted``: what a step, token or cost cap does."""

    SUMMARIZE = "summarize"
    """One last tool-free model call writes a summary to ``.status.answer``."""
    STOP = "stop"
    """End at once."""


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    """A run's budget (``spec.budget``) plus the model's window, all enforced in code."""

    max_steps: int = 20
    """Model calls a run may make (corrective turns count)."""
    max_tool_calls: int = 50
    """Tool calls a run may make in total."""
    max_tokens: int | None = None
    """Input + output tokens a run may use; ``None``: no per-run token cap."""
    max_cost_usd: Decimal | None = None
    """USD a run may spend; ``None``: no per-run cost cap."""
    context_window: int = 128_000
    """The model's context window in tokens (AgentModel ``contextWindow``)."""
    max_output_tokens: int = 4096
    """Most tokens one model call may produce (AgentModel ``maxOutputTokens``)."""
    malformed_limit: int = 3
    """Consecutive malformed turns that end a run with ``invalid_decision``."""
    min_output_tokens: int = 16
    """A model call that could produce fewer tokens than this within budget is not made."""
    no_progress_window: int = 3
    """Consecutive stale turns that earn a nudge; twice as many end ``no_progress``."""
    pollable: frozenset[str] = frozenset()
    """Tools exempt from the no-progress breaker (``spec.budget.noProgress.pollable``)."""
    unavailable_turns: int = 3
    """Consecutive turns in which a tool's calls all failed for infrastructure reasons
    (after the runner's retries) that end the run ``tool_unavailable``. Errors the model
    caused never count."""
    output_schema: Mapping[str, Any] | None = None
    """JSON Schema the final answer must meet (``spec.output.schema``)."""
    output_attempts: int = 2
    """Final answers failing ``output_schema`` before ``invalid_output`` (one correction)."""
    on_exhausted: OnExhausted = OnExhausted.SUMMARIZE
    """What the step, token and cost caps do."""
    summary_output_tokens: int = 1024
    """Output allowance of the summary call."""
    approval_tools: frozenset[str] = frozenset()
    """Tools whose calls wait for a person (``spec.approval.tools``)."""
