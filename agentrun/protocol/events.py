"""Run events: what a run's subject holds, and their JSON codec (the turn's hot path).

An event is ``admitted`` (with the run's config), ``turn`` (with the committed turn's record),
``stop`` (an end decided outside a turn) or ``approval`` (a reviewer's decision); each carries
the run's ``RunSummary`` after it. An ``admitted`` or ``approval`` event written by the operator
carries its ``seal`` (``protocol.sealed``: what it covers; ``agentrun.trust``: checking it).
The record, summary, usage and decision shapes are written
by hand here rather than as pydantic models: a worker encodes one such event per turn and the
operator decodes each one, and for a typical turn event (4 tool calls, 1.6 KB) pydantic models
measured about twice the encode time of this codec (22 µs against 40–56 µs) and a little more
to decode (28 against 32 µs). The config and the approval an event may carry use the pydantic
shapes of ``protocol.shapes``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Literal, assert_never

from agentrun import kernel
from agentrun.kernel import decision as dec
from agentrun.protocol import versions
from agentrun.protocol.messages import Approval, RunConfig
from agentrun.protocol.sealed import Seal, admitted_content, approval_content
from agentrun.protocol.shapes import ApprovalShape, RunConfigShape
from agentrun.protocol.subjects import dumps

EventKind = Literal["admitted", "turn", "stop", "approval"]


def decision_as_dict(decision: dec.Decision | None) -> dict[str, Any] | None:
    """JSON shape of a classified decision (raw tool calls kept for audit)."""
    match decision:
        case None:
            return None
        case dec.Final(content):
            return {"kind": "final", "content": content}
        case dec.ToolCalls(calls, content):
            raw = [
                {"id": c.id, "name": c.name, "arguments": c.arguments}
                | ({} if c.dropped is None else {"dropped": c.dropped})
                for c in calls
            ]
            return {"kind": "tool_calls", "content": content, "raw": raw}
        case dec.Refusal(text):
            return {"kind": "refusal", "text": text}
        case dec.Malformed(cause, detail, content):
            return {"kind": "malformed", "cause": cause.value, "detail": detail, "content": content}


def decision_from_dict(data: Mapping[str, Any] | None) -> dec.Decision | None:
    """Inverse of ``decision_as_dict``."""
    if data is None:
        return None
    kind = data["kind"]
    if kind == "final":
        return dec.Final(data["content"])
    if kind == "tool_calls":
        calls = tuple(
            dec.ToolCall(r.get("id"), r.get("name", ""), r.get("arguments"), r.get("dropped"))
            for r in data.get("raw", ())
        )
        return dec.ToolCalls(calls, data.get("content"))
    if kind == "refusal":
        return dec.Refusal(data["text"])
    return dec.Malformed(
        dec.MalformedCause(data["cause"]), data.get("detail", ""), data.get("content")
    )


def usage_as_dict(usage: kernel.Usage) -> dict[str, Any]:
    """JSON shape of a ``Usage`` (``costUSD`` as a decimal string, never a float)."""
    return {
        "inputTokens": usage.input_tokens,
        "outputTokens": usage.output_tokens,
        "cachedInputTokens": usage.cached_input_tokens,
        "reasoningTokens": usage.reasoning_tokens,
        "costUSD": format(usage.cost_usd, "f"),
        "estimated": usage.estimated,
    }


def usage_from_dict(data: Mapping[str, Any]) -> kernel.Usage:
    """Inverse of ``usage_as_dict``."""
    return kernel.Usage(
        input_tokens=int(data.get("inputTokens", 0)),
        output_tokens=int(data.get("outputTokens", 0)),
        cached_input_tokens=int(data.get("cachedInputTokens", 0)),
        cost_usd=Decimal(str(data.get("costUSD", "0"))),
        estimated=bool(data.get("estimated", False)),
        reasoning_tokens=int(data.get("reasoningTokens", 0)),
    )


def held_call_as_dict(held: kernel.HeldCall | None) -> dict[str, Any] | None:
    """JSON shape of the held call a reviewer must decide (``.status.pendingApproval``)."""
    if held is None:
        return None
    return {
        "toolCallID": held.id,
        "tool": held.name,
        "arguments": dict(held.arguments),
        "digest": held.digest,
        **({"reviewer": held.reviewer} if held.reviewer else {}),
    }


_DECISIONS = {None: "pending", True: "approved", False: "denied"}


def pending_approval_as_dict(summary: kernel.RunSummary) -> dict[str, Any] | None:
    """JSON shape of ``.status.pendingApproval``: the call to decide now (as
    ``held_call_as_dict``), its 1-based position ``call`` among the ``of`` calls of its batch
    that need a person, and ``heldCalls``: each of those with its ``decision`` (``pending``,
    ``approved``, ``denied``). ``None`` when nothing waits."""
    now = summary.pending_approval
    if now is None:
        return None
    batch = summary.held_for_approval or (now,)
    return {
        **(held_call_as_dict(now) or {}),
        "call": [held.id for held in batch].index(now.id) + 1,
        "of": len(batch),
        "heldCalls": [
            {**(held_call_as_dict(held) or {}), "decision": _DECISIONS[held.approved]}
            for held in batch
        ],
    }


def _held_calls_from_dict(waiting: Mapping[str, Any]) -> tuple[kernel.HeldCall, ...]:
    approved = {decision: value for value, decision in _DECISIONS.items()}
    return tuple(
        kernel.HeldCall(
            held["toolCallID"],
            held["tool"],
            held["arguments"],
            held["digest"],
            approved[held.get("decision", "pending")],
            reviewer=str(held.get("reviewer", "")),
        )
        for held in waiting.get("heldCalls") or []
    )


def summary_as_dict(summary: kernel.RunSummary) -> dict[str, Any]:
    """JSON shape of a ``RunSummary`` (camelCase, as ``.status`` names the same counters)."""
    return {
        "phase": summary.phase.value,
        "turn": summary.turn,
        "steps": summary.steps,
        "toolCalls": summary.tool_calls,
        "toolFailures": summary.tool_failures,
        "toolCallsNotRun": summary.tool_calls_not_run,
        "corrections": summary.corrections,
        "usage": usage_as_dict(summary.usage),
        "answer": summary.answer,
        "message": summary.message,
        "pendingApproval": pending_approval_as_dict(summary),
    }


def summary_from_dict(data: Mapping[str, Any]) -> kernel.RunSummary:
    """Inverse of ``summary_as_dict``; raises ``KeyError``/``ValueError`` on a bad shape."""
    waiting = data.get("pendingApproval")
    return kernel.RunSummary(
        phase=kernel.Phase(data["phase"]),
        turn=int(data["turn"]),
        steps=int(data["steps"]),
        tool_calls=int(data["toolCalls"]),
        tool_failures=int(data["toolFailures"]),
        tool_calls_not_run=int(data.get("toolCallsNotRun", 0)),
        corrections=int(data["corrections"]),
        usage=usage_from_dict(data["usage"]),
        answer=data.get("answer"),
        message=str(data.get("message", "")),
        pending_approval=None
        if waiting is None
        else kernel.HeldCall(
            waiting["toolCallID"], waiting["tool"], waiting["arguments"], waiting["digest"]
        ),
        held_for_approval=() if waiting is None else _held_calls_from_dict(waiting),
    )


def _calls_as_list(calls: tuple[kernel.CheckedCall | kernel.InvalidCall, ...]) -> list[Any]:
    return [
        {"id": c.id, "name": c.name, "arguments": dict(c.arguments)}
        if isinstance(c, kernel.CheckedCall)
        else {"id": c.id, "name": c.name, "error": c.error}
        for c in calls
    ]


def _calls_from_list(data: list[Any]) -> tuple[kernel.CheckedCall | kernel.InvalidCall, ...]:
    return tuple(
        kernel.InvalidCall(c["id"], c["name"], c["error"])
        if "error" in c
        else kernel.CheckedCall(c["id"], c["name"], c["arguments"])
        for c in data
    )


def _result_as_dict(result: kernel.ToolResult) -> dict[str, Any]:
    data: dict[str, Any] = {
        "toolCallID": result.tool_call_id,
        "name": result.name,
        "content": result.content,
        "isError": result.is_error,
    }
    if result.fault is not None:
        data["fault"] = result.fault.value
    return data


def _results_as_list(results: tuple[kernel.ToolResult, ...]) -> list[Any]:
    return [_result_as_dict(r) for r in results]


def _results_from_list(data: list[Any]) -> tuple[kernel.ToolResult, ...]:
    """Results as stored; ``fault`` is absent for successes and for events written before
    faults were classified (those errors then count as the model's)."""
    return tuple(
        kernel.ToolResult(
            r["toolCallID"],
            r["name"],
            r["content"],
            bool(r["isError"]),
            kernel.ToolFault(r["fault"]) if r.get("fault") else None,
        )
        for r in data
    )


def _ending_as_dict(ending: kernel.Ending | None) -> dict[str, Any] | None:
    return None if ending is None else {"phase": ending.phase.value, "message": ending.message}


def _ending_from_dict(data: Mapping[str, Any] | None) -> kernel.Ending | None:
    return None if data is None else kernel.Ending(kernel.Phase(data["phase"]), data["message"])


def record_as_dict(record: kernel.TurnRecord) -> dict[str, Any]:
    """JSON shape of a turn record: ``kind`` names the variant (``stopped``, ``model_failed``,
    ``answered``, ``summarized``, ``resumed``), the other keys are that variant's fields."""
    match record:
        case kernel.Stopped(turn, ending):
            return {"kind": "stopped", "turn": turn, "ending": _ending_as_dict(ending)}
        case kernel.ModelFailed(turn, error):
            return {"kind": "model_failed", "turn": turn, "error": error}
        case kernel.Answered(turn, decision, usage, calls, results, held, stopped, deferred):
            return {
                "kind": "answered",
                "turn": turn,
                "decision": decision_as_dict(decision),
                "usage": usage_as_dict(usage),
                "calls": _calls_as_list(calls),
                "results": _results_as_list(results),
                "held": list(held),
                "stopped": _ending_as_dict(stopped),
                "deferred": list(deferred),
            }
        case kernel.Summarized(turn, decision, usage, error):
            return {
                "kind": "summarized",
                "turn": turn,
                "decision": decision_as_dict(decision),
                "usage": usage_as_dict(usage),
                "error": error,
            }
        case kernel.Resumed(turn, results, stopped):
            return {
                "kind": "resumed",
                "turn": turn,
                "results": _results_as_list(results),
                "stopped": _ending_as_dict(stopped),
            }
        case _:
            assert_never(record)


def record_from_dict(data: Mapping[str, Any]) -> kernel.TurnRecord:
    """Inverse of ``record_as_dict``; raises ``KeyError``/``ValueError`` on a bad shape (a
    record written before the tagged ``kind`` existed is refused as unknown)."""
    kind, turn = data.get("kind"), int(data["turn"])
    if kind == "stopped":
        ending = _ending_from_dict(data["ending"])
        assert ending is not None
        return kernel.Stopped(turn, ending)
    if kind == "model_failed":
        return kernel.ModelFailed(turn, str(data["error"]))
    if kind == "answered":
        decision = decision_from_dict(data["decision"])
        if decision is None:
            raise ValueError("an answered turn record without a decision")
        return kernel.Answered(
            turn,
            decision,
            usage_from_dict(data["usage"]),
            _calls_from_list(data["calls"]),
            _results_from_list(data["results"]),
            tuple(data["held"]),
            _ending_from_dict(data["stopped"]),
            tuple(data.get("deferred", ())),  # absent in records written before deferral
        )
    if kind == "summarized":
        return kernel.Summarized(
            turn,
            decision_from_dict(data["decision"]),
            usage_from_dict(data["usage"]),
            str(data["error"]),
        )
    if kind == "resumed":
        return kernel.Resumed(
            turn, _results_from_list(data["results"]), _ending_from_dict(data["stopped"])
        )
    raise ValueError(f"unknown turn record kind {kind!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class RunEvent:
    """One event on a run's subject, with the stream sequence it was stored at (0 if unsent)."""

    kind: EventKind
    run_uid: str
    summary: kernel.RunSummary
    """The run's counters, phase and answer after this event."""
    config: RunConfig | None = None
    """Only on ``admitted``."""
    record: kernel.TurnRecord | None = None
    """Only on ``turn``."""
    approval: Approval | None = None
    """Only on ``approval``."""
    seq: int = 0
    time: float = 0.0
    """Epoch seconds when the event was made."""
    owner: str = ""
    """On ``turn``: the delivery (its tenant-ledger hold owner) that committed it, whose model
    call the record contains; "" when no ledger hold was taken (and in events written before
    deliveries were named); ``-`` (``ledger.NO_CALL_OWNER``) when the record holds none of the
    committer's call, which was charged as abandoned (a deadline, a broken stream). The
    ledger tells the committed call of a turn run twice apart from the losing one by it. On
    ``approval`` and ``stop``: the committer of the run's last turn, carried over
    (``stopped``), so whoever closes the run from its last event — the operator on a terminal
    event, the ledger sweep — resolves that turn's holds by it ("" in events written before it
    was carried)."""
    seal: Seal | None = None
    """Only on ``admitted`` and ``approval``: the operator's signature over the event's sealed
    content (``sealed_content``); ``None``: unsealed (written before seals existed, or not by
    the operator). A seal that does not parse is kept as one that verifies nothing."""
    received: bytes = dataclasses.field(default=b"", compare=False, repr=False)
    """An ``admitted`` event's sealed content as received (the bytes of its config's JSON
    object as decoded, before parsing): what its seal is checked against. Empty on an event
    made here, whose content is computed from its config."""
    stored_before: int = 0
    """Bytes of the run's events before this one, as its writer knew them (0 for the first,
    and in events written before this was counted): with ``size``, the run's stored bytes
    (``stored``), which the per-run and per-tenant storage limits are checked against."""
    size: int = dataclasses.field(default=0, compare=False)
    """Bytes of this event's payload as read (0 for an event not read from the stream)."""

    @property
    def stored(self) -> int:
        """Bytes of the run's events up to and including this one."""
        return self.stored_before + self.size

    @property
    def phase(self) -> kernel.Phase:
        """The run's phase after this event."""
        return self.summary.phase

    def state(self) -> kernel.RunState:
        """Counters-only state after this event (see ``kernel.state_from_summary``)."""
        return kernel.state_from_summary(self.summary)

    def stopped(self, state: kernel.RunState, *, time: float) -> RunEvent:
        """The ``stop`` event ending the run at ``state`` (``kernel.stop`` of this event's
        state), to be stored right after this event, the run's last: its stored bytes follow
        this event's, and it names the committer of the run's last turn as this event does
        (``owner``): if that turn's committer died before settling it, the run's close
        resolves the turn's holds by it (another delivery's answered call charged as
        abandoned, the committer's through the run)."""
        return RunEvent(
            "stop",
            self.run_uid,
            state.summary(),
            time=time,
            owner=self.owner,
            stored_before=self.stored,
        )

    def sealed_content(self) -> bytes | None:
        """The bytes this event's seal covers (``protocol.sealed``): an ``admitted`` event's
        config as received (or as it encodes, on an event made here), an ``approval`` event's
        decision with its run and turn; ``None`` for kinds that carry no seal."""
        if self.kind == "admitted" and self.config is not None:
            return self.received or admitted_content(_config_json(self.config))
        if self.kind == "approval" and self.approval is not None:
            return approval_content(
                self.run_uid,
                turn=self.summary.turn,
                digest=self.approval.digest,
                approved=self.approval.approved,
                reviewer=self.approval.reviewer,
                after=self.approval.after,
            )
        return None

    def encode(self) -> bytes:
        """Payload bytes."""
        data: dict[str, Any] = {
            versions.FIELD: versions.SCHEMA_VERSION,
            "kind": self.kind,
            "runUID": self.run_uid,
            "summary": summary_as_dict(self.summary),
            "time": self.time,
        }
        if self.config is not None:
            data["config"] = _config_json(self.config)
        if self.record is not None:
            data["record"] = record_as_dict(self.record)
        if self.approval is not None:
            data["approval"] = ApprovalShape.of(self.approval).model_dump(by_alias=True)
        if self.owner:
            data["owner"] = self.owner
        if self.seal is not None:
            data["seal"] = self.seal.as_dict()
        if self.stored_before:
            data["storedBefore"] = self.stored_before
        return dumps(data)

    @classmethod
    def decode(cls, payload: bytes, *, seq: int = 0) -> RunEvent:
        """Parse a payload; raises ``versions.UnsupportedSchema`` (a ``ValueError``) when it is
        written in a newer schema than this release reads, ``ValueError`` (incl. JSON errors)
        or ``KeyError`` if bad."""
        data = json.loads(payload)
        versions.check(data, what="run event")
        kind = data["kind"]
        if kind not in ("admitted", "turn", "stop", "approval"):
            raise ValueError(f"unknown event kind {kind!r}")
        raw_config = data.get("config")
        return cls(
            kind=kind,
            run_uid=str(data["runUID"]),
            summary=summary_from_dict(data["summary"]),
            config=RunConfigShape.model_validate(raw_config).value() if raw_config else None,
            record=record_from_dict(data["record"]) if data.get("record") else None,
            approval=ApprovalShape.model_validate(data["approval"]).value()
            if data.get("approval")
            else None,
            seq=seq,
            time=float(data.get("time", 0.0)),
            owner=str(data.get("owner", "")),  # absent: no hold, or written before owners
            seal=_seal_of(data.get("seal")),
            received=admitted_content(raw_config) if kind == "admitted" and raw_config else b"",
            stored_before=int(data.get("storedBefore", 0)),
            size=len(payload),
        )


def _config_json(config: RunConfig) -> dict[str, Any]:
    """A run config as an ``admitted`` event carries it (a JSON object)."""
    return RunConfigShape.of(config).model_dump(mode="json", by_alias=True)


def _seal_of(data: Any) -> Seal | None:
    """An event's seal; a malformed one becomes a seal that verifies nothing (the event is
    refused as forged when checked, not dropped as undecodable)."""
    if data is None:
        return None
    try:
        return Seal.from_dict(data)
    except ValueError:
        return Seal("", b"")
