"""The rules of held calls and approvals, stated exactly: which calls are deferred, what
digest a held call carries, what a decision refuses and says."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from agentrun import kernel
from agentrun.kernel import Phase, approval

from .test_resume_fold import decided


def test_a_tool_without_a_declared_effect_is_read_and_defers_nothing() -> None:
    calls = (kernel.CheckedCall("c1", "lookup", {}), kernel.CheckedCall("c2", "other", {}))
    assert approval.deferred_calls(calls, held=(), effects={}) == ()
    assert approval.deferred_calls(calls, held=(), effects={"other": "read"}) == ()
    assert approval.deferred_calls(calls, held=(), effects={"other": "write"}) == ("c1", "c2")
    assert approval.deferred_calls(calls, held=("c2",), effects={"other": "write"}) == ()


@pytest.mark.parametrize(
    "limits",
    [kernel.Limits(), kernel.Limits(approval_tools=frozenset({"deploy"}))],
    ids=["effect", "approval"],
)
def test_a_held_call_carries_the_digest_of_its_own_tool_and_arguments(
    limits: kernel.Limits,
) -> None:
    state = decided(limits, ("w1", "deploy", '{"app": "web"}'))
    assert state.pending is not None
    [held] = state.pending.held
    canonical = '{"arguments":{"app":"web"},"tool":"deploy"}'
    assert held.digest == "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def test_a_decision_is_refused_unless_a_call_waits_for_it_with_that_digest() -> None:
    limits = kernel.Limits(approval_tools=frozenset({"deploy"}))
    waiting = decided(limits, ("w1", "deploy", "{}"))
    assert waiting.pending is not None
    [held] = waiting.pending.held
    with pytest.raises(ValueError) as refused:
        kernel.resolve_approval(waiting, digest="sha256:00", approved=True)
    assert str(refused.value) == (
        f"digest 'sha256:00' does not match the pending call w1 ({held.digest})"
    )
    approved = kernel.resolve_approval(waiting, digest=held.digest, approved=True, reviewer="ann")
    assert (approved.phase, approved.message) == (Phase.RUNNING, "approved by ann")
    # running with its batch pending: not waiting, whatever the digest
    with pytest.raises(ValueError) as again:
        kernel.resolve_approval(approved, digest=held.digest, approved=True)
    assert str(again.value) == "the run is running, not waiting for an approval"
    assert approved.pending is not None
    with pytest.raises(ValueError) as twice:
        approval.decide(approved.pending, digest=held.digest, approved=False, reviewer="bob")
    assert str(twice.value) == "no held call is waiting for a decision"


def test_the_reviewer_is_recorded_on_the_call_it_decided() -> None:
    limits = kernel.Limits(approval_tools=frozenset({"deploy"}))
    waiting = decided(limits, ("w1", "deploy", "{}"))
    assert waiting.pending is not None
    [held] = waiting.pending.held
    after = approval.decide(waiting.pending, digest=held.digest, approved=False, reviewer="bob")
    assert after.held == (dataclasses.replace(held, approved=False, reviewer="bob"),)
