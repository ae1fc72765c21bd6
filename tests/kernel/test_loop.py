"""The loop as a fold: each guard forces its own terminal reason, ends are values."""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from typing import Any

import pytest

from agentrun import kernel
from agentrun.kernel import Phase, transcript

from .helpers import checked, tool_turn

FREE = kernel.Pricing()
NOW, LATER = 1000.0, 2000.0


def start() -> kernel.RunState:
    return kernel.initial_state(goal="do it", instructions="be brief")


def admit(
    state: kernel.RunState,
    limits: kernel.Limits,
    *,
    estimate: int = 50,
    pricing: kernel.Pricing = FREE,
    now: float = NOW,
) -> kernel.Gate:
    return kernel.admit_model_call(
        state, limits, pricing=pricing, prompt_estimate=estimate, now=now, deadline=LATER
    )


def test_a_final_answer_completes_the_run_with_outcome_ok() -> None:
    state = kernel.advance(
        start(),
        kernel.Answered(0, decision=kernel.Final("12"), usage=kernel.Usage(10, 2)),
        kernel.Limits(),
    )
    assert state.phase is Phase.COMPLETED
    assert state.answer == "12"
    terminal = kernel.conclude(state.phase, steps=state.steps)
    assert terminal is not None and terminal.outcome is kernel.Outcome.OK
    assert state.messages[-1] == {"role": "assistant", "content": "12"}


def test_the_step_cap_stops_a_run_that_still_wants_tools_as_partial() -> None:
    limits = kernel.Limits(max_steps=2, on_exhausted=kernel.OnExhausted.STOP)
    state = start()
    for i in range(2):
        assert state.phase is Phase.RUNNING
        state = kernel.advance(state, tool_turn(state, checked(f"c{i}")), limits)
    assert state.phase is Phase.MAX_STEPS
    assert state.steps == 2
    terminal = kernel.conclude(state.phase, steps=state.steps)
    assert terminal is not None and terminal.outcome is kernel.Outcome.PARTIAL
    assert admit(state, limits).phase is Phase.MAX_STEPS


def test_a_tool_batch_that_does_not_fit_the_tool_budget_is_not_started() -> None:
    limits = kernel.Limits(max_tool_calls=3)
    state = kernel.advance(start(), tool_turn(start(), checked("a"), checked("b")), limits)
    assert kernel.admit_tool_batch(state, limits, calls=1, now=NOW, deadline=LATER).phase is None
    gate = kernel.admit_tool_batch(state, limits, calls=2, now=NOW, deadline=LATER)
    assert gate.phase is Phase.TOOL_BUDGET_EXHAUSTED
    assert "maxToolCalls 3" in gate.message


def test_the_token_cap_blocks_a_call_whose_prompt_alone_would_exceed_it() -> None:
    limits = kernel.Limits(max_tokens=1000, max_output_tokens=500)
    state = kernel.advance(start(), tool_turn(start(), checked()), limits)  # 110 tokens used
    gate = admit(state, limits, estimate=200)
    assert gate.phase is None
    assert gate.max_output_tokens == 500  # the model's own limit is the tighter one
    tight = admit(state, limits, estimate=800)
    assert tight.phase is None and tight.max_output_tokens == 90
    assert admit(state, limits, estimate=880).phase is Phase.TOKEN_BUDGET_EXHAUSTED


def test_using_up_the_tokens_ends_the_run_after_the_turn() -> None:
    limits = kernel.Limits(max_tokens=100, on_exhausted=kernel.OnExhausted.STOP)
    state = kernel.advance(start(), tool_turn(start(), checked()), limits)
    assert state.phase is Phase.TOKEN_BUDGET_EXHAUSTED


def test_the_cost_cap_limits_output_and_then_stops() -> None:
    pricing = kernel.Pricing(Decimal("10"), Decimal("1"), Decimal("30"))  # USD per 1M
    limits = kernel.Limits(max_cost_usd=Decimal("0.01"), max_output_tokens=4096)
    gate = admit(start(), limits, estimate=100, pricing=pricing)
    # 0.01 - 100 * 10e-6 = 0.009 USD left → 300 output tokens at 30 USD/1M
    assert gate.phase is None and gate.max_output_tokens == 300
    spent = kernel.advance(
        start(),
        kernel.Answered(
            0,
            decision=kernel.ToolCalls((), None),
            calls=(checked(),),
            results=(kernel.ToolResult("c1", "calculate", "2"),),
            usage=kernel.Usage(
                500,
                100,
                0,
                pricing.cost(input_tokens=500, cached_input_tokens=0, output_tokens=100),
            ),
        ),
        limits,
    )
    assert spent.usage.cost_usd == Decimal("0.008")
    assert spent.phase is Phase.RUNNING
    assert admit(spent, limits, estimate=100, pricing=pricing).max_output_tokens == 33
    assert admit(spent, limits, estimate=170, pricing=pricing).phase is Phase.COST_BUDGET_EXHAUSTED


def test_with_free_output_the_prompt_s_own_cost_can_still_exceed_the_cost_cap() -> None:
    """Output priced at 0 leaves no output price to divide by: the prompt's input cost alone
    decides, and a prompt that costs more than what is left is not sent."""
    pricing = kernel.Pricing(Decimal("10"), Decimal("1"), Decimal("0"))  # USD per 1M
    limits = kernel.Limits(max_cost_usd=Decimal("0.001"), max_output_tokens=4096)
    fits = admit(start(), limits, estimate=100, pricing=pricing)  # 0.001 USD: exactly the cap
    assert fits.phase is None and fits.max_output_tokens == 4096
    over = admit(start(), limits, estimate=101, pricing=pricing)  # 0.00101 USD
    assert over.phase is Phase.COST_BUDGET_EXHAUSTED
    assert over.message == "maxCostUSD: 0 of 0.001 spent; the next call could exceed it"


def test_cached_input_tokens_are_priced_at_the_cached_rate() -> None:
    pricing = kernel.Pricing(Decimal("2"), Decimal("0.5"), Decimal("8"))
    cost = pricing.cost(input_tokens=1_000_000, cached_input_tokens=400_000, output_tokens=100_000)
    assert cost == Decimal("1.2") + Decimal("0.2") + Decimal("0.8")


def test_three_malformed_turns_in_a_row_end_with_invalid_decision() -> None:
    limits = kernel.Limits()
    state = start()
    bad = kernel.Malformed(kernel.MalformedCause.EMPTY_TOOL_CALLS, "no calls")
    for _ in range(2):
        state = kernel.advance(state, kernel.Answered(state.turn, decision=bad), limits)
        assert state.phase is Phase.RUNNING
        assert state.messages[-1]["role"] == "user"  # the corrective turn
    state = kernel.advance(state, kernel.Answered(state.turn, decision=bad), limits)
    assert state.phase is Phase.INVALID_DECISION
    assert state.corrections == 3


def test_a_good_turn_resets_the_malformed_streak() -> None:
    limits = kernel.Limits()
    state = start()
    invalid = kernel.InvalidCall("x", "calculate", "arguments are not valid JSON")
    for _ in range(2):
        state = kernel.advance(state, tool_turn(state, invalid), limits)
    assert state.malformed_streak == 2
    state = kernel.advance(state, tool_turn(state, checked("ok")), limits)
    assert state.malformed_streak == 0
    for _ in range(2):
        state = kernel.advance(state, tool_turn(state, invalid), limits)
    assert state.phase is Phase.RUNNING


def test_a_refusal_ends_the_run_at_once() -> None:
    state = kernel.advance(
        start(), kernel.Answered(0, decision=kernel.Refusal("no")), kernel.Limits()
    )
    assert state.phase is Phase.REFUSED
    assert state.steps == 1


def test_a_model_failure_ends_with_model_error() -> None:
    state = kernel.advance(start(), kernel.ModelFailed(0, "HTTP 500"), kernel.Limits())
    assert state.phase is Phase.MODEL_ERROR
    assert "HTTP 500" in state.message


def test_no_model_call_starts_after_the_deadline() -> None:
    gate = admit(start(), kernel.Limits(), now=LATER)
    assert gate.phase is Phase.DEADLINE_EXCEEDED
    state = kernel.advance(
        start(), kernel.Stopped(0, kernel.Ending(gate.phase, gate.message)), kernel.Limits()
    )
    assert state.phase is Phase.DEADLINE_EXCEEDED
    assert state.steps == 0


def test_stop_ends_a_running_run_and_leaves_an_ended_one_alone() -> None:
    cancelled = kernel.stop(start(), Phase.CANCELLED, "by annotation")
    assert cancelled.phase is Phase.CANCELLED
    assert kernel.stop(cancelled, Phase.DEADLINE_EXCEEDED, "late") is cancelled


def test_every_call_gets_one_result_in_call_order() -> None:
    calls = (checked("b", "2"), kernel.InvalidCall("a", "nope", "unknown tool"), checked("c", "3"))
    state = kernel.advance(start(), tool_turn(start(), *calls), kernel.Limits())
    assistant = state.messages[-4]
    assert [c["id"] for c in assistant["tool_calls"]] == ["b", "a", "c"]
    assert [m["tool_call_id"] for m in state.messages[-3:]] == ["b", "a", "c"]
    assert state.messages[-2]["content"].startswith("ERROR: ")


def test_advance_refuses_turns_out_of_order() -> None:
    with pytest.raises(ValueError, match=r"^turn 1 does not follow turn -1$"):
        kernel.advance(start(), kernel.Answered(1, decision=kernel.Final("x")), kernel.Limits())
    third = dataclasses.replace(start(), turn=3)
    with pytest.raises(ValueError, match=r"^turn 5 does not follow turn 2$"):
        kernel.advance(third, kernel.Answered(5, decision=kernel.Final("x")), kernel.Limits())
    done = kernel.advance(start(), kernel.Answered(0, decision=kernel.Final("x")), kernel.Limits())
    with pytest.raises(ValueError, match="already ended"):
        kernel.advance(done, kernel.Answered(1, decision=kernel.Final("y")), kernel.Limits())


@pytest.mark.parametrize("phase", list(Phase), ids=lambda p: p.value)
def test_every_phase_concludes(phase: Phase) -> None:
    terminal = kernel.conclude(phase, steps=1)
    if phase in (Phase.RUNNING, Phase.AWAITING_APPROVAL):
        assert terminal is None and not phase.is_terminal
        return
    assert phase.is_terminal
    assert terminal is not None
    assert terminal.reason.value == phase.value
    assert (terminal.outcome is kernel.Outcome.OK) == (phase is Phase.COMPLETED)


@pytest.mark.parametrize(
    "phase", [p for p in Phase if p.is_terminal and p is not Phase.COMPLETED], ids=str
)
def test_a_run_that_ended_before_any_model_answer_did_nothing_and_says_so(phase: Phase) -> None:
    """A rejected spec, a budget spent before the first call, a provider refusing to serve:
    none of these may look like partial work to someone filtering on outcome."""
    before = kernel.conclude(phase, steps=0)
    after = kernel.conclude(phase, steps=1)
    assert before is not None and after is not None
    assert (before.outcome, after.outcome) == (kernel.Outcome.NONE, kernel.Outcome.PARTIAL)
    assert (before.reason, before.resource_phase) == (after.reason, after.resource_phase)


def test_a_provider_refusing_the_first_call_ends_with_outcome_none() -> None:
    state = kernel.advance(start(), kernel.ModelFailed(0, "HTTP 401"), kernel.Limits())
    terminal = kernel.conclude(state.phase, steps=state.steps)
    assert terminal is not None and terminal.outcome is kernel.Outcome.NONE


def test_the_terminal_vocabulary_is_the_design_contract() -> None:
    design = [
        "completed",
        "cancelled",
        "deadline_exceeded",
        "max_steps",
        "tool_budget_exhausted",
        "token_budget_exhausted",
        "cost_budget_exhausted",
        "tenant_budget_exhausted",
        "no_progress",
        "invalid_decision",
        "invalid_output",
        "refused",
        "model_error",
        "tool_unavailable",
        "checkpoint_failed",
        "effect_unknown",
        "invalid_spec",
    ]
    assert [r.value for r in kernel.TerminalReason] == design


def test_missing_usage_is_estimated_and_flagged() -> None:
    raw = {
        "choices": [
            {"message": {"role": "assistant", "content": "x" * 30}, "finish_reason": "stop"}
        ],
        "usage": None,
    }
    usage = kernel.read_usage(
        raw, pricing=kernel.Pricing(Decimal(1), Decimal(1), Decimal(1)), prompt_estimate=77
    )
    assert usage.estimated
    assert usage.input_tokens == 77
    assert usage.output_tokens >= 10
    assert usage.cost_usd > 0


def test_reported_usage_is_read_with_cached_tokens() -> None:
    raw = {
        "usage": {
            "prompt_tokens": 120,
            "completion_tokens": 30,
            "prompt_tokens_details": {"cached_tokens": 20},
        }
    }
    usage = kernel.read_usage(raw, pricing=FREE, prompt_estimate=1)
    assert (
        usage.input_tokens,
        usage.output_tokens,
        usage.cached_input_tokens,
        usage.estimated,
    ) == (120, 30, 20, False)


@pytest.mark.parametrize(
    ("limits", "cap"),
    [
        pytest.param(kernel.Limits(max_steps=1), Phase.MAX_STEPS, id="maxSteps"),
        # a token or cost cap ends the run with room for the summary only when the cap is
        # set well above what it used (the summary must fit in what is left)
        pytest.param(
            kernel.Limits(max_steps=1, max_tokens=5000), Phase.MAX_STEPS, id="maxSteps+tokens"
        ),
    ],
)
def test_at_a_cap_one_tool_free_summary_call_writes_the_answer_and_keeps_the_reason(
    limits: kernel.Limits, cap: Phase
) -> None:
    first = kernel.Answered(
        0,
        decision=kernel.ToolCalls((), None),
        calls=(checked(),),
        results=(kernel.ToolResult("c1", "calculate", "2"),),
        usage=kernel.Usage(100, 10, 0, Decimal("0.01")),
    )
    state = kernel.advance(start(), first, limits)
    assert state.phase is Phase.RUNNING and state.pending_cap is cap
    gate = admit(state, limits)
    assert gate.phase is None and gate.summary and gate.max_output_tokens == 1024
    summary = kernel.Summarized(1, kernel.Final("Found 2."), kernel.Usage(120, 5))
    done = kernel.advance(state, summary, limits)
    assert done.phase is cap and done.answer == "Found 2."
    terminal = kernel.conclude(done.phase, steps=done.steps)
    assert terminal is not None and terminal.outcome is kernel.Outcome.PARTIAL
    assert done.messages[-2]["content"].startswith("[agentrun] The run has reached its budget")
    assert done.messages[-1] == {"role": "assistant", "content": "Found 2."}
    assert done.messages[:-2] == state.messages
    assert (done.steps, done.turn, done.pending_cap) == (2, state.turn + 1, None)
    assert done.usage == state.usage + kernel.Usage(120, 5)
    assert done.message == state.message + "; summary written to answer"


@pytest.mark.parametrize(
    ("limits", "cap"),
    [
        pytest.param(kernel.Limits(max_tokens=110), Phase.TOKEN_BUDGET_EXHAUSTED, id="maxTokens"),
        pytest.param(
            kernel.Limits(max_cost_usd=Decimal("0.01")),
            Phase.COST_BUDGET_EXHAUSTED,
            id="maxCostUSD",
        ),
    ],
)
def test_a_summary_that_would_spend_past_the_cap_is_not_made(
    limits: kernel.Limits, cap: Phase
) -> None:
    first = kernel.Answered(
        0,
        decision=kernel.ToolCalls((), None),
        calls=(checked(),),
        results=(kernel.ToolResult("c1", "calculate", "2"),),
        usage=kernel.Usage(100, 10, 0, Decimal("0.01")),
    )
    state = kernel.advance(start(), first, limits)
    assert state.pending_cap is cap
    gate = admit(state, limits, pricing=kernel.Pricing(Decimal(1), Decimal(0), Decimal(1)))
    assert gate.phase is cap and "no budget left for a summary" in gate.message
    done = kernel.advance(state, kernel.Stopped(1, kernel.Ending(cap, gate.message)), limits)
    assert done.phase is cap and done.pending_cap is None and done.answer is None


def test_a_summary_call_that_fails_still_ends_with_the_caps_reason() -> None:
    limits = kernel.Limits(max_steps=1)
    state = kernel.advance(start(), tool_turn(start(), checked()), limits)
    failed = kernel.Summarized(1, None, error="HTTP 500")
    done = kernel.advance(state, failed, limits)
    assert done.phase is Phase.MAX_STEPS and done.answer is None
    assert (done.steps, done.turn) == (state.steps, state.turn + 1)  # no reply: no step
    assert done.messages == (*state.messages, transcript.summary_request(Phase.MAX_STEPS))
    assert done.message == state.message + "; no summary"


def test_a_summary_with_no_cap_pending_is_refused_naming_its_turn() -> None:
    summary = kernel.Summarized(0, kernel.Final("Found 2."), kernel.Usage(1, 1))
    with pytest.raises(ValueError, match=r"^turn 0 is a summary, but no cap is pending$"):
        kernel.advance(start(), summary, kernel.Limits())


def test_the_deadline_beats_the_summary() -> None:
    limits = kernel.Limits(max_steps=1)
    state = kernel.advance(start(), tool_turn(start(), checked()), limits)
    assert admit(state, limits, now=LATER).phase is Phase.DEADLINE_EXCEEDED


def stale_turn(state: kernel.RunState, expression: str, result: str = "same") -> kernel.TurnRecord:
    call = kernel.CheckedCall(f"c{state.turn}", "calculate", {"expression": expression})
    return kernel.Answered(
        state.turn,
        decision=kernel.ToolCalls((), None),
        calls=(call,),
        results=(kernel.ToolResult(call.id, "calculate", result),),
        usage=kernel.Usage(10, 1),
    )


def test_repeating_results_earns_a_nudge_then_no_progress_long_before_max_steps() -> None:
    limits = kernel.Limits(max_steps=50, no_progress_window=3)
    state = start()
    for turn in range(7):
        state = kernel.advance(
            state, stale_turn(state, f"{turn}+0"), limits
        )  # new args, same result
        if turn == 3:
            assert "not making progress" in state.messages[-1]["content"]
    assert state.phase is Phase.NO_PROGRESS
    assert state.steps == 7 and state.usage.input_tokens == 70  # tokens fully counted
    assert state.corrections == 1


def test_new_results_reset_the_no_progress_count() -> None:
    limits = kernel.Limits(no_progress_window=2)
    state = start()
    for turn in range(12):
        result = "same" if turn % 3 else f"new {turn}"
        state = kernel.advance(state, stale_turn(state, "1", result), limits)
    assert state.phase is Phase.RUNNING


def test_pollable_tools_are_exempt_from_the_no_progress_breaker() -> None:
    limits = kernel.Limits(no_progress_window=1, pollable=frozenset({"calculate"}))
    state = start()
    for _ in range(10):
        state = kernel.advance(state, stale_turn(state, "1"), limits)
    assert state.phase is Phase.RUNNING


def test_a_tool_that_keeps_failing_for_infrastructure_reasons_ends_tool_unavailable() -> None:
    limits = kernel.Limits(unavailable_turns=3)
    state = start()
    for turn in range(3):
        assert state.phase is Phase.RUNNING
        record = tool_turn(
            state, checked(f"e{turn}a", f"{turn}+1"), ok=False, fault=kernel.ToolFault.CONNECTION
        )
        state = kernel.advance(state, record, limits)
    assert state.phase is Phase.TOOL_UNAVAILABLE
    assert state.message == (
        "tool calculate failed for infrastructure reasons (timeout, connection, server or "
        "transport error) in 3 turns in a row, after retries"
    )
    assert state.unavailable == {"calculate": 3}


def test_a_bad_batch_of_calls_is_an_observation_not_an_unavailable_tool() -> None:
    """Six invalid calculate calls in the first turn go back to the model as results."""
    state = start()
    calls = [checked(f"bad{i}", f"{i}/0") for i in range(6)]
    state = kernel.advance(
        state, tool_turn(state, *calls, ok=False, fault=kernel.ToolFault.DOMAIN), kernel.Limits()
    )
    assert state.phase is Phase.RUNNING
    assert [m["content"] for m in state.messages if m["role"] == "tool"] == ["ERROR: boom"] * 6
    assert state.tool_failures == 6 and state.unavailable == {}


def test_a_tool_that_answers_again_is_reachable_and_its_count_starts_over() -> None:
    limits = kernel.Limits(unavailable_turns=2)
    state = start()
    down = kernel.ToolFault.TIMEOUT
    state = kernel.advance(state, tool_turn(state, checked("a"), ok=False, fault=down), limits)
    state = kernel.advance(state, tool_turn(state, checked("b", "2+2")), limits)
    state = kernel.advance(state, tool_turn(state, checked("c"), ok=False, fault=down), limits)
    assert state.phase is Phase.RUNNING and state.unavailable == {"calculate": 1}


def test_the_same_failing_call_repeated_is_the_no_progress_breakers_job() -> None:
    limits = kernel.Limits(no_progress_window=2)
    state = start()
    for turn in range(5):  # the first is new; four repeats reach twice the window
        record = tool_turn(
            state, checked(f"z{turn}", "1/0"), ok=False, fault=kernel.ToolFault.DOMAIN
        )
        state = kernel.advance(state, record, limits)
    assert state.phase is Phase.NO_PROGRESS


SCHEMA = {"type": "object", "properties": {"area": {"type": "integer"}}, "required": ["area"]}


def test_a_final_answer_must_meet_the_output_schema_after_one_correction() -> None:
    limits = kernel.Limits(output_schema=SCHEMA)
    state = kernel.advance(start(), kernel.Answered(0, decision=kernel.Final("twelve")), limits)
    assert state.phase is Phase.RUNNING
    assert "does not meet the required output schema" in state.messages[-1]["content"]
    assert state.answer is None
    state = kernel.advance(
        state, kernel.Answered(1, decision=kernel.Final('{"area": "12"}')), limits
    )
    assert state.phase is Phase.INVALID_OUTPUT
    assert "area: '12' is not of type 'integer'" in state.message


def test_a_valid_json_answer_in_a_code_fence_completes() -> None:
    limits = kernel.Limits(output_schema=SCHEMA)
    state = kernel.advance(
        start(), kernel.Answered(0, decision=kernel.Final('```json\n{"area": 12}\n```')), limits
    )
    assert state.phase is Phase.COMPLETED


def test_old_large_observations_are_elided_to_fit_the_context_window() -> None:
    limits = kernel.Limits(context_window=3000, max_output_tokens=500)
    state = start()
    for turn in range(6):
        state = kernel.advance(
            state, stale_turn(state, str(turn), result=f"{turn}" + "x" * 3000), limits
        )
    fitted = kernel.fit_context(state.messages, limits=limits)
    prompt = fitted.messages
    assert kernel.estimate_tokens(prompt) <= fitted.tokens + 50
    assert fitted.tokens <= 2500 < kernel.estimate_tokens(state.messages)
    assert prompt[:2] == state.messages[:2]  # system prompt and goal untouched
    assert len(prompt) == len(state.messages)  # nothing removed: every call keeps its result
    elided = [
        m
        for m in prompt
        if m["role"] == "tool" and m["content"].startswith("[agentrun: an earlier")
    ]
    assert elided and prompt[2]["role"] == "assistant"
    assert prompt[-1] == state.messages[-1]  # the newest observation is kept whole


PER_MILLION = kernel.Pricing(Decimal(1), Decimal(1), Decimal(2))
"""$1 per million input tokens, $2 per million output tokens."""


@pytest.mark.parametrize(
    ("usage", "output", "reasoning"),
    [
        pytest.param(
            {"prompt_tokens": 9, "completion_tokens": 664, "total_tokens": 1994},
            1985,
            1321,
            id="reasoning-only-in-the-total",
        ),
        pytest.param(
            {
                "prompt_tokens": 9,
                "completion_tokens": 664,
                "total_tokens": 1994,
                "completion_tokens_details": {"reasoning_tokens": 1321},
            },
            1985,
            1321,
            id="reasoning-left-out-of-completion",
        ),
        pytest.param(
            {
                "prompt_tokens": 9,
                "completion_tokens": 664,
                "completion_tokens_details": {"reasoning_tokens": 1321},
            },
            1985,
            1321,
            id="reasoning-left-out-no-total",
        ),
        pytest.param(
            {
                "prompt_tokens": 9,
                "completion_tokens": 1985,
                "total_tokens": 1994,
                "completion_tokens_details": {"reasoning_tokens": 1321},
            },
            1985,
            1321,
            id="openai-reasoning-inside-completion",
        ),
        pytest.param(
            {"prompt_tokens": 9, "completion_tokens": 664, "total_tokens": 600},
            664,
            0,
            id="a-total-saying-less-is-ignored",
        ),
        pytest.param(
            {"prompt_tokens": 9, "completion_tokens": 664, "total_tokens": "many"},
            664,
            0,
            id="an-unreadable-total-is-ignored",
        ),
    ],
)
def test_reasoning_tokens_are_counted_and_priced_as_output(
    usage: dict[str, Any], output: int, reasoning: int
) -> None:
    read = kernel.read_usage({"usage": usage}, pricing=PER_MILLION, prompt_estimate=1)
    assert (read.output_tokens, read.reasoning_tokens) == (output, reasoning)
    assert read.cost_usd == (Decimal(9) + Decimal(output) * 2) / 1_000_000
    assert read.total_tokens == 9 + output


def test_a_cost_cap_stops_a_run_whose_reasoning_shows_only_in_the_total() -> None:
    """The reported case: 664 completion tokens per call, 1994 in total; a run under a cost
    cap it would exceed threefold by the completion count alone ends at the cap."""
    answer = {
        "choices": [
            {
                "message": {"role": "assistant", "content": None, "tool_calls": []},
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 664, "total_tokens": 1994},
    }
    cap = Decimal("0.01")  # by completion tokens alone a call costs $0.001337: 8 calls
    limits = kernel.Limits(
        max_cost_usd=cap, on_exhausted=kernel.OnExhausted.STOP, malformed_limit=100
    )
    state = kernel.initial_state(goal="think hard")
    calls = 0
    while not state.phase.is_terminal:
        usage = kernel.read_usage(answer, pricing=PER_MILLION, prompt_estimate=9)
        record = kernel.Answered(state.turn, kernel.classify(answer), usage)
        state = kernel.advance(state, record, limits)
        calls += 1
    assert state.phase is kernel.Phase.COST_BUDGET_EXHAUSTED
    assert calls == 3 and state.usage.reasoning_tokens == 3 * 1321  # $0.003979 a call
    assert state.usage.cost_usd == 3 * (Decimal(9) + Decimal(1985) * 2) / 1_000_000
