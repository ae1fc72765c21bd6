"""Hypothesis strategies for what a model may send: JSON values, raw tool calls, responses.

Everything here is *untrusted input* as the kernel receives it: ids that are missing, repeated,
not strings or shaped like the ids the kernel mints; tool names that are known, mangled or
empty; arguments that are valid, empty, invalid, double-encoded, of the wrong type or against
the schema. Values stay within what JSON can carry (finite numbers, no lone surrogates): the
two ways past that are tested on their own in ``test_properties.py``.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from agentrun import kernel

COUNTED = {
    "type": "object",
    "properties": {"n": {"type": "integer"}},
    "additionalProperties": False,
}
"""The schema of the scripted tools: an optional integer ``n`` and nothing else."""

TOOL_SCHEMAS = {
    "echo": kernel.ToolSchema("echo", COUNTED),
    "refuse": kernel.ToolSchema("refuse", COUNTED),
    "crash": kernel.ToolSchema("crash", COUNTED),
    "hang": kernel.ToolSchema("hang", COUNTED),
    "open": kernel.ToolSchema("open", {"type": "object"}),
    "guarded": kernel.ToolSchema("guarded", COUNTED),
    "post": kernel.ToolSchema("post", COUNTED, effect="write"),
}
"""Known tools by what they do: succeed, raise ``ToolError``, raise a bug, never return, take
any object, succeed once a person approves (``APPROVAL_TOOLS``), and succeed as a write (its
batch is committed before it runs, and runs in the next turn)."""
APPROVAL_TOOLS = frozenset({"guarded"})

UNKNOWN_NAMES = ("", "nope", "Echo", "functions.echo", "echo<|channel|>json", "echo ")
"""Names a model writes that no tool has (mangled names such as ``list_pods<|channel|>json``)."""

FAMILIAR_IDS = ("c1", "c2", "dup", "call_0_0", "0:echo:0", "0:echo:1", "1:echo:0", "0:tool:0")
"""Ids likely to collide: with each other, across turns, and with ids the kernel mints."""

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
"""Any JSON document Python's ``json`` round-trips exactly."""

counted_objects = st.fixed_dictionaries({}, optional={"n": st.integers()})
"""Objects valid against ``COUNTED``."""

valid_arguments = st.one_of(
    counted_objects.map(json.dumps),
    st.sampled_from(["", "  ", None, "{}"]),  # empty means no arguments
    counted_objects,  # an object rather than a string, as some servers send
    counted_objects.map(json.dumps).map(json.dumps),  # double-encoded
)
"""Arguments ``check_calls`` accepts for every known tool."""

arguments = st.one_of(
    valid_arguments,
    st.sampled_from(
        [
            "{oops",
            '{"n": 1}}',
            '{"n": 1}\\n}',
            "{'n': 1}",
            "[1, 2]",
            "42",
            '"text"',
            "null",
            '"{not json"',
        ]
    ),
    st.fixed_dictionaries({"n": json_values}).map(json.dumps),  # mostly against the schema
    st.dictionaries(st.text(max_size=4), json_values, max_size=3).map(json.dumps),
    json_values,
    st.text(max_size=20),
)
"""The raw ``function.arguments`` of a call: anything a model or a server has been seen to send."""

fresh_ids = st.sampled_from(FAMILIAR_IDS) | st.text(min_size=1, max_size=6)
"""Ids as a model writes them when it writes one."""
call_ids = fresh_ids | st.none() | st.just("")
tool_names = st.one_of(
    st.sampled_from(sorted(TOOL_SCHEMAS)),
    st.sampled_from(UNKNOWN_NAMES),
    st.text(max_size=8),
)
CALL_SHAPES = ("valid",) * 6 + ("any_arguments",) * 2 + ("any_name",) * 2
"""Mostly calls that run (so every tool outcome is common), then every way to be invalid."""


@st.composite
def tool_calls(draw: st.DrawFn) -> kernel.ToolCall:
    """One proposed call as ``classify`` hands it to ``check_calls``."""
    shape = draw(st.sampled_from(CALL_SHAPES))
    if shape == "valid":
        name, args = draw(st.sampled_from(sorted(TOOL_SCHEMAS))), draw(valid_arguments)
    elif shape == "any_arguments":
        name, args = draw(st.sampled_from(sorted(TOOL_SCHEMAS))), draw(arguments)
    else:
        name, args = draw(tool_names), draw(arguments)
    return kernel.ToolCall(draw(call_ids), name, args)


@st.composite
def raw_tool_calls(draw: st.DrawFn) -> Any:
    """One entry of ``message.tool_calls`` in a response, well-formed or not."""
    if draw(st.integers(0, 9)) == 9:
        return draw(json_values)  # not even an object
    call = draw(tool_calls())
    raw: dict[str, Any] = {
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }
    raw_id = draw(st.one_of(st.just(call.id), st.integers()))  # a non-string id counts as missing
    if raw_id is not None:
        raw["id"] = raw_id
    return raw


TURN_KINDS = ("tools",) * 7 + ("no_calls", "truncated", "empty", "final")
"""Mostly tool turns (the invariant is about them), sometimes a malformed turn or an answer."""


@st.composite
def responses(draw: st.DrawFn) -> dict[str, Any]:
    """A chat.completion object of one turn, with usage."""
    kind = draw(st.sampled_from(TURN_KINDS))
    message: dict[str, Any] = {
        "role": "assistant",
        "content": draw(st.none() | st.text(max_size=6)),
    }
    finish = "tool_calls"
    if kind in ("tools", "truncated"):
        message["tool_calls"] = draw(st.lists(raw_tool_calls(), min_size=1, max_size=6))
        finish = "length" if kind == "truncated" else draw(st.sampled_from(["tool_calls", "stop"]))
    elif kind == "no_calls":
        message["tool_calls"] = []
    elif kind == "empty":
        message["content"], finish = None, "stop"
    else:
        message["content"], finish = "the answer", "stop"
    return {
        "id": "chatcmpl-prop",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 20},
    }


response_like = st.one_of(
    st.dictionaries(st.text(max_size=8), json_values, max_size=4),
    st.fixed_dictionaries(
        {"choices": st.one_of(json_values, st.lists(json_values, max_size=2))},
        optional={"usage": json_values},
    ),
    st.fixed_dictionaries(
        {
            "choices": st.lists(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "finish_reason": st.one_of(
                            st.sampled_from(["stop", "length", "tool_calls", "content_filter"]),
                            json_values,
                        ),
                        "message": st.one_of(
                            json_values,
                            st.fixed_dictionaries(
                                {},
                                optional={
                                    "content": json_values,
                                    "refusal": json_values,
                                    "tool_calls": st.one_of(
                                        json_values, st.lists(raw_tool_calls(), max_size=3)
                                    ),
                                },
                            ),
                        ),
                    },
                ),
                max_size=2,
            )
        }
    ),
)
"""Dicts from arbitrary JSON objects to near-valid chat.completion objects."""
