"""The scripted model answers like an OpenAI endpoint, as seen through the real openai client."""

from __future__ import annotations

import json
import time

import openai
import pytest
from mockllm_support import conversation

from agentrun.testing import mockllm

MODEL = "gpt-test"


async def test_turn_zero_returns_parallel_tool_calls_with_default_and_explicit_ids(
    client: openai.AsyncOpenAI,
) -> None:
    completion = await client.chat.completions.create(
        model=MODEL, messages=conversation("Compute the rectangle 3x4")
    )
    assert completion.object == "chat.completion"
    assert completion.model == MODEL
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me compute both."
    calls = choice.message.tool_calls or []
    assert [(c.id, c.type, c.function.name) for c in calls] == [  # type: ignore[union-attr]
        ("call_0_0", "function", "calculate"),
        ("call_custom", "function", "calculate"),
    ]
    assert json.loads(calls[1].function.arguments) == {"expression": "2*(3+4)"}  # type: ignore[union-attr]


async def test_usage_reports_scripted_counts_including_cached_tokens(
    client: openai.AsyncOpenAI,
) -> None:
    completion = await client.chat.completions.create(
        model=MODEL, messages=conversation("rectangle")
    )
    usage = completion.usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (120, 30, 150)
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 20


async def test_the_turn_is_the_number_of_assistant_messages(client: openai.AsyncOpenAI) -> None:
    completion = await client.chat.completions.create(
        model=MODEL, messages=conversation("rectangle", turns=1)
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.content == "Area 12, perimeter 14."
    assert choice.message.tool_calls is None
    assert completion.usage is not None and completion.usage.prompt_tokens == 200


async def test_duplicate_explicit_ids_are_sent_as_written(client: openai.AsyncOpenAI) -> None:
    completion = await client.chat.completions.create(
        model=MODEL, messages=conversation("duplicate ids please")
    )
    calls = completion.choices[0].message.tool_calls or []
    assert [c.id for c in calls] == ["call_same", "call_same"]


async def test_usage_null_gives_no_usage(client: openai.AsyncOpenAI) -> None:
    completion = await client.chat.completions.create(
        model=MODEL, messages=conversation("no usage")
    )
    assert completion.usage is None
    assert completion.choices[0].message.content == "done"


async def test_omitted_usage_is_estimated_from_text(client: openai.AsyncOpenAI) -> None:
    short = await client.chat.completions.create(
        model=MODEL, messages=conversation("estimate usage")
    )
    longer = await client.chat.completions.create(
        model=MODEL, messages=conversation("estimate usage " + "x" * 400)
    )
    assert short.usage is not None and longer.usage is not None
    assert short.usage.completion_tokens == 6  # 22 characters / 4, rounded up
    assert short.usage.total_tokens == short.usage.prompt_tokens + short.usage.completion_tokens
    assert longer.usage.prompt_tokens == short.usage.prompt_tokens + 100


async def test_turn_template_varies_arguments_every_turn(client: openai.AsyncOpenAI) -> None:
    expressions = []
    for k in (0, 1, 5):
        completion = await client.chat.completions.create(
            model=MODEL, messages=conversation("endless loop", turns=k)
        )
        (call,) = completion.choices[0].message.tool_calls or []
        assert call.id == f"call_{k}_0"
        expressions.append(json.loads(call.function.arguments)["expression"])  # type: ignore[union-attr]
    assert expressions == ["0*3+1", "1*3+1", "5*3+1"]


async def test_a_decision_asked_again_gets_new_ids_and_its_argument_variants(
    client: openai.AsyncOpenAI,
) -> None:
    seen = []
    for _ in range(3):
        completion = await client.chat.completions.create(
            model=MODEL, messages=conversation("ask again")
        )
        (call,) = completion.choices[0].message.tool_calls or []
        seen.append((call.id, call.function.arguments))  # type: ignore[union-attr]
    assert len({i for i, _ in seen}) == 3  # a new id per request
    assert {a for _, a in seen} == {'{"a":1,"b":2}', '{"b":2,"a":1}'}
    assert all(json.loads(a) == {"a": 1, "b": 2} for _, a in seen)


async def test_refusal_is_set_with_null_content(client: openai.AsyncOpenAI) -> None:
    completion = await client.chat.completions.create(model=MODEL, messages=conversation("refuse"))
    message = completion.choices[0].message
    assert (message.refusal, message.content, message.tool_calls) == (
        "I can't help with that.",
        None,
        None,
    )
    assert completion.choices[0].finish_reason == "stop"


async def test_explicitly_empty_tool_calls_still_say_tool_calls(
    client: openai.AsyncOpenAI,
) -> None:
    completion = await client.chat.completions.create(
        model=MODEL, messages=conversation("empty calls")
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls == []
    assert choice.message.content is None


async def test_string_arguments_and_odd_names_are_sent_verbatim(
    client: openai.AsyncOpenAI,
) -> None:
    completion = await client.chat.completions.create(
        model=MODEL, messages=conversation("malformed")
    )
    calls = completion.choices[0].message.tool_calls or []
    assert [(c.function.name, c.function.arguments) for c in calls] == [  # type: ignore[union-attr]
        ("calculate", '{"expression": "1+1"\\n}'),
        ("list_pods<|channel|>json", ""),
    ]


async def test_system_regex_and_finish_reason_override(client: openai.AsyncOpenAI) -> None:
    completion = await client.chat.completions.create(
        model=MODEL, messages=conversation("system test", system="You are terse.")
    )
    assert completion.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(
            model=MODEL, messages=conversation("system test", system="Be verbose.")
        )


async def test_latency_delays_the_answer(client: openai.AsyncOpenAI) -> None:
    started = time.monotonic()
    completion = await client.chat.completions.create(model=MODEL, messages=conversation("slow"))
    assert time.monotonic() - started >= 0.25
    assert completion.choices[0].message.content == "finally"


async def test_models_and_health(client: openai.AsyncOpenAI, mock: mockllm.MockLLM) -> None:
    await client.chat.completions.create(model=MODEL, messages=conversation("rectangle"))
    models = [m.id async for m in client.models.list()]
    assert models == ["mock", MODEL]
    health = await client.get(mock.base_url.removesuffix("/v1") + "/healthz", cast_to=object)
    assert health == {"status": "ok"}


async def test_a_scenario_can_match_on_the_last_message() -> None:
    from agentrun.testing import mockllm as server
    from agentrun.testing import scenario as sc

    scenarios = sc.parse_scenarios(
        """
scenarios:
  - name: summary
    match: {last: "reached its budget"}
    turns: [{content: "summary"}]
    after: repeat_last
  - name: work
    turns: [{content: "working"}]
    after: repeat_last
"""
    )
    async with server.MockLLM(scenarios) as mock:
        client = openai.AsyncOpenAI(base_url=mock.base_url, api_key="test", max_retries=0)
        plain = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "go"}]
        )
        asked = await client.chat.completions.create(
            model="m",
            messages=[
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": "working"},
                {"role": "user", "content": "The run has reached its budget. Summarize."},
            ],
        )
        await client.close()
    assert plain.choices[0].message.content == "working"
    assert asked.choices[0].message.content == "summary"


@pytest.mark.parametrize(
    ("tail", "problem"),
    [
        pytest.param(
            [{"role": "user", "content": "summarize"}],
            "unexpected role 'user' after role 'tool'",
            id="user-after-tool",
        ),
        pytest.param(
            [
                {"role": "assistant", "content": "bridge"},
                {"role": "user", "content": "a"},
                {"role": "user", "content": "b"},
            ],
            "unexpected role 'user' after role 'user'",
            id="two-users",
        ),
    ],
)
async def test_a_request_breaking_the_strictest_ordering_rules_is_a_400_naming_it(
    client: openai.AsyncOpenAI, tail: list[dict[str, str]], problem: str
) -> None:
    with pytest.raises(openai.BadRequestError, match=problem):
        await client.chat.completions.create(
            model=MODEL,
            messages=[*conversation("rectangle", turns=1), *tail],  # type: ignore[list-item]
        )


async def test_a_call_id_mistral_would_reject_is_a_400(client: openai.AsyncOpenAI) -> None:
    messages = conversation("rectangle", turns=1)
    messages[2]["tool_calls"][0]["id"] = messages[3]["tool_call_id"] = "call_0_0"
    with pytest.raises(openai.BadRequestError, match="must be 9 of a-z, A-Z, 0-9"):
        await client.chat.completions.create(model=MODEL, messages=messages)


async def test_with_the_call_id_check_off_an_echoed_id_of_any_form_passes(
    lenient_client: openai.AsyncOpenAI,
) -> None:
    messages = conversation("rectangle", turns=1)
    messages[2]["tool_calls"][0]["id"] = messages[3]["tool_call_id"] = "call_0_0"
    completion = await lenient_client.chat.completions.create(model=MODEL, messages=messages)
    assert completion.choices[0].message.content == "Area 12, perimeter 14."


@pytest.mark.parametrize(
    ("breakage", "problem"),
    [
        pytest.param("twice", "is used twice", id="duplicate-id"),
        pytest.param("unanswered", "result for 'other', expected call_0_0", id="wrong-answer"),
        pytest.param("empty", "must be a non-empty string", id="empty-id"),
    ],
)
async def test_with_the_call_id_check_off_every_other_rule_still_holds(
    lenient_client: openai.AsyncOpenAI, breakage: str, problem: str
) -> None:
    messages = conversation("rectangle", turns=2)
    messages[2]["tool_calls"][0]["id"] = messages[3]["tool_call_id"] = "call_0_0"
    if breakage == "twice":
        messages[4]["tool_calls"][0]["id"] = messages[5]["tool_call_id"] = "call_0_0"
    elif breakage == "unanswered":
        messages[3]["tool_call_id"] = "other"
    else:
        messages[4]["tool_calls"][0]["id"] = messages[5]["tool_call_id"] = ""
    with pytest.raises(openai.BadRequestError, match=problem):
        await lenient_client.chat.completions.create(model=MODEL, messages=messages)
