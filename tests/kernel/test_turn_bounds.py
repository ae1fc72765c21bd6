"""What the tools return is bounded per turn, so a committed turn always fits the bus's
message cap: results are kept in call order while they fit a budget derived from the cap, the
one crossing it is cut, later ones become placeholders naming the bytes dropped — every call
keeps its one result under its id, and the model is told. A reply may make only so many
calls, and a record that would still not fit is committed as a corrective turn that keeps the
model call's usage."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun import kernel
from agentrun.kernel import MalformedCause, Phase, bounds
from agentrun.kernel import decision as dec
from agentrun.protocol import RunEvent, events

from .helpers import TOOLS, call, response

KIB = 1024
BUDGET = kernel.results_budget(kernel.MESSAGE_CAP)
EVENT_CAP = kernel.MESSAGE_CAP - 4096  # the bus keeps room for headers
NOW = kernel.Timing(now=1_000.0, deadline=2_000.0)


def result(i: int, content: str, *, error: bool = False) -> kernel.ToolResult:
    return kernel.ToolResult(f"call_{i}", "fetch", content, error)


def stored_results(results: tuple[kernel.ToolResult, ...]) -> int:
    """Bytes the results take in a committed record (the protocol's own encoding)."""
    data = events.record_as_dict(kernel.Resumed(0, results))["results"]
    return len(json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode())


def exactly(total: int, *, parts: int) -> tuple[kernel.ToolResult, ...]:
    """``parts`` results taking ``total`` bytes of the budget's count between them."""
    overhead = bounds.RESULT_OVERHEAD + len("call_0") + len("fetch")
    size = total // parts - overhead
    results = [result(i, "r" * size) for i in range(parts)]
    results[-1] = result(parts - 1, "r" * (size + total - parts * (size + overhead)))
    return tuple(results)


# (id, results, how many are kept whole, how many become placeholders)
CASES: list[tuple[str, tuple[kernel.ToolResult, ...], int, int]] = [
    (
        "100 results of 16 KiB: the first ones whole, one cut, the rest placeholders",
        tuple(result(i, "a" * 16 * KIB) for i in range(100)),
        30,
        69,
    ),
    ("results exactly at the budget are kept whole", exactly(BUDGET, parts=8), 8, 0),
    ("one byte over the budget: only the last result is cut", exactly(BUDGET + 1, parts=8), 7, 0),
    ("one huge result is cut to the budget", (result(0, "h" * 4 * 1024 * KIB),), 0, 0),
    (
        "a huge result, then small ones: the small ones are kept",
        (result(0, "h" * 2 * 1024 * KIB), result(1, "42"), result(2, "ok", error=True)),
        2,
        0,
    ),
    (
        "control characters count as the escapes they are stored as",
        tuple(result(i, "\x01" * 16 * KIB) for i in range(20)),
        5,
        14,
    ),
    (
        "errors are bounded like any result, and stay errors",
        tuple(result(i, "e" * 16 * KIB, error=True) for i in range(40)),
        31,
        8,
    ),
    ("a turn within the budget is left alone", tuple(result(i, "42") for i in range(128)), 128, 0),
]


@pytest.mark.parametrize(
    ("results", "whole", "dropped"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_turns_results_are_kept_within_the_budget_in_call_order(
    results: tuple[kernel.ToolResult, ...], whole: int, dropped: int
) -> None:
    bounded = kernel.bound_results(results, budget=BUDGET)
    assert [(r.tool_call_id, r.name, r.is_error) for r in bounded] == [
        (r.tool_call_id, r.name, r.is_error) for r in results
    ]
    kept = [b.content == r.content for b, r in zip(bounded, results, strict=True)]
    assert sum(kept) == whole
    assert kept == sorted(kept, reverse=True) or not kept[0]  # whole ones come first
    placeholders = [b for b in bounded if b.content.startswith("[agentrun: result dropped, ")]
    assert len(placeholders) == dropped
    for b, r in zip(bounded, results, strict=True):
        if b.content.startswith("[agentrun: result dropped, "):
            assert f"dropped, {bounds.stored_bytes(r.content)} bytes" in b.content
            assert f"cap of {BUDGET} bytes" in b.content
        elif b.content != r.content:  # the one crossing the budget
            assert b.content.startswith(r.content[:100])
            assert "\n[agentrun: result cut, " in b.content and "more bytes" in b.content
    assert stored_results(bounded) <= BUDGET
    if whole == len(results):
        assert bounded == results


TEXT = st.text(alphabet=st.sampled_from(["a", "é", "\x01", '"', "\n", "🙂", "\\"]))


@settings(max_examples=60, deadline=None)
@given(
    pieces=st.lists(st.tuples(TEXT, st.integers(0, 40_000)), min_size=1, max_size=60),
    budget=st.integers(64 * KIB, 600 * KIB),
)
def test_any_results_are_bounded_in_order_with_every_id_kept(
    pieces: list[tuple[str, int]], budget: int
) -> None:
    results = tuple(result(i, (text or "a") * reps) for i, (text, reps) in enumerate(pieces))
    bounded = kernel.bound_results(results, budget=budget)
    assert [r.tool_call_id for r in bounded] == [r.tool_call_id for r in results]
    assert stored_results(bounded) <= budget
    changed = [b.content != r.content for b, r in zip(bounded, results, strict=True)]
    if True in changed:  # whole results before the first change, none whole after but small ones
        first = changed.index(True)
        assert all(
            b.content == r.content for b, r in zip(bounded[:first], results[:first], strict=True)
        )
        assert all(
            c or bounds.stored_bytes(r.content) <= bounds.PLACEHOLDER_BYTES
            for c, r in zip(changed[first + 1 :], results[first + 1 :], strict=True)
        )


def test_the_cut_result_says_how_many_bytes_were_cut() -> None:
    [cut] = kernel.bound_results((result(0, "é" * 400 * KIB),), budget=BUDGET)
    kept, marker = cut.content.split("\n[agentrun: result cut, ")
    assert set(kept) == {"é"}
    assert marker.startswith(f"{len('é'.encode()) * 400 * KIB - len(kept.encode())} more bytes")


def ping_turn(calls: int) -> tuple[kernel.RunState, kernel.Limits, kernel.RunTools]:
    """A run whose model asked for ``calls`` parallel pings (planned as the worker does)."""
    limits = kernel.Limits(max_tool_calls=200)
    state = kernel.initial_state(goal="ping everything")
    step = kernel.plan_turn(
        state, limits, pricing=kernel.Pricing(), offer=kernel.Offer([]), clock=NOW
    )
    assert isinstance(step, kernel.CallModel)
    reply = response(None, tool_calls=[call("ping", "{}", id=f"p{i}") for i in range(calls)])
    answer = (kernel.classify(reply), kernel.Usage(1000, 50))
    planned = kernel.plan_answer(state, limits, step, answer, tools=TOOLS, clock=NOW)
    assert isinstance(planned, kernel.RunTools)
    return state, limits, planned


def test_eighty_calls_returning_16_kib_each_commit_within_the_cap_and_count_every_call() -> None:
    state, limits, step = ping_turn(80)
    results = tuple(kernel.ToolResult(c.id, c.name, "p" * 16 * KIB) for c in step.runnable)
    record = step.finish(results)
    after = kernel.advance(state, record, limits)
    event = RunEvent("turn", "uid", after.summary(), record=record, time=1.0)
    assert len(event.encode()) <= EVENT_CAP
    assert (after.phase, after.tool_calls, after.steps) == (Phase.RUNNING, 80, 1)
    assert after.usage.input_tokens == 1000
    tool_messages = [m for m in after.messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == [f"p{i}" for i in range(80)]
    assert tool_messages[0]["content"] == "p" * 16 * KIB
    assert tool_messages[-1]["content"].startswith("[agentrun: result dropped, 16384 bytes")


def test_the_results_budget_shrinks_by_what_the_models_reply_takes() -> None:
    long_text = "t" * dec.MAX_CONTENT_BYTES
    args = json.dumps({"pad": "x" * 2000})
    reply = response(long_text, tool_calls=[call("pad", args, id=f"p{i}") for i in range(120)])
    decision = kernel.classify(reply)
    assert isinstance(decision, kernel.ToolCalls)
    pad = {"pad": kernel.ToolSchema("pad", {"type": "object"})}
    calls = kernel.check_calls(decision.calls, turn=0, tools=pad)
    record = kernel.Answered(0, decision, kernel.Usage(10, 10), calls)
    results = tuple(kernel.ToolResult(c.id, c.name, "r" * 16 * KIB) for c in calls)
    finished = kernel.RunTools(record, calls).finish(results)
    state = kernel.advance(kernel.initial_state(goal="g"), finished, kernel.Limits())
    event = RunEvent("turn", "uid", state.summary(), record=finished, time=1.0)
    assert len(event.encode()) <= EVENT_CAP
    budget = kernel.results_budget(kernel.MESSAGE_CAP, reply_bytes=bounds.reply_size(record))
    assert budget < BUDGET - 64 * KIB
    assert budget - 32 * KIB < stored_results(finished.results) <= budget


def test_a_smaller_bus_cap_gives_a_smaller_budget() -> None:
    _, _, step = ping_turn(10)
    results = tuple(kernel.ToolResult(c.id, c.name, "p" * 16 * KIB) for c in step.runnable)
    record = step.finish(results, cap=256 * KIB)
    assert stored_results(record.results) <= kernel.results_budget(256 * KIB) <= 128 * KIB
    assert sum(r.content == "p" * 16 * KIB for r in record.results) == 7


def test_a_resume_turns_results_are_bounded_too() -> None:
    limits = kernel.Limits(max_tool_calls=200)
    state, _, step = ping_turn(60)
    deferred = dataclasses.replace(step.record, deferred=tuple(c.id for c in step.runnable))
    decided = kernel.advance(state, deferred, limits)
    resume = kernel.plan_turn(
        decided, limits, pricing=kernel.Pricing(), offer=kernel.Offer([]), clock=NOW
    )
    assert isinstance(resume, kernel.ResumeHeld) and len(resume.runnable) == 60
    ran = tuple(kernel.ToolResult(c.id, c.name, "w" * 16 * KIB) for c in resume.runnable)
    record = resume.finish(ran)
    assert [r.tool_call_id for r in record.results] == [c.id for c in resume.runnable]
    assert stored_results(record.results) <= BUDGET
    after = kernel.advance(decided, record, limits)
    assert after.tool_calls == 60 and after.phase is Phase.RUNNING


REPLIES: list[Any] = [
    pytest.param(128, kernel.ToolCalls, id="128 calls in one reply run"),
    pytest.param(129, kernel.Malformed, id="129 calls in one reply are a correction"),
]


@pytest.mark.parametrize(("count", "kind"), REPLIES)
def test_a_reply_may_make_at_most_128_calls(count: int, kind: type) -> None:
    reply = response(None, tool_calls=[call("ping", "{}", id=f"p{i}") for i in range(count)])
    decision = kernel.classify(reply)
    assert isinstance(decision, kind)
    if isinstance(decision, kernel.Malformed):
        assert decision.cause is MalformedCause.TOO_MANY_CALLS
        assert f"{count} tool calls, over the 128" in decision.detail
        note = kernel.advance(
            kernel.initial_state(goal="g"), kernel.Answered(0, decision), kernel.Limits()
        ).messages[-1]
        assert "Make fewer tool calls in one reply" in note["content"]


def test_a_call_id_longer_than_256_characters_is_replaced_by_a_minted_one() -> None:
    reply = response(None, tool_calls=[call("ping", "{}", id="x" * 257), call("ping", "{}")])
    decision = kernel.classify(reply)
    assert isinstance(decision, kernel.ToolCalls)
    assert [c.id for c in decision.calls] == [None, "call_1"]
    exact = kernel.classify(response(None, tool_calls=[call("ping", "{}", id="x" * 256)]))
    assert isinstance(exact, kernel.ToolCalls) and exact.calls[0].id == "x" * 256  # kept
    checked = kernel.check_calls(decision.calls, turn=3, tools=TOOLS)
    assert [c.id for c in checked] == ["3:ping:0", "call_1"]


def test_a_record_still_over_the_cap_becomes_a_correction_that_keeps_its_usage() -> None:
    state, limits, step = ping_turn(3)
    results = tuple(kernel.ToolResult(c.id, c.name, "\x00" * 16 * KIB) for c in step.runnable)
    record = step.finish(results)
    shrunk = kernel.shrink_record(record, size=2_000_000, cap=EVENT_CAP)
    assert isinstance(shrunk, kernel.Answered)
    assert isinstance(shrunk.decision, kernel.Malformed)
    assert shrunk.decision.cause is MalformedCause.UNSTORABLE
    assert "2000000 bytes, over the" in shrunk.decision.detail
    assert (shrunk.usage, shrunk.calls, shrunk.results) == (record.usage, (), ())
    after = kernel.advance(state, shrunk, limits)
    assert (after.phase, after.steps, after.corrections, after.tool_calls) == (
        Phase.RUNNING,
        1,
        1,
        0,
    )
    assert after.usage == record.usage
    assert "Make fewer tool calls in one reply" in after.messages[-1]["content"]


def test_a_shrunk_record_keeps_a_budget_ending() -> None:
    state, limits, step = ping_turn(3)
    ending = kernel.Ending(Phase.TOOL_BUDGET_EXHAUSTED, "maxToolCalls 2")
    record = dataclasses.replace(step.record, stopped=ending)
    shrunk = kernel.shrink_record(record, size=2_000_000, cap=EVENT_CAP)
    after = kernel.advance(state, shrunk, limits)
    assert (after.phase, after.message) == (Phase.TOOL_BUDGET_EXHAUSTED, "maxToolCalls 2")


SHRUNK: list[Any] = [
    pytest.param(
        kernel.Resumed(4, (result(0, "w" * 600 * KIB), result(1, "ok"))),
        lambda r: [x.content[:27] for x in r.results] == ["[agentrun: result dropped, ", "ok"],
        id="a resume turn keeps every call's result, as a placeholder when large",
    ),
    pytest.param(
        kernel.Summarized(4, kernel.Final("s" * 900 * KIB), kernel.Usage(5, 5)),
        lambda r: r.decision is None and r.usage == kernel.Usage(5, 5) and "not kept" in r.error,
        id="a summary is recorded as not written, with its usage",
    ),
    pytest.param(
        kernel.Answered(4, kernel.Refusal("no" * 300 * KIB), kernel.Usage(5, 5)),
        lambda r: (
            isinstance(r.decision, kernel.Refusal)
            and len(r.decision.text) < 5 * KIB
            and r.usage == kernel.Usage(5, 5)
        ),
        id="a refusal keeps its first bytes",
    ),
    pytest.param(
        kernel.ModelFailed(4, "e" * 900 * KIB),
        lambda r: len(r.error) < 5 * KIB,
        id="an error message is cut",
    ),
]


@pytest.mark.parametrize(("record", "check"), SHRUNK)
def test_shrinking_keeps_what_the_run_needs(record: kernel.TurnRecord, check: Any) -> None:
    shrunk = kernel.shrink_record(record, size=2_000_000, cap=EVENT_CAP)
    assert shrunk.turn == record.turn
    assert check(shrunk)
    data = json.dumps(events.record_as_dict(shrunk), ensure_ascii=False)
    assert len(data.encode()) < 16 * KIB


def test_a_reply_s_size_is_its_text_raw_arguments_ids_names_and_checked_calls() -> None:
    """Each part as stored (JSON escapes counted: a ``"`` takes 2 bytes); a call held for a
    person carries its arguments three times (the run's summary shows them to the reviewer)."""
    raw = '{"expression":"1"}'  # 18 characters, 4 quotes: 22 bytes stored
    decision = kernel.ToolCalls(
        (
            kernel.ToolCall("call_1", "calculate", raw),
            kernel.ToolCall("call_2", "nope", {"k": 1}),  # not a string: stored as str(), 8
            kernel.ToolCall("call_3", "calculate", raw),
        ),
        "hi",
    )
    calls = (
        kernel.CheckedCall("call_1", "calculate", {"expression": "1"}),
        kernel.InvalidCall("call_2", "nope", "unknown"),
        kernel.CheckedCall("call_3", "calculate", {"expression": "1"}),
    )
    record = kernel.Answered(0, decision, calls=calls, held=("call_1",))
    text, arguments = 2, 22 + 8 + 22
    ids_and_names = (64 + 2 * (6 + 9)) + (64 + 2 * (6 + 4)) + (64 + 2 * (6 + 9))
    checked, error = 22 * 3 + 22, 7
    assert bounds.reply_size(record) == text + arguments + ids_and_names + checked + error == 421


def test_a_stopped_turn_keeps_its_turn_phase_and_the_first_bytes_of_its_message() -> None:
    record = kernel.Stopped(4, kernel.Ending(Phase.DEADLINE_EXCEEDED, "m" * 900 * KIB))
    shrunk = kernel.shrink_record(record, size=2_000_000, cap=EVENT_CAP)
    assert isinstance(shrunk, kernel.Stopped)
    assert (shrunk.turn, shrunk.ending.phase) == (4, Phase.DEADLINE_EXCEEDED)
    assert shrunk.ending.message.startswith("m" * 4000)
    assert len(shrunk.ending.message.encode()) < 5 * KIB


def test_a_resume_turn_s_large_result_becomes_a_placeholder_naming_its_bytes_and_the_budget() -> (
    None
):
    """Results up to 256 bytes are kept as they are; the budget named is the cap's
    (``results_budget(512 KiB)``: 256 KiB)."""
    record = kernel.Resumed(4, (result(0, "w" * 3000), result(1, "e" * 256)))
    shrunk = kernel.shrink_record(record, size=2_000_000, cap=512 * KIB)
    assert isinstance(shrunk, kernel.Resumed)
    assert [r.content for r in shrunk.results] == [
        "[agentrun: result dropped, 3000 bytes: this turn's tool results passed their cap of "
        "262144 bytes. Make fewer tool calls in one turn, or ask for less output]",
        "e" * 256,
    ]
