"""The catalog: OpenAI tool definitions, valid schemas, and sleep as the simplest tool."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time

import jsonschema
import pytest

from agentrun import tools
from agentrun.kernel import wire

CTX = tools.ToolContext(namespace="ns", run_name="run", run_uid="uid", call_id="call_0_0")
CATALOG = tools.default_catalog()
ALL_SPECS = {name: tool.spec for name, tool in CATALOG.items()}


def test_default_catalog_holds_the_built_in_tools() -> None:
    assert list(CATALOG) == [
        "calculate",
        "sleep",
        "kubernetes_get",
        "http_get",
        "prometheus_query",
    ]
    assert len(CATALOG) == 5


@pytest.mark.parametrize("spec", ALL_SPECS.values(), ids=ALL_SPECS.keys())
def test_parameters_are_a_valid_draft_2020_12_object_schema(spec: tools.ToolSpec) -> None:
    jsonschema.Draft202012Validator.check_schema(spec.parameters)
    assert spec.parameters["type"] == "object"
    assert spec.parameters["additionalProperties"] is False
    assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", spec.name)
    assert spec.description


def test_an_object_schema_refuses_unknown_and_missing_arguments() -> None:
    schema = tools.catalog.object_schema(
        {"a": {"type": "integer"}, "b": {"type": "string"}}, required=["a"]
    )
    validator = jsonschema.Draft202012Validator(schema)
    assert validator.is_valid({"a": 1}) and validator.is_valid({"a": 1, "b": "x"})
    assert not validator.is_valid({"b": "x"})
    assert not validator.is_valid({"a": 1, "c": 2})


def test_specs_render_openai_function_tools_in_the_order_asked() -> None:
    specs = CATALOG.specs(["sleep", "calculate", "sleep"])
    assert [s["function"]["name"] for s in specs] == ["sleep", "calculate"]
    for rendered in specs:
        assert set(rendered) == {"type", "function"}
        assert rendered["type"] == "function"
        assert set(rendered["function"]) == {"name", "description", "parameters"}


def test_specs_are_copies_the_caller_may_change() -> None:
    CATALOG.specs(["calculate"])[0]["function"]["parameters"]["properties"].clear()
    assert "expression" in CATALOG["calculate"].spec.parameters["properties"]


def test_specs_of_unknown_tools_name_what_is_available() -> None:
    with pytest.raises(KeyError, match=r"unknown tools \['list_pods'\]; available: \["):
        CATALOG.specs(["calculate", "list_pods"])


def test_two_tools_with_one_name_are_refused() -> None:
    with pytest.raises(ValueError, match="two tools are named 'sleep'"):
        tools.Catalog([tools.Sleep(), tools.Sleep()])


def test_spec_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        tools.Sleep().spec.name = "nap"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("seconds", "expected"), [(0, "slept 0s"), (0.2, "slept 0.2s"), (1, "slept 1s")]
)
async def test_sleep_waits_and_says_how_long(seconds: float, expected: str) -> None:
    started = time.monotonic()
    assert await tools.Sleep().run({"seconds": seconds}, CTX) == expected
    assert time.monotonic() - started >= seconds


async def test_sleep_is_cancellable() -> None:
    task = asyncio.create_task(tools.Sleep().run({"seconds": 30}, CTX))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_every_built_in_tool_name_is_a_function_name_every_provider_accepts() -> None:
    """OpenAI's rule for function names, which Mistral and Anthropic also accept."""
    assert all(wire.WIRE_NAME.match(name) for name in CATALOG)
