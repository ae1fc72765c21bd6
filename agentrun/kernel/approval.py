"""Human approval of tool calls (``spec.approval.tools``): holding, digests, resolution.

A valid call to an approval tool is not run: its turn is held — neither the assistant message
nor any of the batch's results enter the history yet, so the history never shows a call without
its result — and the run waits in ``awaiting_approval``. A person approves or denies one held
call at a time, naming its digest (a SHA-256 of the canonical tool name and arguments), so an
approval cannot be replayed onto different arguments. When every held call is decided, a
``resume`` turn runs the approved ones, answers the denied ones with a "denied by reviewer"
error, and appends the whole batch in call order. A denial never becomes permission.

The same pending batch carries the calls of a batch with effects (``Answered.deferred``): they
are committed with the decision, need nobody (``HoldReason.EFFECT``, approved from the start),
and run in the resume turn together with any approved held calls.
"""

from __future__ import annotations

import dataclasses
import enum
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


class HoldReason(enum.StrEnum):
    """Why a committed call has not run yet."""

    APPROVAL = "approval"
    """Its tool is listed in ``spec.approval.tools``: a person decides it."""
    EFFECT = "effect"
    """Its batch holds a write or idempotent call: the decision is committed before any of the
    batch runs, and the next turn runs it (no person involved)."""


@dataclasses.dataclass(frozen=True, slots=True)
class HeldCall:
    """One committed call that has not run yet: waiting for a person, or for its resume turn."""

    id: str
    name: str
    arguments: Mapping[str, Any]
    digest: str
    approved: bool | None = None
    """``None`` until decided (always ``True`` for ``HoldReason.EFFECT``)."""
    reason: HoldReason = HoldReason.APPROVAL
    reviewer: str = ""
    """Who decided it: the Kubernetes user name the API server checked when the decision was
    made (``""`` until decided, and for calls nobody had to decide)."""


@dataclasses.dataclass(frozen=True, slots=True)
class PendingBatch:
    """A held turn: its record (with the results of the calls that did run) and the held calls."""

    record: Answered
    held: tuple[HeldCall, ...]

    @property
    def next_undecided(self) -> HeldCall | None:
        """The first held call nobody has decided yet."""
        return next((h for h in self.held if h.approved is None), None)

    @property
    def for_approval(self) -> tuple[HeldCall, ...]:
        """The calls of the batch a person decides (``HoldReason.APPROVAL``), in call order,
        decided or not; each is decided in turn, one approval or denial per call."""
        return tuple(h for h in self.held if h.reason is HoldReason.APPROVAL)

    def waiting_message(self) -> str | None:
        """``call 2 of 3 held for approval: NAME (ID)`` for the next undecided call (its
        1-based position among `for_approval`), or ``None`` when every call is decided."""
        waiting = self.next_undecided
        if waiting is None:
            return None
        asked = self.for_approval
        position = asked.index(waiting) + 1
        return f"call {position} of {len(asked)} held for approval: {waiting.name} ({waiting.id})"


def held_calls(
    calls: tuple[CheckedCall | InvalidCall, ...], approval_tools: frozenset[str]
) -> tuple[str, ...]:
    """Ids of the valid calls that need approval, in call order."""
    return tuple(c.id for c in calls if isinstance(c, CheckedCall) and c.name in approval_tools)


def pending_of(record: Answered) -> PendingBatch:
    """The pending batch a held or deferred turn creates: its held and deferred calls, in
    call order (deferred ones approved from the start)."""
    held, deferred = set(record.held), set(record.deferred)
    calls = (
        HeldCall(c.id, c.name, c.arguments, digest_of(c.name, c.arguments))
        if c.id in held
        else HeldCall(
            c.id, c.name, c.arguments, digest_of(c.name, c.arguments), True, HoldReason.EFFECT
        )
        for c in record.calls
        if isinstance(c, CheckedCall) and (c.id in held or c.id in deferred)
    )
    return PendingBatch(record, tuple(calls))


def deferred_calls(
    calls: tuple[CheckedCall | InvalidCall, ...],
    *,
    held: tuple[str, ...],
    effects: Mapping[str, str],
) -> tuple[str, ...]:
    """Ids of the valid calls not ``held`` to commit before they run: all of them, in call
    order, when one of them is a ``write`` or ``idempotent`` call (``effects``: tool name →
    effect class; a tool not in it is ``read``), else none."""
    rest = [c for c in calls if isinstance(c, CheckedCall) and c.id not in held]
    if any(effects.get(c.name, "read") != "read" for c in rest):
        return tuple(c.id for c in rest)
    return ()


def decide(pending: PendingBatch, *, digest: str, approved: bool, reviewer: str) -> PendingBatch:
    """Record ``reviewer``'s decision on the next undecided call. Raises ``ValueError`` if
    ``digest`` is not that call's digest (stale or forged approvals are refused, never applied
    to another call)."""
    target = pending.next_undecided
    if target is None:
        raise ValueError("no held call is waiting for a decision")
    if digest != target.digest:
        raise ValueError(
            f"digest {digest!r} does not match the pending call {target.id} ({target.digest})"
        )
    held = tuple(
        dataclasses.replace(h, approved=approved, reviewer=reviewer) if h is target else h
        for h in pending.held
    )
    return dataclasses.replace(pending, held=held)
