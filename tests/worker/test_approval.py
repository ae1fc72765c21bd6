"""Tool calls listed in spec.approval.tools wait for a person; approvals are bound to a digest."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from agentrun import kernel, protocol
from agentrun.kernel import Phase, wire
from agentrun.tools import Calculate, Catalog, ToolContext, ToolSpec

from .loop import drive

SCRIPT = """
scenarios:
  - name: deploy
    turns:
      - content: "Checking, then deploying."
        tool_calls:
          - {id: c1, name: calculate, arguments: {expression: "6*7"}}
          - {id: d1, name: deploy, arguments: {version: "1.2.3"}}
      - content: "{turn}: done"
"""


class Deploy:
    """A write tool whose runs are counted."""

    spec = ToolSpec(
        "deploy",
        "deploys a version",
        {"type": "object", "properties": {"version": {"type": "string"}}, "required": ["version"]},
        "write",
        False,
    )

    def __init__(self) -> None:
        self.deployed: list[str] = []

    async def run(self, arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        self.deployed.append(str(arguments["version"]))
        return f"deployed {arguments['version']}"


def limits() -> kernel.Limits:
    return kernel.Limits(approval_tools=frozenset({"deploy"}))


def reviewer(approved: bool) -> Any:
    seen: list[dict[str, Any]] = []

    def decide(state: kernel.RunState) -> tuple[str, bool]:
        pending = protocol.held_call_as_dict(state.summary().pending_approval)
        assert pending is not None
        seen.append(pending)
        return pending["digest"], approved

    decide.seen = seen  # type: ignore[attr-defined]
    return decide


async def test_an_approved_call_runs_and_the_batch_enters_history_in_call_order() -> None:
    deploy = Deploy()
    approve = reviewer(True)
    state, records, requests = await drive(
        SCRIPT,
        goal="ship it",
        catalog=Catalog([Calculate(), deploy]),
        tools=("calculate", "deploy"),
        limits=limits(),
        approver=approve,
    )
    assert state.phase is Phase.COMPLETED
    assert deploy.deployed == ["1.2.3"]
    (pending,) = approve.seen
    assert (pending["toolCallID"], pending["tool"], pending["arguments"]) == (
        "d1",
        "deploy",
        {"version": "1.2.3"},
    )
    assert pending["digest"] == kernel.digest_of("deploy", {"version": "1.2.3"})
    assert [type(r) for r in records] == [kernel.Answered, kernel.Resumed, kernel.Answered]
    tools = [m for m in requests[1]["body"]["messages"] if m["role"] == "tool"]
    assert [(m["tool_call_id"], m["content"]) for m in tools] == [
        (wire.wire_call_id("c1"), "42"),  # ids go out in wire form
        (wire.wire_call_id("d1"), "deployed 1.2.3"),
    ]
    assert state.tool_calls == 2


async def test_a_denied_call_never_runs_and_the_model_reads_the_denial() -> None:
    deploy = Deploy()
    state, _, requests = await drive(
        SCRIPT,
        goal="ship it",
        catalog=Catalog([Calculate(), deploy]),
        tools=("calculate", "deploy"),
        limits=limits(),
        approver=reviewer(False),
    )
    assert deploy.deployed == []
    assert state.phase is Phase.COMPLETED  # the model continues after a denial
    tools = [m for m in requests[1]["body"]["messages"] if m["role"] == "tool"]
    assert tools[1] == {
        "role": "tool",
        "tool_call_id": wire.wire_call_id("d1"),
        "content": "ERROR: " + kernel.DENIED,
    }
    assert (state.tool_calls, state.tool_failures, state.tool_calls_not_run) == (1, 0, 1)


def held_state() -> kernel.RunState:
    calls = (
        kernel.CheckedCall("c1", "calculate", {"expression": "1"}),
        kernel.CheckedCall("d1", "deploy", {"version": "1"}),
    )
    record = kernel.Answered(
        0,
        decision=kernel.ToolCalls((), None),
        calls=calls,
        results=(kernel.ToolResult("c1", "calculate", "1"),),
        held=("d1",),
    )
    return kernel.advance(kernel.initial_state(goal="g"), record, limits())


def test_a_held_turn_waits_without_an_unanswered_call_in_history() -> None:
    state = held_state()
    assert state.phase is Phase.AWAITING_APPROVAL and not state.phase.is_terminal
    assert kernel.conclude(state.phase, steps=state.steps) is None
    assert [m["role"] for m in state.messages] == ["user"]  # nothing of the batch yet
    waiting = state.summary().pending_approval
    assert waiting is not None and waiting.id == "d1"


@pytest.mark.parametrize(
    "digest",
    [
        pytest.param(kernel.digest_of("deploy", {"version": "2"}), id="other arguments"),
        pytest.param(kernel.digest_of("calculate", {"version": "1"}), id="other tool"),
        pytest.param("sha256:" + "0" * 64, id="made up"),
    ],
)
def test_an_approval_for_a_different_digest_is_refused(digest: str) -> None:
    with pytest.raises(ValueError, match="does not match the pending call d1"):
        kernel.resolve_approval(held_state(), digest=digest, approved=True)


def test_an_approval_when_nothing_waits_is_refused() -> None:
    with pytest.raises(ValueError, match="not waiting for an approval"):
        kernel.resolve_approval(kernel.initial_state(goal="g"), digest="x", approved=True)


def test_a_long_result_is_cut_to_the_byte_cap_with_a_marker() -> None:
    text = "é" * 10_000  # 2 bytes each
    cut = kernel.clip_result(text, 1001)
    assert len(cut.split("\n")[0].encode()) <= 1001
    assert cut.endswith("[agentrun: result truncated, 19000 more bytes]")
    assert kernel.clip_result("short", 1001) == "short"
