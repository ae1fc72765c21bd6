"""Known ways models and servers misbehave (empty or invalid arguments, mangled names,
duplicate ids, empty tool-call lists, refusals, missing usage…), driven through the worker's
real turn code and the kernel against the scripted model server over HTTP (the real ``openai``
client)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from agentrun import kernel
from agentrun.kernel import Phase, wire
from agentrun.tools import Calculate, Catalog, Sleep, ToolContext, ToolError, ToolSpec
from agentrun.worker.toolrunner import ToolRunSettings

from .loop import drive


def wired(*stored: str) -> list[str]:
    """The ids the model reads for calls stored with ``stored`` ids (the wire form)."""
    return [wire.wire_call_id(s) for s in stored]


class Counter:
    """A write tool with a visible side effect; ``fail_on`` makes one key raise."""

    def __init__(
        self,
        name: str = "bump",
        *,
        fail_on: str | None = None,
        params: dict[str, Any] | None = None,
    ) -> None:
        self.counts: dict[str, int] = {}
        self.fail_on = fail_on
        self._spec = ToolSpec(
            name=name,
            description="increments a named counter",
            parameters=params
            or {
                "type": "object",
                "properties": {"key": {"type": "string"}},
                "required": ["key"],
                "additionalProperties": False,
            },
            effect="write",
            pollable=False,
        )

    @property
    def spec(self) -> ToolSpec:
        return self._spec

    async def run(self, arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        key = str(arguments.get("key", ""))
        self.counts[key] = self.counts.get(key, 0) + 1
        if key == self.fail_on:
            raise RuntimeError(f"counter {key} is broken")
        return f"{key}={self.counts[key]}"


class Ping:
    """A tool without parameters (a model may send its arguments as ``""``)."""

    spec = ToolSpec(
        "ping",
        "answers pong",
        {"type": "object", "properties": {}, "additionalProperties": False},
        "read",
        False,
    )

    async def run(self, arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        if arguments:
            raise ToolError("ping takes no arguments")
        return "pong"


def tool_messages(request: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [m for m in request["body"]["messages"] if m["role"] == "tool"]


async def test_empty_arguments_for_a_parameterless_tool_are_stored_as_an_empty_object() -> None:
    script = """
scenarios:
  - name: c01
    turns:
      - tool_calls: [{id: c1, name: ping, arguments: ""}]
      - content: "pong received"
"""
    state, _, requests = await drive(
        script, goal="ping it", catalog=Catalog([Ping()]), tools=("ping",)
    )
    assert state.phase is Phase.COMPLETED
    assistant = next(m for m in requests[1]["body"]["messages"] if m["role"] == "assistant")
    assert assistant["tool_calls"][0]["function"]["arguments"] == "{}"
    assert tool_messages(requests[1]) == [
        {"role": "tool", "tool_call_id": wire.wire_call_id("c1"), "content": "pong"}
    ]


async def test_three_turns_of_invalid_json_end_invalid_decision_and_nothing_runs() -> None:
    counter = Counter()
    bad = '{"key": "a"}\\\\n}'
    script = f"""
scenarios:
  - name: c02
    turns:
      - tool_calls: [{{name: bump, arguments: '{bad}'}}]
    after: repeat_last
"""
    state, _, requests = await drive(
        script, goal="bump", catalog=Catalog([counter]), tools=("bump",)
    )
    assert state.phase is Phase.INVALID_DECISION
    assert counter.counts == {}
    assert len(requests) == 3
    error = tool_messages(requests[1])[0]["content"]
    assert error.startswith("ERROR: arguments are not valid JSON")
    assert '"required":["key"]' in error
    # what is stored in history is valid JSON, never the malformed text
    for message in requests[2]["body"]["messages"]:
        for call in message.get("tool_calls") or ():
            json.loads(call["function"]["arguments"])


async def test_a_good_turn_between_malformed_ones_resets_the_streak() -> None:
    counter = Counter()
    script = """
scenarios:
  - name: c02-reset
    turns:
      - tool_calls: [{name: bump, arguments: "{oops"}]
      - tool_calls: [{name: bump, arguments: "{oops"}]
      - tool_calls: [{name: bump, arguments: {key: a}}]
      - tool_calls: [{name: bump, arguments: "{oops"}]
      - tool_calls: [{name: bump, arguments: "{oops"}]
      - content: "done"
"""
    state, _, _ = await drive(script, goal="bump", catalog=Catalog([counter]), tools=("bump",))
    assert state.phase is Phase.COMPLETED
    assert counter.counts == {"a": 1}
    assert state.corrections == 4


async def test_a_mangled_tool_name_runs_nothing_and_lists_the_tools() -> None:
    counter = Counter("list_pods", params={"type": "object"})
    script = """
scenarios:
  - name: c04
    turns:
      - tool_calls: [{name: "list_pods<|channel|>json", arguments: {}}]
      - content: "ok"
"""
    state, _, requests = await drive(
        script, goal="pods", catalog=Catalog([counter]), tools=("list_pods",)
    )
    assert counter.counts == {}
    assert "available tools: list_pods" in tool_messages(requests[1])[0]["content"]
    assert state.corrections == 1 and state.phase is Phase.COMPLETED


async def test_a_failing_parallel_call_still_gets_exactly_one_result() -> None:
    counter = Counter(fail_on="c")
    script = """
scenarios:
  - name: c09
    turns:
      - tool_calls:
          - {id: x1, name: bump, arguments: {key: a}}
          - {id: x2, name: bump, arguments: {key: b}}
          - {id: x3, name: bump, arguments: {key: c}}
      - content: "two of three"
"""
    state, _, requests = await drive(
        script, goal="bump all", catalog=Catalog([counter]), tools=("bump",)
    )
    assert counter.counts == {"a": 1, "b": 1, "c": 1}  # each side effect exactly once, no redo
    results = [m for m in state.messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in results] == ["x1", "x2", "x3"]
    assert [m["content"] for m in results[:2]] == ["a=1", "b=1"]
    # a write whose own code crashed may have done its effect: the run ends naming it, and the
    # model is never asked again (it could only call the write once more)
    assert results[2]["content"].startswith("ERROR: bump (x3) failed after it may have been sent")
    assert state.phase is Phase.EFFECT_UNKNOWN and "bump (x3)" in state.message
    assert len(requests) == 1
    assert state.tool_failures == 1


async def test_duplicate_call_ids_are_rekeyed_and_both_calls_run_once() -> None:
    counter = Counter()
    script = """
scenarios:
  - name: c06
    turns:
      - tool_calls:
          - {id: dup, name: bump, arguments: {key: a}}
          - {id: dup, name: bump, arguments: {key: b}}
      - content: "done"
"""
    state, _, requests = await drive(
        script, goal="bump", catalog=Catalog([counter]), tools=("bump",)
    )
    assert counter.counts == {"a": 1, "b": 1}
    ids = [m["tool_call_id"] for m in tool_messages(requests[1])]
    assert ids == wired("dup", "0:bump:1")
    assert len(set(state.call_ids)) == 2


async def test_results_follow_call_order_not_completion_order() -> None:
    script = """
scenarios:
  - name: c08
    turns:
      - tool_calls:
          - {id: slow, name: sleep, arguments: {seconds: 1.0}}
          - {id: fast, name: calculate, arguments: {expression: "1+2"}}
      - content: "done"
"""
    _, _, requests = await drive(
        script, goal="order", catalog=Catalog([Sleep(), Calculate()]), tools=("sleep", "calculate")
    )
    assert [m["tool_call_id"] for m in tool_messages(requests[1])] == wired("slow", "fast")


async def test_empty_tool_calls_get_a_corrective_turn_then_invalid_decision() -> None:
    script = """
scenarios:
  - name: c10
    turns:
      - {tool_calls: [], finish_reason: tool_calls}
    after: repeat_last
"""
    state, _, requests = await drive(
        script, goal="x", catalog=Catalog([Calculate()]), tools=("calculate",)
    )
    assert state.phase is Phase.INVALID_DECISION
    assert len(requests) == 3
    assert requests[1]["body"]["messages"][-1]["role"] == "user"
    assert "held no tool calls" in requests[1]["body"]["messages"][-1]["content"]


async def test_text_alongside_a_tool_call_is_kept_in_the_transcript() -> None:
    script = """
scenarios:
  - name: c13
    turns:
      - content: "Let me check."
        tool_calls: [{id: k, name: calculate, arguments: {expression: "2*2"}}]
      - content: "It is 4."
"""
    state, _, requests = await drive(
        script, goal="x", catalog=Catalog([Calculate()]), tools=("calculate",)
    )
    assistant = next(m for m in requests[1]["body"]["messages"] if m["role"] == "assistant")
    assert assistant["content"] == "Let me check."
    assert state.tool_calls == 1 and state.answer == "It is 4."


async def test_a_refusal_ends_the_run_after_one_model_call() -> None:
    script = """
scenarios:
  - name: c14
    turns:
      - {refusal: "I can't help with that."}
"""
    state, _, requests = await drive(
        script,
        goal="x",
        catalog=Catalog([Calculate()]),
        tools=("calculate",),
        limits=kernel.Limits(max_steps=50),
    )
    assert state.phase is Phase.REFUSED and len(requests) == 1


async def test_missing_usage_is_estimated_flagged_and_still_budgeted() -> None:
    script = """
scenarios:
  - name: c17
    turns:
      - tool_calls: [{name: calculate, arguments: {expression: "{turn}+1"}}]
        usage: null
    after: repeat_last
"""
    state, records, _ = await drive(
        script,
        goal="x" * 400,
        catalog=Catalog([Calculate()]),
        tools=("calculate",),
        limits=kernel.Limits(max_tokens=3000),
    )
    assert state.phase is Phase.TOKEN_BUDGET_EXHAUSTED
    answered = [r for r in records if isinstance(r, kernel.Answered)]
    assert state.usage.estimated and answered and all(r.usage.estimated for r in answered)
    assert state.usage.total_tokens > 0


async def test_a_tool_that_hangs_is_cut_at_its_timeout_with_a_typed_error() -> None:
    script = """
scenarios:
  - name: hang
    turns:
      - tool_calls: [{id: h, name: sleep, arguments: {seconds: 5}}]
      - content: "moved on"
"""
    started = asyncio.get_running_loop().time()
    state, _, requests = await drive(
        script,
        goal="x",
        catalog=Catalog([Sleep()]),
        tools=("sleep",),
        tool_settings=ToolRunSettings(call_timeout=0.3, retries=1, retry_backoff=0.1),
    )
    assert asyncio.get_running_loop().time() - started < 4
    assert (
        tool_messages(requests[1])[0]["content"]
        == "ERROR: the call timed out after 0.3s"  # one deadline, its retries included
    )
    assert state.phase is Phase.COMPLETED


async def test_a_worker_without_the_runs_tool_ends_tool_unavailable() -> None:
    script = """
scenarios:
  - name: any
    turns: [{content: "never asked"}]
"""
    state, _, requests = await drive(
        script, goal="x", catalog=Catalog([Calculate()]), tools=("calculate", "gone")
    )
    assert state.phase is Phase.TOOL_UNAVAILABLE and requests == []


async def test_a_content_filter_400_ends_the_run_refused_at_once_naming_the_category() -> None:
    script = """
scenarios:
  - name: filtered
    match: {goal: "jailbreak"}
    turns:
      - fault:
          status: 400
          body: {error: {code: content_filter, param: prompt, message: filtered,
            innererror: {code: ResponsibleAIPolicyViolation,
              content_filter_result: {jailbreak: {filtered: true}}}}}
"""
    state, records, requests = await drive(script, goal="jailbreak", catalog=Catalog([]), tools=())
    assert state.phase is Phase.REFUSED
    assert "content filter" in state.message and "jailbreak" in state.message
    assert len(requests) == 1 and state.steps == 0
    assert isinstance(records[0], kernel.Stopped)
