"""The budget gates at their boundaries, and what they say: a cap reached exactly still admits,
output allowances round down, every prompt token is priced uncached, and each refusal's
message (it becomes the run's ``.status.message``) names the cap. Written from the mutants
``make mutate`` found alive in ``kernel.gates`` (tests/README.md)."""

from __future__ import annotations

from decimal import Decimal

from agentrun import kernel
from agentrun.kernel import Phase

from .helpers import checked, tool_turn

NOW, LATER = 1000.0, 2000.0


def start() -> kernel.RunState:
    return kernel.initial_state(goal="do it")


def admit(
    state: kernel.RunState,
    limits: kernel.Limits,
    *,
    estimate: int = 50,
    pricing: kernel.Pricing | None = None,
    now: float = NOW,
) -> kernel.Gate:
    return kernel.admit_model_call(
        state,
        limits,
        pricing=pricing or kernel.Pricing(),
        prompt_estimate=estimate,
        now=now,
        deadline=LATER,
    )


def test_a_model_call_after_the_deadline_is_not_made_and_says_why() -> None:
    gate = admit(start(), kernel.Limits(), now=LATER)
    assert (gate.phase, gate.message) == (
        Phase.DEADLINE_EXCEEDED,
        "the run's timeout passed before the next model call",
    )


def test_a_tool_batch_after_the_deadline_is_not_started_and_says_why() -> None:
    gate = kernel.admit_tool_batch(start(), kernel.Limits(), calls=1, now=LATER, deadline=LATER)
    assert (gate.phase, gate.message) == (
        Phase.DEADLINE_EXCEEDED,
        "the run's timeout passed before the tool batch",
    )


def test_the_step_cap_names_itself() -> None:
    limits = kernel.Limits(max_steps=1, on_exhausted=kernel.OnExhausted.STOP)
    state = kernel.advance(start(), tool_turn(start(), checked()), limits)
    gate = admit(state, limits)
    assert (gate.phase, gate.message) == (Phase.MAX_STEPS, "maxSteps 1 reached")


def test_the_token_cap_admits_a_call_left_exactly_its_floor_and_names_itself_when_not() -> None:
    limits = kernel.Limits(max_tokens=1000, min_output_tokens=16)
    state = kernel.advance(start(), tool_turn(start(), checked()), limits)  # 110 tokens used
    exact = admit(state, limits, estimate=1000 - 110 - 16)
    assert (exact.phase, exact.max_output_tokens) == (None, 16)
    short = admit(state, limits, estimate=1000 - 110 - 15)
    assert (short.phase, short.message) == (
        Phase.TOKEN_BUDGET_EXHAUSTED,
        "maxTokens 1000: 110 used, the next prompt needs about 875",
    )


def test_every_prompt_token_is_priced_uncached() -> None:
    """A reservation cannot know what the provider's cache will hold: 101 prompt tokens at
    10 USD/1M are 0.00101 USD even where cached input is free."""
    pricing = kernel.Pricing(Decimal("10"), Decimal("0"), Decimal("0"))
    limits = kernel.Limits(max_cost_usd=Decimal("0.001"))
    assert admit(start(), limits, estimate=100, pricing=pricing).phase is None
    assert admit(start(), limits, estimate=101, pricing=pricing).phase is (
        Phase.COST_BUDGET_EXHAUSTED
    )


def test_a_cached_price_dearer_than_the_input_price_prices_the_prompt() -> None:
    """A run admitted before the rule that the cached price is never the dearer carries such
    pricing: the provider may serve the whole prompt from its cache, so the gate prices every
    prompt token at the cached price, 101 at 10 USD/1M being 0.00101 USD."""
    pricing = kernel.Pricing(Decimal("0"), Decimal("10"), Decimal("0"))
    assert pricing.most(input_tokens=101, output_tokens=0) == Decimal("0.00101")
    limits = kernel.Limits(max_cost_usd=Decimal("0.001"))
    assert admit(start(), limits, estimate=100, pricing=pricing).phase is None
    assert admit(start(), limits, estimate=101, pricing=pricing).phase is (
        Phase.COST_BUDGET_EXHAUSTED
    )


def test_output_cheaper_than_a_dollar_per_million_is_still_capped_by_cost() -> None:
    pricing = kernel.Pricing(Decimal("0"), Decimal("0"), Decimal("0.5"))
    limits = kernel.Limits(max_cost_usd=Decimal("0.0005"), max_output_tokens=4096)
    gate = admit(start(), limits, pricing=pricing)
    assert (gate.phase, gate.max_output_tokens) == (None, 1000)


def test_the_output_the_cost_cap_pays_for_is_rounded_down() -> None:
    pricing = kernel.Pricing(Decimal("0"), Decimal("0"), Decimal("1"))
    limits = kernel.Limits(max_cost_usd=Decimal("0.0002999999"), max_output_tokens=4096)
    assert admit(start(), limits, pricing=pricing).max_output_tokens == 299


def test_the_cost_cap_admits_a_call_left_exactly_its_floor() -> None:
    pricing = kernel.Pricing(Decimal("0"), Decimal("0"), Decimal("1"))
    limits = kernel.Limits(max_cost_usd=Decimal("0.000016"), min_output_tokens=16)
    assert admit(start(), limits, pricing=pricing).max_output_tokens == 16
    tighter = kernel.Limits(max_cost_usd=Decimal("0.000015"), min_output_tokens=16)
    gate = admit(start(), tighter, pricing=pricing)
    assert (gate.phase, gate.message) == (
        Phase.COST_BUDGET_EXHAUSTED,
        "maxCostUSD: 0 of 0.000015 spent; the next call could exceed it",
    )


def test_with_free_output_and_a_one_token_floor_an_overpriced_prompt_is_still_refused() -> None:
    pricing = kernel.Pricing(Decimal("10"), Decimal("10"), Decimal("0"))
    limits = kernel.Limits(max_cost_usd=Decimal("0.001"), min_output_tokens=1)
    assert admit(start(), limits, estimate=101, pricing=pricing).phase is (
        Phase.COST_BUDGET_EXHAUSTED
    )
