"""A batch with several calls to approval tools: each is decided in turn, and what the run
shows (message, summary, ``.status.pendingApproval``) says which call of how many waits."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from agentrun import kernel, protocol
from agentrun.kernel import Phase

from .helpers import checked, tool_turn

LIMITS = kernel.Limits(approval_tools=frozenset({"deploy"}))


def waiting_on_two_deploys() -> kernel.RunState:
    start = kernel.initial_state(goal="ship both")
    calls = (
        kernel.CheckedCall("d1", "deploy", {"version": "1"}),
        checked("c1"),
        kernel.CheckedCall("d2", "deploy", {"version": "2"}),
    )
    turn = tool_turn(start, *calls)
    held = dataclasses.replace(turn, held=("d1", "d2"), results=turn.results[1:2])
    return kernel.advance(start, held, LIMITS)


def test_a_held_batch_says_which_call_of_how_many_waits() -> None:
    state = waiting_on_two_deploys()
    assert state.phase is Phase.AWAITING_APPROVAL
    assert state.message == "call 1 of 2 held for approval: deploy (d1)"
    summary = state.summary()
    assert summary.pending_approval is not None and summary.pending_approval.id == "d1"
    assert [held.id for held in summary.held_for_approval] == ["d1", "d2"]
    pending = protocol.pending_approval_as_dict(summary)
    assert pending is not None
    assert (pending["toolCallID"], pending["call"], pending["of"]) == ("d1", 1, 2)
    assert [(h["toolCallID"], h["decision"]) for h in pending["heldCalls"]] == [
        ("d1", "pending"),
        ("d2", "pending"),
    ]


def test_after_the_first_decision_the_second_call_waits_and_the_first_shows_its_verdict() -> None:
    state = waiting_on_two_deploys()
    first = state.summary().pending_approval
    assert first is not None
    after = kernel.resolve_approval(state, digest=first.digest, approved=True, reviewer="alice")
    assert after.phase is Phase.AWAITING_APPROVAL
    assert after.message == "approved by alice; call 2 of 2 held for approval: deploy (d2)"
    pending = protocol.pending_approval_as_dict(after.summary())
    assert pending is not None
    assert (pending["toolCallID"], pending["call"], pending["of"]) == ("d2", 2, 2)
    assert [h["decision"] for h in pending["heldCalls"]] == ["approved", "pending"]
    assert [h.get("reviewer") for h in pending["heldCalls"]] == ["alice", None]
    second = after.summary().pending_approval
    assert second is not None
    done = kernel.resolve_approval(after, digest=second.digest, approved=False, reviewer="bob")
    assert done.message == "denied by bob"
    assert done.phase is Phase.RUNNING and done.summary().held_for_approval == ()
    assert protocol.pending_approval_as_dict(done.summary()) is None


def test_the_batch_survives_the_event_round_trip() -> None:
    state = waiting_on_two_deploys()
    first = state.summary().pending_approval
    assert first is not None
    summary = kernel.resolve_approval(
        state, digest=first.digest, approved=False, reviewer="alice"
    ).summary()
    assert protocol.summary_from_dict(protocol.summary_as_dict(summary)) == summary
    assert summary.held_for_approval[0].reviewer == "alice"


CANONICAL = '{"arguments":{"b":[1,"é"],"expression":"6*7"},"tool":"calculate"}'
"""A call as its digest is taken: JSON with sorted keys, no spaces, UTF-8 as written."""


def test_the_approval_digest_is_the_sha256_of_the_call_s_canonical_json() -> None:
    """Pinned: ``agentrun approve`` and any other client recompute it, and a digest that
    changed between releases would refuse every approval given before an upgrade."""
    expected = "sha256:ce9d0ee2bb9cf987e80d8ad3cda3855fed09c904159be482ff5545f68fec1f90"
    assert kernel.digest_of("calculate", {"expression": "6*7", "b": [1, "é"]}) == expected
    assert kernel.digest_of("calculate", {"b": [1, "é"], "expression": "6*7"}) == expected
    assert hashlib.sha256(CANONICAL.encode()).hexdigest() == expected.removeprefix("sha256:")
    assert kernel.digest_of("calculate", {"expression": "6*8", "b": [1, "é"]}) != expected
    assert kernel.digest_of("calc", {"expression": "6*7", "b": [1, "é"]}) != expected


def test_the_last_decision_says_who_decided_and_a_run_not_waiting_refuses_one() -> None:
    for approved, said in ((True, "approved by reviewer"), (False, "denied by reviewer")):
        state = waiting_on_two_deploys()
        for _ in range(2):
            pending = state.summary().pending_approval
            assert pending is not None
            state = kernel.resolve_approval(state, digest=pending.digest, approved=approved)
        assert (state.phase, state.message) == (Phase.RUNNING, said)
    first = waiting_on_two_deploys().summary().pending_approval
    assert first is not None
    denied = kernel.resolve_approval(waiting_on_two_deploys(), digest=first.digest, approved=False)
    assert denied.message == "denied by reviewer; call 2 of 2 held for approval: deploy (d2)"
    named = kernel.resolve_approval(
        waiting_on_two_deploys(), digest=first.digest, approved=True, reviewer="alice"
    )
    assert named.message == "approved by alice; call 2 of 2 held for approval: deploy (d2)"
    with pytest.raises(ValueError, match=r"^the run is running, not waiting for an approval$"):
        kernel.resolve_approval(kernel.initial_state(goal="g"), digest=first.digest, approved=True)
