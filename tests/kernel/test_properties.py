"""Properties of the history the loop builds, whatever the model sends and the tools do.

The invariant (OpenAI tool calling; servers reject a history that breaks it): every assistant
tool call has exactly one result message with its id, in the order of the calls, whatever
happened — success, a ``ToolError``, a tool bug, a timeout, the run's deadline, a cancelled
attempt, a batch the budget refused, or calls held for approval and then approved or denied.
Ids are unique across the history and stored arguments are JSON.

Turns run through the worker's real turn code (``execute_turn``: classify, ``check_calls``,
the gates, ``toolrunner.run_batch``, approval holds and resumes) against an in-process scripted
model and scripted tools, and are folded with ``kernel.advance``; a scripted reviewer approves
or denies held calls with ``kernel.resolve_approval``. Each test drives its own event loop
(not the session loop of pytest-asyncio), so examples cannot leak tasks into each other.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import hypothesis
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agentrun import kernel
from agentrun.kernel import wire
from agentrun.protocol import Approval, ModelConfig, RunConfig, RunEvent
from agentrun.testing import strict
from agentrun.tools import Catalog, ToolContext, ToolError, ToolSpec
from agentrun.worker.model import ModelClient
from agentrun.worker.toolrunner import ToolRunSettings
from agentrun.worker.turn import TurnDeps, execute_turn

from . import strategies

T = TypeVar("T")
UID = "uid-prop"

CALL_TIMEOUT = 0.02
"""Seconds a scripted call may take: ``hang`` always takes longer."""
LATE_DEADLINE = 0.005
"""Seconds left of the run when a "late" turn's tools start: ``hang`` meets the deadline."""
INTERRUPT_AFTER = 0.002
"""Seconds after which an interrupted attempt of a turn is cancelled."""
ERROR = "ERROR: "
"""How a tool message marks an error result (the OpenAI shape has no error flag)."""
FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------- scripted world


class ScriptedTool:
    """A tool whose behaviour is its name: ``echo``, ``guarded`` and ``post`` (a write) name
    their call id,
    ``refuse`` raises ``ToolError``, ``crash`` has a bug, ``hang`` never returns, ``open``
    takes any object."""

    def __init__(self, name: str) -> None:
        schema = strategies.TOOL_SCHEMAS[name]
        self.spec = ToolSpec(
            name,
            f"scripted {name}",
            schema.parameters,
            schema.effect,
            False,  # type: ignore[arg-type]
        )

    async def run(self, arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        match self.spec.name:
            case "echo" | "guarded" | "post":
                return f"{self.spec.name} {ctx.call_id}"
            case "refuse":
                raise ToolError("refused: the scripted tool says no")
            case "crash":
                raise RuntimeError("a bug in the scripted tool")
            case "hang":
                await asyncio.sleep(3600)
        return "opened"


CATALOG = Catalog(ScriptedTool(name) for name in strategies.TOOL_SCHEMAS)


class ScriptedModel(ModelClient):
    """Answers every call with ``reply`` (set per turn by the test); no HTTP."""

    def __init__(self) -> None:
        super().__init__()
        self.reply: dict[str, Any] = {}
        self.prompts: list[Sequence[Mapping[str, Any]]] = []

    async def complete(self, request: Any, **_: Any) -> dict[str, Any]:
        self.prompts.append(request.messages)
        return self.reply


class NoSecrets:
    async def api_key(self, ref: Any) -> str:
        raise AssertionError("the scripted model has no secret")


@dataclasses.dataclass(frozen=True)
class TurnPlan:
    """What the model answers in one turn, and what happens around it."""

    response: dict[str, Any]
    interrupted: bool
    """A first attempt of the turn is cancelled mid-way (the operator cancels, the worker
    stops); the turn is then redelivered and run again."""
    late: bool
    """The run's deadline arrives while the turn's tools run."""


turn_plans = st.builds(
    TurnPlan,
    response=strategies.responses(),
    interrupted=st.sampled_from([False, False, False, True]),
    late=st.sampled_from([False, False, False, False, True]),
)
limits = st.one_of(
    st.just(
        kernel.Limits(
            max_steps=100,
            max_tool_calls=1000,
            malformed_limit=100,
            unavailable_turns=1000,
            no_progress_window=100,
            approval_tools=strategies.APPROVAL_TOOLS,
        )
    ),
    st.builds(
        kernel.Limits,
        max_steps=st.integers(1, 8),
        max_tool_calls=st.integers(0, 20),
        malformed_limit=st.integers(1, 4),
        unavailable_turns=st.integers(1, 4),
        no_progress_window=st.integers(1, 3),
        on_exhausted=st.sampled_from(kernel.OnExhausted),
        approval_tools=st.just(strategies.APPROVAL_TOOLS),
    ),
)
"""A run that goes through the whole script, or one that some guard or cap stops early."""


def in_own_loop(work: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine in a fresh event loop that is never made the thread's current loop."""
    with asyncio.Runner(loop_factory=asyncio.new_event_loop) as runner:
        return runner.run(work())


def run_config(run_limits: kernel.Limits, *, deadline: float) -> RunConfig:
    return RunConfig(
        uid=UID,
        namespace="ns",
        name="prop",
        goal="use the tools",
        instructions="",
        tools=tuple(strategies.TOOL_SCHEMAS),
        limits=run_limits,
        model=ModelConfig(
            "scripted", "http://unused.invalid/v1", "scripted", kernel.Pricing(), 128_000, 1000
        ),
        deadline=deadline,
    )


async def play_turn(
    model: ScriptedModel, state: kernel.RunState, plan: TurnPlan, run_limits: kernel.Limits
) -> kernel.TurnRecord:
    """One turn as a worker runs it; an interrupted first attempt commits nothing."""
    model.reply = plan.response
    deadline = time.time() + (LATE_DEADLINE if plan.late else 3600)
    config = run_config(run_limits, deadline=deadline)
    deps = TurnDeps(
        model=model,
        catalog=CATALOG,
        secrets=NoSecrets(),
        tool_settings=ToolRunSettings(call_timeout=CALL_TIMEOUT, retry_backoff=0.01),
        clock=lambda: 0.0,  # the gates see time before the deadline; the tools see real time
    )
    if plan.interrupted:
        slow = dataclasses.replace(deps, tool_settings=ToolRunSettings(call_timeout=3600))
        attempt = asyncio.ensure_future(execute_turn(slow, config, state))
        await asyncio.sleep(INTERRUPT_AFTER)
        attempt.cancel()
        try:
            return await attempt  # it finished before the cancel arrived
        except asyncio.CancelledError:
            assert asyncio.all_tasks() == {asyncio.current_task()}, "a cancelled call still runs"
            hypothesis.event("a turn was cancelled mid-way and redelivered")
    return await execute_turn(deps, config, state)


async def play(
    plans: Sequence[TurnPlan],
    run_limits: kernel.Limits,
    verdicts: Sequence[bool],
    model: ScriptedModel | None = None,
) -> tuple[kernel.RunState, list[RunEvent]]:
    """Fold the turns of ``plans`` until the script or the run ends; held calls get the
    reviewer's ``verdicts`` in order (approved once they run out). ``model`` records every
    prompt sent."""
    model = model or ScriptedModel()
    reviewer = iter(verdicts)
    state = kernel.initial_state(goal="use the tools")
    events: list[RunEvent] = []
    for plan in plans:
        while state.phase is kernel.Phase.AWAITING_APPROVAL:
            assert state.pending is not None and state.pending.next_undecided is not None
            verdict = Approval(state.pending.next_undecided.digest, next(reviewer, True))
            state = kernel.resolve_approval(state, digest=verdict.digest, approved=verdict.approved)
            events.append(RunEvent("approval", UID, state.summary(), approval=verdict))
        if state.phase.is_terminal:
            break
        record = await play_turn(model, state, plan, run_limits)
        state = kernel.advance(state, record, run_limits)
        events.append(RunEvent("turn", UID, state.summary(), record=record))
    return state, events


# --------------------------------------------------------------------------- what must hold


def strict_json(text: str) -> Any:
    """``json.loads`` without Python's extensions (``NaN``, ``Infinity``, ``-Infinity``)."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def assert_every_call_has_one_result_in_order(messages: Sequence[Mapping[str, Any]]) -> None:
    """Each assistant ``tool_calls`` is followed by exactly its results, in call order; no tool
    message stands anywhere else; ids are unique; stored arguments are JSON objects."""
    ids: list[str] = []
    index = 0
    while index < len(messages):
        message = messages[index]
        assert message["role"] != "tool", f"message {index} answers no call: {message}"
        index += 1
        if message["role"] != "assistant" or "tool_calls" not in message:
            continue
        calls = message["tool_calls"]
        assert calls, f"message {index - 1} has an empty tool_calls list"
        answers = []
        while index < len(messages) and messages[index]["role"] == "tool":
            answers.append(messages[index])
            index += 1
        assert [a["tool_call_id"] for a in answers] == [c["id"] for c in calls]
        for call, answer in zip(calls, answers, strict=True):
            assert isinstance(strict_json(call["function"]["arguments"]), dict)
            assert_a_success_is_its_own_calls(call, answer["content"])
        ids.extend(c["id"] for c in calls)
    assert len(ids) == len(set(ids)), f"repeated tool_call_ids: {ids}"


def assert_a_success_is_its_own_calls(call: Mapping[str, Any], content: str) -> None:
    """A result that is not an error is what this call's tool returns for this very call."""
    if content.startswith(ERROR):
        return
    name = call["function"]["name"]
    assert name in ("echo", "guarded", "open", "post"), f"{name!r} cannot succeed: {content}"
    assert content == ("opened" if name == "open" else f"{name} {call['id']}")


def assert_each_result_says_what_happened(records: Sequence[kernel.TurnRecord]) -> None:
    """One result per call, by id and in order, saying what became of that call; a held or
    deferred call's result comes with the turn that resumes it."""
    held: dict[str, kernel.CheckedCall] = {}
    for record in records:
        if isinstance(record, kernel.Resumed):
            assert [r.tool_call_id for r in record.results] == list(held)
            for result in record.results:
                call = held[result.tool_call_id]
                if result.content == kernel.DENIED:
                    assert result.is_error
                else:
                    assert_the_call_ran_or_was_stopped(call, result, record.stopped)
            held = {}
            continue
        if not isinstance(record, kernel.Answered):
            continue  # no model answer, no calls
        pending = {*record.held, *record.deferred}
        ran = [c for c in record.calls if c.id not in pending]
        assert [r.tool_call_id for r in record.results] == [c.id for c in ran]
        held = {
            c.id: c for c in record.calls if c.id in pending and isinstance(c, kernel.CheckedCall)
        }
        assert set(held) == pending
        if record.deferred:  # a batch with a write: nothing valid ran before its commit
            assert all(isinstance(c, kernel.InvalidCall) for c in ran)
        for call, result in zip(ran, record.results, strict=True):
            if isinstance(call, kernel.InvalidCall):
                assert (result.name, result.is_error, result.content) == (
                    call.name,
                    True,
                    call.error,
                )
            else:
                assert_the_call_ran_or_was_stopped(call, result, record.stopped)


def assert_the_call_ran_or_was_stopped(
    call: kernel.CheckedCall, result: kernel.ToolResult, stopped: kernel.Ending | None
) -> None:
    assert result.name == call.name
    if stopped is not None:
        assert result.is_error and result.content.startswith("not run: ")
    else:
        assert (result.is_error, outcome_of(result.content)) == OUTCOMES[call.name]


OUTCOMES = {
    "echo": (False, "ran"),
    "guarded": (False, "ran"),
    "post": (False, "ran"),
    "open": (False, "ran"),
    "refuse": (True, "refused"),
    "crash": (True, "failed"),
    "hang": (True, "timed out"),
}
"""What each scripted tool's valid call ends as: (is_error, outcome_of(content))."""


def outcome_of(content: str) -> str:
    if content.startswith("refused: "):
        return "refused"
    if content.startswith("the tool failed: RuntimeError"):
        return "failed"
    if "timed out after" in content or "deadline passed while the tool ran" in content:
        return "timed out"
    return "ran"


def assert_events_commit_and_replay(
    events: Sequence[RunEvent], run_limits: kernel.Limits, final: kernel.RunState
) -> None:
    """Every event survives its payload, and the decoded events fold back to ``final``."""
    state = kernel.initial_state(goal="use the tools")
    for event in events:
        decoded = RunEvent.decode(event.encode())
        assert (decoded.record, decoded.approval) == (event.record, event.approval)
        if decoded.record is not None:
            state = kernel.advance(state, decoded.record, run_limits)
        else:
            assert decoded.approval is not None
            state = kernel.resolve_approval(
                state, digest=decoded.approval.digest, approved=decoded.approval.approved
            )
        assert decoded.summary == state.summary()
    assert state == final


def describe(state: kernel.RunState, records: Sequence[kernel.TurnRecord]) -> None:
    """What the example covered (``pytest --hypothesis-show-statistics``)."""
    hypothesis.event(f"ended {state.phase.value} after {len(records)} turn(s)")
    results = [r for record in records for r in kernel.record_results(record)]
    if any(isinstance(r, kernel.Resumed) for r in records):
        hypothesis.event("held calls were decided and resumed")
    for what in ("timed out after", "deadline passed", "not run: ", "refused: ", "denied by"):
        if any(what in r.content for r in results):
            hypothesis.event(f"a result says {what!r}")


# --------------------------------------------------------------------------- properties


@FAST
@given(
    plans=st.lists(turn_plans, min_size=2, max_size=6),
    run_limits=limits,
    verdicts=st.lists(st.booleans(), max_size=6),
)
def test_every_tool_call_gets_exactly_one_result_in_call_order_whatever_happens(
    plans: list[TurnPlan], run_limits: kernel.Limits, verdicts: list[bool]
) -> None:
    model = ScriptedModel()
    state, events = in_own_loop(lambda: play(plans, run_limits, verdicts, model))
    for prompt in model.prompts:  # summaries, nudges, corrections and resumes included
        assert strict.violations(prompt) == [], prompt
    if any(
        m["role"] == "assistant" and m["content"] == wire.BRIDGE for p in model.prompts for m in p
    ):
        hypothesis.event("a user note after tool results was bridged")
    records = [e.record for e in events if e.record is not None]
    assert_every_call_has_one_result_in_order(state.messages)
    assert state.call_ids == {
        c.id for r in records if isinstance(r, kernel.Answered) for c in r.calls
    }
    assert_each_result_says_what_happened(records)
    assert_events_commit_and_replay(events, run_limits, state)
    describe(state, records)


@settings(max_examples=200, deadline=None)
@given(
    calls=st.lists(strategies.tool_calls(), max_size=8),
    turn=st.integers(0, 3),
    used=st.frozensets(strategies.fresh_ids, max_size=6),
)
def test_check_calls_is_deterministic_never_raises_and_gives_every_call_a_fresh_unique_id(
    calls: list[kernel.ToolCall], turn: int, used: frozenset[str]
) -> None:
    checked = kernel.check_calls(calls, turn=turn, tools=strategies.TOOL_SCHEMAS, used_ids=used)
    again = kernel.check_calls(
        list(calls), turn=turn, tools=strategies.TOOL_SCHEMAS, used_ids=set(used)
    )
    assert checked == again
    assert [c.name for c in checked] == [c.name for c in calls]
    ids = [c.id for c in checked]
    assert all(ids) and len(set(ids)) == len(ids) and not set(ids) & used
    for index, (call, result) in enumerate(zip(calls, checked, strict=True)):
        if call.id and call.id not in used and call.id not in ids[:index]:
            assert result.id == call.id, "a fresh id must be kept"
        if isinstance(result, kernel.CheckedCall):
            assert strategies.TOOL_SCHEMAS[result.name].validator.is_valid(result.arguments)
            assert isinstance(strict_json(kernel.validate.stored_arguments(result)), dict)


@settings(max_examples=400, deadline=None)
@given(response=strategies.response_like)
def test_classify_sorts_any_json_object_into_a_decision_without_raising(
    response: dict[str, Any],
) -> None:
    decision = kernel.classify(response)
    assert decision == kernel.classify(response)
    match decision:
        case kernel.ToolCalls(calls, _):  # every proposed call is kept, none is made up
            assert len(calls) == len(response["choices"][0]["message"]["tool_calls"])
            assert all(c.id is None or (isinstance(c.id, str) and c.id) for c in calls)
        case kernel.Final(content):
            assert content.strip()
        case kernel.Refusal(text):
            assert text.strip()
        case kernel.Malformed():
            pass
        case _:
            raise AssertionError(f"not a decision: {decision!r}")


# --------------------------------------------------------------------------- kernel bugs found
#
# The tests below fail on the kernel as it stands; each names the rule it holds the kernel to.


@settings(max_examples=200, deadline=None)
@given(
    raw=st.recursive(
        st.floats() | st.integers() | st.text(max_size=4),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
        max_leaves=6,
    ).map(lambda value: json.dumps({"x": value}))  # Python writes NaN, Infinity, -Infinity
)
@example(raw='{"x": NaN}')
@example(raw='{"x": [-Infinity]}')
@example(raw='{"x": 1e999}')
def test_stored_arguments_are_json_even_when_the_model_writes_nan_or_infinity(raw: str) -> None:
    """Python's ``json.loads`` accepts ``NaN``, ``Infinity`` and ``1e999`` (as inf); JSON
    (RFC 8259) has no such numbers.

    ``validate`` requires that history only holds valid JSON (servers reject a history that
    does not). Today such arguments pass ``check_calls`` (a ``{"type": "object"}`` schema or a
    ``number`` field accepts them: ``sleep`` with ``{"seconds": NaN}`` then sleeps until the
    call timeout or the run's deadline, since NaN escapes its clamp) and ``stored_arguments``
    writes ``NaN``.
    """
    (call,) = kernel.check_calls(
        [kernel.ToolCall("c1", "open", raw)], turn=0, tools=strategies.TOOL_SCHEMAS
    )
    assert isinstance(strict_json(kernel.validate.stored_arguments(call)), dict)


@pytest.mark.parametrize(
    "response",
    [
        pytest.param(
            {
                "choices": [
                    {
                        "finish_reason": "tool_calls",
                        "message": {
                            "tool_calls": [
                                {
                                    "id": "c1",
                                    "function": {"name": "open", "arguments": '{"x": "\\ud83d"}'},
                                }
                            ]
                        },
                    }
                ]
            },
            id="in-arguments",
        ),
        pytest.param(
            {"choices": [{"finish_reason": "stop", "message": {"content": "cut emoji \ud83d"}}]},
            id="in-an-answer",
        ),
    ],
)
def test_a_lone_surrogate_from_the_model_never_makes_a_turn_uncommittable(
    response: dict[str, Any],
) -> None:
    """A JSON escape of half a surrogate pair (a split emoji) decodes to a str UTF-8 cannot hold.

    Today it reaches the record and the history as is: ``RunEvent.encode`` raises
    ``UnicodeEncodeError`` at commit (the consumer naks, the turn is redone and its tools run
    again, up to ``max_deliver`` times), and so does the next model request's body.
    """
    decision = kernel.classify(response)
    calls = (
        kernel.check_calls(decision.calls, turn=0, tools=strategies.TOOL_SCHEMAS)
        if isinstance(decision, kernel.ToolCalls)
        else ()
    )
    record = kernel.Answered(
        0,
        decision=decision,
        calls=calls,
        results=tuple(kernel.ToolResult(c.id, c.name, "opened") for c in calls),
    )
    state = kernel.advance(kernel.initial_state(goal="g"), record, kernel.Limits())
    RunEvent("turn", "uid", state.summary(), record=record).encode()
    json.dumps(list(state.messages), ensure_ascii=False).encode()  # the next request's body


@settings(max_examples=300, deadline=None)
@given(response=strategies.response_like)
@example(response={"choices": [{"message": "not an object"}], "usage": None})
@example(response={"usage": {"prompt_tokens": 10, "completion_tokens": "n/a"}})
@example(response={"choices": {"0": {}}})
def test_read_usage_reads_any_json_object_without_raising(response: dict[str, Any]) -> None:
    """``execute_turn`` reads usage of whatever JSON object the endpoint sent, before
    classifying it; a raise there escapes the turn ("never raises for model or tool faults"),
    so the consumer naks and the same answer fails again on every redelivery."""
    usage = kernel.read_usage(response, pricing=kernel.Pricing(), prompt_estimate=10)
    assert usage.input_tokens >= 0
