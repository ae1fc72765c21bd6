"""Loading scenarios: the YAML format's checks, runtime replacement, and the process form."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aiohttp
import openai
import pytest
from mockllm_support import conversation

from agentrun.testing import mockllm, scenario

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "scenarios.yaml"

MALFORMED_DOCUMENTS = {
    "not-yaml": ("scenarios: [", "not valid YAML"),
    "no-scenarios-key": ("turns: []", "'scenarios' is a required property"),
    "no-turns": ("scenarios: [{name: a, turns: []}]", "at scenarios/0/turns"),
    "unknown-turn-key": (
        "scenarios: [{name: a, turns: [{contnet: hi}]}]",
        "scenarios/0/turns/0",
    ),
    "bad-after": ("scenarios: [{name: a, turns: [{}], after: loop}]", "scenarios/0/after"),
    "bad-regex": ("scenarios: [{name: a, match: {goal: '('}, turns: [{}]}]", "bad match regex"),
    "fault-status-200": (
        "scenarios: [{name: a, turns: [{fault: {status: 200}}]}]",
        "scenarios/0/turns/0/fault/status",
    ),
    "duplicate-names": (
        "scenarios: [{name: a, turns: [{}]}, {name: a, turns: [{}]}]",
        "duplicate scenario name 'a'",
    ),
}


@pytest.mark.parametrize(
    ("text", "expected"), MALFORMED_DOCUMENTS.values(), ids=MALFORMED_DOCUMENTS.keys()
)
def test_malformed_scenario_documents_are_refused_with_the_place(text: str, expected: str) -> None:
    with pytest.raises(scenario.ScenarioError) as caught:
        scenario.parse_scenarios(text, source="doc.yaml")
    assert str(caught.value).startswith("doc.yaml: ")
    assert expected in str(caught.value)


def test_the_first_matching_scenario_wins() -> None:
    parsed = scenario.parse_scenarios(
        """
        scenarios:
          - {name: specific, match: {goal: "^area of"}, turns: [{content: a}]}
          - {name: catch-all, turns: [{content: b}]}
        """
    )
    find = scenario.find_scenario
    assert find(parsed, scenario.read_conversation(conversation("area of x"))).name == "specific"  # type: ignore[union-attr]
    assert find(parsed, scenario.read_conversation(conversation("the area"))).name == "catch-all"  # type: ignore[union-attr]


def test_example_scenarios_load() -> None:
    names = [s.name for s in mockllm.load_scenario_files([EXAMPLES])]
    assert names == ["budget-summary", "install-check", "rectangle", "collatz", "inventory"]


async def test_scenarios_can_be_replaced_and_appended_at_runtime(mock: mockllm.MockLLM) -> None:
    root = mock.base_url.removesuffix("/v1")
    async with aiohttp.ClientSession() as http:
        body = "scenarios: [{name: fresh, match: {goal: fresh}, turns: [{content: new}]}]"
        async with http.post(f"{root}/_mock/scenarios", data=body) as response:
            assert response.status == 200
            assert await response.json() == {"scenarios": ["fresh"]}
        more = "scenarios: [{name: extra, turns: [{content: anything}]}]"
        async with http.post(f"{root}/_mock/scenarios?mode=append", data=more) as response:
            assert (await response.json())["scenarios"] == ["fresh", "extra"]
        async with http.post(f"{root}/_mock/scenarios", data="scenarios: [") as response:
            assert response.status == 400
            assert "not valid YAML" in (await response.json())["error"]["message"]
    async with openai.AsyncOpenAI(base_url=mock.base_url, api_key="t", max_retries=0) as client:
        completion = await client.chat.completions.create(
            model="m", messages=conversation("rectangle")
        )
    assert completion.choices[0].message.content == "anything"


async def test_runs_as_a_module_and_prints_its_url_first() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentrun.testing.mockllm",
        "--port", "0", "--scenarios", str(EXAMPLES),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=REPO,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 20)).decode().strip()
        assert line.startswith("listening on http://127.0.0.1:")
        base_url = line.removeprefix("listening on ")
        assert base_url.endswith("/v1")
        async with openai.AsyncOpenAI(base_url=base_url, api_key="t", max_retries=0) as client:
            messages = conversation("What are the area and perimeter of a 3x4 rectangle?")
            first = await client.chat.completions.create(model="demo", messages=messages)
            calls = first.choices[0].message.tool_calls or []
            assert [c.function.arguments for c in calls] == [  # type: ignore[union-attr]
                '{"expression":"3*4"}',
                '{"expression":"2*(3+4)"}',
            ]
            final = await client.chat.completions.create(
                model="demo",
                messages=[
                    *messages,
                    {"role": "assistant", "content": "..."},
                    {"role": "user", "content": "go on"},
                ],
            )
            assert final.choices[0].message.content == (
                "The rectangle's area is 12 and its perimeter is 14."
            )
    finally:
        process.terminate()
        assert await asyncio.wait_for(process.wait(), 10) == 0


async def test_a_bad_scenario_file_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("scenarios: [{name: a}]")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentrun.testing.mockllm", "--scenarios", str(bad),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, stderr = await asyncio.wait_for(process.communicate(), 20)
    assert process.returncode == 2
    assert b"'turns' is a required property" in stderr


def test_the_call_id_form_check_is_on_unless_switched_off_on_the_command_line() -> None:
    assert mockllm.parse_args([]).strict_call_ids is True
    assert mockllm.parse_args(["--no-strict-call-ids"]).strict_call_ids is False
