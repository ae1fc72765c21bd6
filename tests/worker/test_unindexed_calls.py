"""Streamed tool calls whose parts carry no ``index`` (providers that leave it out) fold into
calls: a part naming a call (an id or a function name) starts one, a part that names none, or
repeats the last call's id, continues the last one's arguments. Before, every part without an
index started a call of its own: a call whose arguments came in two chunks became two broken
calls (invalid JSON, and an unknown tool ``''``), and the reply was a correction however
well-formed."""

from __future__ import annotations

from typing import Any

from agentrun.worker.delivery import Delivery


def part(**fields: Any) -> dict[str, Any]:
    function = {k: fields.pop(k) for k in ("name", "arguments") if k in fields}
    return {**fields, "type": "function", "function": function}


def folded(*parts: dict[str, Any]) -> list[dict[str, Any]]:
    delivery = Delivery()
    for one in parts:
        delivery.add({"choices": [{"index": 0, "delta": {"tool_calls": [one]}}]})
    return delivery.message()["tool_calls"]


def test_parts_without_an_index_continue_the_last_call() -> None:
    calls = folded(
        part(id="a", name="calculate", arguments='{"expres'),
        part(arguments='sion":"1+1"}'),
        part(id="b", name="calculate", arguments='{"expression":'),
        part(arguments='"2+2"}'),
    )
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("a", "calculate", '{"expression":"1+1"}'),
        ("b", "calculate", '{"expression":"2+2"}'),
    ]


def test_whole_calls_without_an_index_stay_apart() -> None:
    calls = folded(part(name="calculate", arguments="{}"), part(name="ping", arguments="{}"))
    assert [c["function"]["name"] for c in calls] == ["calculate", "ping"]


def test_an_unindexed_part_after_indexed_calls_takes_a_new_position() -> None:
    calls = folded(part(index=3, id="a", name="x", arguments="{}"), part(id="b", name="y"))
    assert [c["id"] for c in calls] == ["a", "b"]


def test_parts_without_an_index_that_repeat_their_call_id_continue_that_call() -> None:
    calls = folded(
        part(id="a", name="calculate", arguments='{"expres'),
        part(id="a", arguments='sion":"1+1"}'),
        part(id="b", name="calculate", arguments="{}"),
    )
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("a", "calculate", '{"expression":"1+1"}'),
        ("b", "calculate", "{}"),
    ]
