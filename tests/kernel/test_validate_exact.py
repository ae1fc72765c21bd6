"""``check_calls`` exactly: the text an invalid call's error begins with (what the model reads
next turn), arguments kept as parsed (lists and nested values cleaned, never dropped), and ids
re-keyed to stay unique against the batch and the run's history."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun import kernel
from agentrun.kernel.validate import stored_arguments

SHAPED = kernel.ToolSchema(
    "shaped",
    {
        "type": "object",
        "properties": {
            "a": {"type": "object", "properties": {"b": {"type": "integer"}}},
            "c": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["d"],
    },
)
TOOLS = {"shaped": SHAPED, "ping": kernel.ToolSchema("ping", {"type": "object"})}


def error_of(arguments: Any) -> str:
    (result,) = kernel.check_calls(
        [kernel.ToolCall("c1", "shaped", arguments)], turn=0, tools=TOOLS
    )
    assert isinstance(result, kernel.InvalidCall)
    message, _, hint = result.error.partition(". The tool's schema: ")
    assert hint.startswith('{"properties":')
    return message


def test_schema_errors_are_listed_by_path_root_first() -> None:
    assert error_of('{"c": 1, "a": {"b": "x"}}') == (
        "arguments do not match the schema: (root): 'd' is a required property; "
        "a/b: 'x' is not of type 'integer'; c: 1 is not of type 'string'"
    )


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ('"not json"', "arguments are a JSON string, not a JSON object"),
        ("[1, 2]", "arguments must be a JSON object, got list"),
        ('"[1, 2]"', "arguments must be a JSON object, got list"),
    ],
    ids=["a-string", "a-list", "a-string-holding-a-list"],
)
def test_arguments_that_are_no_object_say_what_they_are(arguments: str, message: str) -> None:
    assert error_of(arguments) == message


def test_arguments_are_kept_as_parsed_lists_included() -> None:
    arguments = '{"d": 1, "tags": ["x", "y\\ud83d"], "a": {"b": 2}}'
    (result,) = kernel.check_calls(
        [kernel.ToolCall("c1", "shaped", arguments)], turn=0, tools=TOOLS
    )
    assert isinstance(result, kernel.CheckedCall)
    assert result.arguments == {"d": 1, "tags": ["x", "y\ufffd\ufffd\ufffd"], "a": {"b": 2}}


def test_a_minted_id_taken_in_the_batch_or_the_history_is_made_unique() -> None:
    calls = [kernel.ToolCall("0:ping:1", "ping", "{}"), kernel.ToolCall(None, "ping", "{}")]
    checked = kernel.check_calls(calls, turn=0, tools=TOOLS)
    assert [c.id for c in checked] == ["0:ping:1", "0:ping:1_"]
    again = kernel.check_calls(
        [kernel.ToolCall("", "ping", "{}")], turn=0, tools=TOOLS, used_ids={"0:ping:0"}
    )
    assert [c.id for c in again] == ["0:ping:0_"]


def test_an_unknown_tool_names_the_available_ones_or_none() -> None:
    (result,) = kernel.check_calls([kernel.ToolCall("c1", "nope", "{}")], turn=0, tools={})
    assert result == kernel.InvalidCall(
        "c1", "nope", "unknown tool 'nope'; available tools: (none)"
    )


def test_a_dropped_call_is_invalid_under_its_id_and_name_and_the_next_call_is_checked() -> None:
    calls = [
        kernel.ToolCall("c1", "ping", None, dropped=70_000),
        kernel.ToolCall("c2", "ping", "{}"),
    ]
    dropped, after = kernel.check_calls(calls, turn=0, tools=TOOLS)
    assert isinstance(dropped, kernel.InvalidCall)
    assert (dropped.id, dropped.name) == ("c1", "ping")
    assert dropped.error.startswith("the arguments were 70000 bytes")
    assert after == kernel.CheckedCall("c2", "ping", {})


def test_stored_arguments_are_compact_json_with_text_as_written() -> None:
    checked = kernel.CheckedCall("c1", "ping", {"city": "Zürich", "n": 1})
    assert stored_arguments(checked) == '{"city":"Zürich","n":1}'
    assert stored_arguments(kernel.InvalidCall("c2", "ping", "bad")) == "{}"
