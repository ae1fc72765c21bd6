"""Tool-call validation: nothing runs with guessed arguments; ids end unique and deterministic."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentrun import kernel
from agentrun.kernel.validate import stored_arguments

from .helpers import TOOLS


def check(
    name: str, arguments: Any, *, id: str | None = "call_1"
) -> kernel.CheckedCall | kernel.InvalidCall:
    (result,) = kernel.check_calls([kernel.ToolCall(id, name, arguments)], turn=0, tools=TOOLS)
    return result


@pytest.mark.parametrize("arguments", ["", "  \n", None, "null", " null "])
def test_empty_arguments_for_a_parameterless_tool_are_an_empty_object(arguments: Any) -> None:
    """C01's kind: every way a server says "no arguments" (vLLM sends ``""``)."""
    result = check("ping", arguments)
    assert isinstance(result, kernel.CheckedCall)
    assert result.arguments == {}
    assert stored_arguments(result) == "{}"


@pytest.mark.parametrize("arguments", ["", "null"])
def test_empty_arguments_for_a_tool_with_required_fields_get_a_correction(arguments: str) -> None:
    result = check("calculate", arguments)
    assert isinstance(result, kernel.InvalidCall)
    assert "'expression' is a required property" in result.error
    assert '"required":["expression"]' in result.error
    assert stored_arguments(result) == "{}"


def test_invalid_json_names_the_parse_error_and_the_schema() -> None:
    result = check("calculate", '{"expression": "1+1"}\\n}')
    assert isinstance(result, kernel.InvalidCall)
    assert "not valid JSON" in result.error
    assert "The tool's schema" in result.error


def test_mangled_tool_name_lists_the_available_tools() -> None:
    result = check("list_pods<|channel|>json", "{}")
    assert isinstance(result, kernel.InvalidCall)
    assert "unknown tool 'list_pods<|channel|>json'" in result.error
    assert "calculate, ping" in result.error


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        pytest.param('{"expression": 5}', "5 is not of type 'string'", id="wrong type"),
        pytest.param('{"expression": "1", "x": 1}', "Additional properties", id="extra property"),
        pytest.param("[1, 2]", "must be a JSON object", id="array"),
        pytest.param('"just text"', "a JSON string, not a JSON object", id="plain JSON string"),
        pytest.param(42, "must be a JSON object, got int", id="not a string at all"),
    ],
)
def test_arguments_that_miss_the_schema_are_rejected(arguments: Any, fragment: str) -> None:
    result = check("calculate", arguments)
    assert isinstance(result, kernel.InvalidCall)
    assert fragment in result.error


def test_double_encoded_arguments_are_decoded() -> None:
    result = check("calculate", json.dumps(json.dumps({"expression": "2*3"})))
    assert isinstance(result, kernel.CheckedCall)
    assert result.arguments == {"expression": "2*3"}


def test_duplicate_ids_are_rekeyed_deterministically() -> None:
    calls = [
        kernel.ToolCall("call_0", "calculate", '{"expression": "1"}'),
        kernel.ToolCall("call_0", "calculate", '{"expression": "2"}'),
        kernel.ToolCall(None, "ping", "{}"),
    ]
    first = kernel.check_calls(calls, turn=3, tools=TOOLS)
    again = kernel.check_calls(calls, turn=3, tools=TOOLS)
    assert [c.id for c in first] == ["call_0", "3:calculate:1", "3:ping:2"]
    assert first == again
    assert [c.arguments for c in first if isinstance(c, kernel.CheckedCall)] == [
        {"expression": "1"},
        {"expression": "2"},
        {},
    ]


def test_ids_already_in_history_are_rekeyed() -> None:
    (result,) = kernel.check_calls(
        [kernel.ToolCall("call_0", "ping", "{}")], turn=2, tools=TOOLS, used_ids={"call_0"}
    )
    assert result.id == "2:ping:0"
