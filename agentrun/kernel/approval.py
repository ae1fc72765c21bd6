"""Human approval of tool calls (``spec.approval.tools``): holding, digests, resolution.

A valid call to an approval tool is not run: its turn is held — neither the assistant message
nor any of the batch's results enter the history yet, so the history never shows a call without
its result — and the run waits in ``awaiting_approval``. A person approves or denies one held
call at a time, naming its digest (a SHA-256 of the canonical tool name and arguments), so an
approval cannot be replayed onto different arguments. When every held call is decided, a
``resume`` turn runs the approved ones, answers the denied ones with a "denied by reviewer"
error, and appends the whole batch in call order. A denial never becomes permission.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from agentrun.kernel.records import Answered
from agentrun.kernel.validate import CheckedCall, InvalidCall

DENIED = "denied by reviewer: the call was not run. Continue without it."


def digest_of(name: str, arguments: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of ``{"arguments": ..., "tool": ...}`` as canonical JSON (sorted keys)."""
    canonical = json.dumps(
        {"tool": name, "arguments": arguments},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


@dataclasses.dataclass(frozen=True, slots=True)
class HeldCall:
    """One call waiting for a person."""

    id: str
    name: str
    arguments: Mapping[str, Any]
    digest: str
    approved: bool | None = None
    """``None`` until decided."""


@dataclasses.dataclass(frozen=True, slots=True)
class PendingBatch:
    """A held turn: its record (with the results of the calls that did run) and the held calls."""

    record: Answered
    held: tuple[HeldCall, ...]

    @property
    def next_undecided(self) -> HeldCall | None:
        """The first held call nobody has decided yet."""
        return next((h for h in self.held if h.approved is None), None)


def held_calls(
    calls: tuple[CheckedCall | InvalidCall, ...], approval_tools: frozenset[str]
) -> tuple[str, ...]:
    """Ids of the valid calls that need approval, in call order."""
    return tuple(c.id for c in calls if isinstance(c, CheckedCall) and c.name in approval_tools)


def pending_of(record: Answered) -> PendingBatch:
    """The pending batch a held turn creates."""
    by_id = {c.id: c for c in record.calls if isinstance(c, CheckedCall)}
    held = tuple(
        HeldCall(i, by_id[i].name, by_id[i].arguments, digest_of(by_id[i].name, by_id[i].arguments))
        for i in record.held
    )
    return PendingBatch(record, held)


def decide(pending: PendingBatch, *, digest: str, approved: bool) -> PendingBatch:
    """Record a decision on the next undecided call. Raises ``ValueError`` if ``digest`` is not
    that call's digest (stale or forged approvals are refused, never applied to another call)."""
    target = pending.next_undecided
    if target is None:
        raise ValueError("no held call is waiting for a decision")
    if digest != target.digest:
        raise ValueError(
            f"digest {digest!r} does not match the pending call {target.id} ({target.digest})"
        )
    held = tuple(
        dataclasses.replace(h, approved=approved) if h is target else h for h in pending.held
    )
    return dataclasses.replace(pending, held=held)
