"""``used ≤ limit`` for a run whatever its provider does: a call that went past the run's token
or cost cap (a provider that ignored ``max_tokens``, or counted prompt tokens the request did
not show) ends the run with that cap's reason, outcome ``partial``, the answer kept, no tool
of the reply run and no summary call; the gates size a prompt by an upper bound (plus what
the provider was seen to add); and the summary call at a cap keeps the run's tools with
``tool_choice: none`` when the history holds tool calls."""

from __future__ import annotations

import dataclasses
from decimal import Decimal

import pytest

from agentrun import kernel
from agentrun.kernel import Phase
from agentrun.kernel.gates import overrun

from .helpers import TOOLS, call, checked, response, tool_turn

NOW = kernel.Timing(now=1_000.0, deadline=2_000.0)
PRICES = kernel.Pricing(Decimal(1), Decimal(0), Decimal(2))  # USD per million tokens
TOOL_LIST = [{"type": "function", "function": {"name": "calculate", "parameters": {}}}]


def plan(
    state: kernel.RunState, limits: kernel.Limits, *, tools: list | None = None, hidden: int = 0
) -> kernel.TurnPlan:
    offer = kernel.Offer(tools or [], (), hidden)
    return kernel.plan_turn(state, limits, pricing=PRICES, offer=offer, clock=NOW)


def answer(
    state: kernel.RunState, limits: kernel.Limits, reply: dict, usage: kernel.Usage
) -> kernel.RunState:
    """The state after the model answered ``reply`` using ``usage`` (tools run ok)."""
    step = plan(state, limits)
    assert isinstance(step, kernel.CallModel)
    planned = kernel.plan_answer(
        state, limits, step, (kernel.classify(reply), usage), tools=TOOLS, clock=NOW
    )
    if isinstance(planned, kernel.RunTools):
        results = tuple(kernel.ToolResult(c.id, c.name, "42") for c in planned.runnable)
        planned = planned.finish(results)
    return kernel.advance(state, planned, limits)


def start() -> kernel.RunState:
    return kernel.initial_state(goal="do it", instructions="be brief")


def test_a_provider_that_ignores_max_tokens_ends_the_run_capped_with_the_answer_kept() -> None:
    """B01: ``maxTokens: 2000``; the provider returns 20,000 completion tokens anyway."""
    limits = kernel.Limits(max_tokens=2000)
    after = answer(start(), limits, response("the answer"), kernel.Usage(100, 20_000))
    assert after.phase is Phase.TOKEN_BUDGET_EXHAUSTED
    assert after.pending_cap is None  # no summary: it would only spend more
    assert after.answer == "the answer"
    assert "overrun by 18100 tokens" in after.message
    terminal = kernel.conclude(after.phase, steps=after.steps)
    assert terminal is not None and terminal.outcome is kernel.Outcome.PARTIAL


def test_reaching_a_cap_exactly_is_no_overrun() -> None:
    limits = kernel.Limits(max_tokens=2000)
    after = answer(start(), limits, response("the answer"), kernel.Usage(100, 1900))
    assert after.phase is Phase.COMPLETED and after.answer == "the answer"
    exactly = kernel.Usage(100, 1900, 0, Decimal("0.01"))
    assert overrun(start(), kernel.Limits(max_tokens=2000), exactly) is None
    assert overrun(start(), kernel.Limits(max_cost_usd=Decimal("0.01")), exactly) is None
    assert overrun(start(), kernel.Limits(max_cost_usd=Decimal("0.0099")), exactly) is not None


def test_a_cost_overrun_ends_the_run_with_the_cost_reason() -> None:
    limits = kernel.Limits(max_cost_usd=Decimal("0.01"))
    usage = kernel.Usage(
        100, 20_000, 0, PRICES.cost(input_tokens=100, cached_input_tokens=0, output_tokens=20_000)
    )
    after = answer(start(), limits, response("done"), usage)
    assert after.phase is Phase.COST_BUDGET_EXHAUSTED
    assert "overrun by" in after.message and after.answer == "done"


def test_an_overrunning_reply_runs_none_of_its_tool_calls() -> None:
    limits = kernel.Limits(max_tokens=2000)
    reply = response(None, tool_calls=[call("calculate", {"expression": "1+1"})])
    step = plan(start(), limits)
    assert isinstance(step, kernel.CallModel)
    planned = kernel.plan_answer(
        start(),
        limits,
        step,
        (kernel.classify(reply), kernel.Usage(100, 5000)),
        tools=TOOLS,
        clock=NOW,
    )
    assert isinstance(planned, kernel.Answered) and planned.stopped is not None
    assert planned.stopped.phase is Phase.TOKEN_BUDGET_EXHAUSTED
    assert all(r.content.startswith("not run: maxTokens 2000 overrun") for r in planned.results)
    after = kernel.advance(start(), planned, limits)
    assert after.phase is Phase.TOKEN_BUDGET_EXHAUSTED and after.tool_calls == 0


def test_an_ordinary_cap_still_asks_for_a_summary() -> None:
    limits = kernel.Limits(max_tokens=2000)
    state = kernel.advance(start(), tool_turn(start(), checked()), limits)
    state = kernel.advance(
        state,
        kernel.Answered(state.turn, kernel.ToolCalls((), None), kernel.Usage(1790, 100)),
        limits,
    )
    assert state.pending_cap is Phase.TOKEN_BUDGET_EXHAUSTED  # 2000 of 2000: reached, not past


@pytest.mark.parametrize(
    "text",
    ["日本語のテキスト" * 200, "👩‍💻🏳️‍🌈" * 150, "a\u0301\u0302\u0303" * 300, "x = f(y)\n" * 100],
    ids=["cjk", "emoji", "combining", "code"],
)
def test_the_gates_size_a_prompt_by_its_upper_bound_not_four_characters(text: str) -> None:
    """Finding 2: a CJK goal estimated at characters / 4 let a 3,000-token run spend 6,595."""
    state = kernel.initial_state(goal=text)
    step = plan(state, kernel.Limits())
    assert isinstance(step, kernel.CallModel)
    assert step.prompt_estimate >= len(text.encode("utf-8"))
    assert step.prompt_estimate >= kernel.estimate_tokens(step.prompt)


def test_a_prompt_over_the_tokens_left_is_refused_before_the_call() -> None:
    text = "長" * 1200  # 3,600 bytes: over a 3,000-token cap, though only 300 at chars / 4
    step = plan(kernel.initial_state(goal=text), kernel.Limits(max_tokens=3000))
    assert isinstance(step, kernel.EndRun)
    assert step.record.ending.phase is Phase.TOKEN_BUDGET_EXHAUSTED


def test_hidden_prompt_tokens_seen_before_are_added_to_the_bound() -> None:
    plain = plan(start(), kernel.Limits())
    seen = plan(start(), kernel.Limits(), hidden=4500)
    assert isinstance(plain, kernel.CallModel) and isinstance(seen, kernel.CallModel)
    assert seen.prompt_estimate == plain.prompt_estimate + 4500
    capped = plan(start(), kernel.Limits(max_tokens=4000), hidden=4500)
    assert isinstance(capped, kernel.EndRun)


def summary_call(state: kernel.RunState, limits: kernel.Limits) -> kernel.CallModel:
    step = plan(state, limits, tools=TOOL_LIST)
    assert isinstance(step, kernel.CallModel) and step.summary
    return step


def test_the_summary_keeps_the_tools_with_tool_choice_none_after_tool_calls() -> None:
    """Finding 4: providers that require ``tools`` whenever the history holds tool calls
    answer 400 to a summary request without them."""
    limits = kernel.Limits(max_steps=1)
    state = kernel.advance(start(), tool_turn(start(), checked()), limits)
    assert state.pending_cap is Phase.MAX_STEPS
    step = summary_call(state, limits)
    assert step.tool_choice == "none" and step.sends_tools


def test_a_summary_of_a_history_without_tool_calls_sends_no_tools() -> None:
    limits = kernel.Limits(max_steps=1)
    malformed = kernel.Answered(0, kernel.Malformed(kernel.MalformedCause.EMPTY, "empty"))
    state = kernel.advance(start(), malformed, limits)
    step = summary_call(state, limits)
    assert step.tool_choice is None and not step.sends_tools


def test_every_ordinary_call_sends_its_tools_without_a_tool_choice() -> None:
    step = plan(start(), kernel.Limits(), tools=TOOL_LIST)
    assert isinstance(step, kernel.CallModel)
    assert step.sends_tools and step.tool_choice is None


@pytest.mark.parametrize(
    ("estimated", "shown"), [(False, "20600 in all"), (True, "20600 in all, estimated")]
)
def test_an_overrun_names_the_cap_the_excess_the_call_and_the_run_s_total(
    estimated: bool, shown: str
) -> None:
    """The message counts the run's earlier spend in, and says when the provider's counts
    were estimates (it sent no usage)."""
    before = dataclasses.replace(start(), usage=kernel.Usage(500, 0))
    ended = overrun(
        before, kernel.Limits(max_tokens=2000), kernel.Usage(100, 20_000, estimated=estimated)
    )
    assert ended == kernel.Ending(
        Phase.TOKEN_BUDGET_EXHAUSTED,
        "maxTokens 2000 overrun by 18600 tokens: one call used 100 input and 20000 output "
        f"tokens ({shown})",
    )
    costly = kernel.Usage(100, 20_000, 0, Decimal("0.0401"), estimated=estimated)
    assert overrun(before, kernel.Limits(max_cost_usd=Decimal("0.01")), costly) == kernel.Ending(
        Phase.COST_BUDGET_EXHAUSTED,
        "maxCostUSD 0.01 overrun by 0.0301 USD: one call used 100 input and 20000 output "
        "tokens (0.0401 USD in all)",
    )


@pytest.mark.parametrize("keep", ["tool_calls", "tool results"])
def test_the_summary_sends_tool_choice_none_when_either_kind_of_tool_message_is_left(
    keep: str,
) -> None:
    """After context fitting a history may keep only one side of a tool exchange; either side
    is a tool call to the providers that reject a request without ``tools``."""
    limits = kernel.Limits(max_steps=1)
    state = kernel.advance(start(), tool_turn(start(), checked()), limits)
    if keep == "tool_calls":
        messages = tuple(m for m in state.messages if m.get("role") != "tool")
    else:
        messages = tuple(
            {k: v for k, v in m.items() if k != "tool_calls"} | {"content": "calling"}
            if m.get("tool_calls")
            else m
            for m in state.messages
        )
    step = summary_call(dataclasses.replace(state, messages=messages), limits)
    assert step.tool_choice == "none" and step.sends_tools
    kinds = {"tool_calls": any(m.get("tool_calls") for m in step.prompt),
             "tool results": any(m.get("role") == "tool" for m in step.prompt)}  # fmt: skip
    assert kinds == {"tool_calls": keep == "tool_calls", "tool results": keep == "tool results"}
