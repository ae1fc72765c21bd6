"""Tool-call arguments nested past ``MAX_ARGUMENTS_DEPTH`` get a correction, never an error
out of the turn. Before: a few kilobytes of ``[[[…]]]`` (within ``MAX_ARGUMENTS_BYTES``)
raised ``RecursionError`` from the argument parser (a ``RecursionError`` is no
``ValueError``): the turn failed, the model was called again on redelivery, and the run ended
``checkpoint_failed``. Arguments some hundreds of levels deep passed, and the MCP SDK could
not serialize them (over ~255 levels): a ``write`` call never sent ended ``effect_unknown``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mcp.types import CallToolRequest, CallToolRequestParams

from agentrun import kernel
from agentrun.kernel.validate import MAX_ARGUMENTS_DEPTH

ANY = kernel.ToolSchema("any", {"type": "object"})


def nested(depth: int) -> str:
    """An arguments object holding arrays nested to ``depth`` levels in all."""
    inner = depth - 1
    return '{"a":' + "[" * inner + "]" * inner + "}"


def check(arguments: Any) -> kernel.CheckedCall | kernel.InvalidCall:
    (result,) = kernel.check_calls(
        [kernel.ToolCall("c1", "any", arguments)], turn=0, tools={"any": ANY}
    )
    return result


@pytest.mark.parametrize("depth", [MAX_ARGUMENTS_DEPTH + 1, 300, 600, 5000, 100_000])
def test_deep_arguments_get_a_correction(depth: int) -> None:
    """Seen at 600 and deeper: ``RecursionError``; at 300: a ``CheckedCall``."""
    for arguments in (nested(depth), json.dumps(nested(depth))):  # and double-encoded
        result = check(arguments)
        assert isinstance(result, kernel.InvalidCall), depth
        assert f"nested deeper than {MAX_ARGUMENTS_DEPTH} levels" in result.error


def test_deep_parsed_arguments_get_a_correction() -> None:
    """An answer sent whole may hold arguments as an object already."""
    result = check(json.loads(nested(300)))
    assert isinstance(result, kernel.InvalidCall)
    assert "nested deeper" in result.error


def test_parsed_arguments_at_the_limit_run_one_level_more_gets_a_correction() -> None:
    assert isinstance(check(json.loads(nested(MAX_ARGUMENTS_DEPTH))), kernel.CheckedCall)
    result = check(json.loads(nested(MAX_ARGUMENTS_DEPTH + 1)))
    assert isinstance(result, kernel.InvalidCall) and "nested deeper" in result.error


def test_arguments_at_the_limit_run_and_serialize_for_an_mcp_server() -> None:
    result = check(nested(MAX_ARGUMENTS_DEPTH))
    assert isinstance(result, kernel.CheckedCall)
    params = CallToolRequestParams(name="any", arguments=dict(result.arguments))
    request = CallToolRequest(method="tools/call", params=params)
    assert request.model_dump_json(by_alias=True, exclude_none=True)
