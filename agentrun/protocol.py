"""Wire types between operator and workers: subjects, TurnRequest, run events, run config.

What belongs here: the JSON shapes that cross NATS and their conversion to kernel values. What
does not: connecting or publishing (``bus``), deciding anything (``kernel``). Shapes are small
dataclasses with ``as_dict``/``from_dict`` (nats.py's own habit); payloads are UTF-8 JSON.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Literal, assert_never

from agentrun import kernel
from agentrun.kernel import decision as dec

STREAM_TURNS = "AGENTRUN_TURNS"
"""Work-queue stream of TurnRequests (DESIGN.md §5)."""
STREAM_EVENTS = "AGENTRUN_EVENTS"
"""Per-run event streams, the source of truth (DESIGN.md §5)."""
TURN_SUBJECTS = "agentrun.turn.>"
EVENT_SUBJECTS = "agentrun.event.>"
CANCEL_SUBJECTS = "agentrun.cancel.>"
WORKERS_CONSUMER = "agentrun-workers"
OPERATOR_CONSUMER = "agentrun-operator"
DEFAULT_TENANT = "default"


def _token(value: str) -> str:
    """A subject token from a Kubernetes name: ``.`` (legal in names) becomes ``_`` (illegal)."""
    return value.replace(".", "_")


def turn_subject(tenant: str) -> str:
    """``agentrun.turn.<tenant>``."""
    return f"agentrun.turn.{_token(tenant)}"


def event_subject(namespace: str, name: str) -> str:
    """``agentrun.event.<ns>.<run>``: one subject per run, the run's checkpoint."""
    return f"agentrun.event.{_token(namespace)}.{_token(name)}"


def cancel_subject(run_uid: str) -> str:
    """Core-NATS subject on which the operator tells workers to abandon a run's turn."""
    return f"agentrun.cancel.{run_uid}"


def dumps(data: Mapping[str, Any]) -> bytes:
    """Compact UTF-8 JSON."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


@dataclasses.dataclass(frozen=True, slots=True)
class SecretRef:
    """Where the model's API key lives (``AgentModel.spec.credentials.secretRef``)."""

    name: str
    namespace: str
    key: str = "apiKey"


@dataclasses.dataclass(frozen=True, slots=True)
class ModelConfig:
    """The resolved AgentModel, snapshotted at admission so a run's prices cannot move."""

    name: str
    """The AgentModel object's name."""
    base_url: str
    model: str
    pricing: kernel.Pricing
    context_window: int
    max_output_tokens: int
    secret: SecretRef | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON shape."""
        return {
            "name": self.name,
            "baseURL": self.base_url,
            "model": self.model,
            "pricing": {
                "inputPerMillionUSD": str(self.pricing.input_per_million),
                "cachedInputPerMillionUSD": str(self.pricing.cached_input_per_million),
                "outputPerMillionUSD": str(self.pricing.output_per_million),
            },
            "contextWindow": self.context_window,
            "maxOutputTokens": self.max_output_tokens,
            "secretRef": dataclasses.asdict(self.secret) if self.secret else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelConfig:
        """Inverse of ``as_dict``."""
        pricing = data.get("pricing") or {}
        secret = data.get("secretRef")
        return cls(
            name=str(data["name"]),
            base_url=str(data["baseURL"]),
            model=str(data["model"]),
            pricing=kernel.Pricing(
                Decimal(str(pricing.get("inputPerMillionUSD", "0"))),
                Decimal(str(pricing.get("cachedInputPerMillionUSD", "0"))),
                Decimal(str(pricing.get("outputPerMillionUSD", "0"))),
            ),
            context_window=int(data.get("contextWindow", 128_000)),
            max_output_tokens=int(data.get("maxOutputTokens", 4096)),
            secret=SecretRef(**secret) if secret else None,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class RunConfig:
    """Everything a worker needs to run any turn of a run; carried by the ``admitted`` event."""

    uid: str
    namespace: str
    name: str
    goal: str
    instructions: str
    tools: tuple[str, ...]
    limits: kernel.Limits
    model: ModelConfig
    deadline: float
    """Epoch seconds: admission time + ``spec.budget.timeout``."""
    tenant: str = DEFAULT_TENANT
    output_schema: Mapping[str, Any] | None = None
    traceparent: str | None = None
    """W3C trace context of the run's ``invoke_agent`` span (minted at admission)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON shape."""
        lim = self.limits
        return {
            "uid": self.uid,
            "namespace": self.namespace,
            "name": self.name,
            "goal": self.goal,
            "instructions": self.instructions,
            "tools": list(self.tools),
            "limits": {
                "maxSteps": lim.max_steps,
                "maxToolCalls": lim.max_tool_calls,
                "maxTokens": lim.max_tokens,
                "maxCostUSD": str(lim.max_cost_usd) if lim.max_cost_usd is not None else None,
                "noProgressWindow": lim.no_progress_window,
                "pollable": sorted(lim.pollable),
                "onExhausted": lim.on_exhausted.value,
                "approvalTools": sorted(lim.approval_tools),
            },
            "model": self.model.as_dict(),
            "deadline": self.deadline,
            "tenant": self.tenant,
            "outputSchema": self.output_schema,
            "traceparent": self.traceparent,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunConfig:
        """Inverse of ``as_dict``."""
        lim = data.get("limits") or {}
        model = ModelConfig.from_dict(data["model"])
        cost = lim.get("maxCostUSD")
        return cls(
            uid=str(data["uid"]),
            namespace=str(data["namespace"]),
            name=str(data["name"]),
            goal=str(data["goal"]),
            instructions=str(data.get("instructions") or ""),
            tools=tuple(data.get("tools") or ()),
            limits=kernel.Limits(
                max_steps=int(lim.get("maxSteps", 20)),
                max_tool_calls=int(lim.get("maxToolCalls", 50)),
                max_tokens=int(lim["maxTokens"]) if lim.get("maxTokens") is not None else None,
                max_cost_usd=Decimal(str(cost)) if cost is not None else None,
                context_window=model.context_window,
                max_output_tokens=model.max_output_tokens,
                no_progress_window=int(lim.get("noProgressWindow", 3)),
                pollable=frozenset(lim.get("pollable") or ()),
                output_schema=data.get("outputSchema"),
                on_exhausted=kernel.OnExhausted(lim.get("onExhausted", "summarize")),
                approval_tools=frozenset(lim.get("approvalTools") or ()),
            ),
            model=model,
            deadline=float(data["deadline"]),
            tenant=str(data.get("tenant") or DEFAULT_TENANT),
            output_schema=data.get("outputSchema"),
            traceparent=data.get("traceparent"),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class TurnRequest:
    """Work item: run turn ``turn`` of run ``run_uid`` on top of event ``expected_seq``."""

    run_uid: str
    namespace: str
    name: str
    turn: int
    expected_seq: int
    """Stream sequence of the run's last event when this turn was dispatched (the CAS base)."""
    traceparent: str | None = None

    @property
    def msg_id(self) -> str:
        """``Nats-Msg-Id`` for JetStream de-duplication: ``<run-uid>:<turn>``."""
        return f"{self.run_uid}:{self.turn}"

    def as_dict(self) -> dict[str, Any]:
        """JSON shape."""
        return {
            "runUID": self.run_uid,
            "namespace": self.namespace,
            "name": self.name,
            "turn": self.turn,
            "expectedSeq": self.expected_seq,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TurnRequest:
        """Inverse of ``as_dict``; raises ``KeyError``/``ValueError`` on a bad payload."""
        return cls(
            run_uid=str(data["runUID"]),
            namespace=str(data["namespace"]),
            name=str(data["name"]),
            turn=int(data["turn"]),
            expected_seq=int(data["expectedSeq"]),
        )


EventKind = Literal["admitted", "turn", "stop", "approval"]


@dataclasses.dataclass(frozen=True, slots=True)
class Approval:
    """A person's decision on the pending held call, bound to its digest."""

    digest: str
    approved: bool


def decision_as_dict(decision: dec.Decision | None) -> dict[str, Any] | None:
    """JSON shape of a classified decision (raw tool calls kept for audit)."""
    match decision:
        case None:
            return None
        case dec.Final(content):
            return {"kind": "final", "content": content}
        case dec.ToolCalls(calls, content):
            raw = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls]
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
            dec.ToolCall(r.get("id"), r.get("name", ""), r.get("arguments"))
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
    }


def summary_as_dict(summary: kernel.RunSummary) -> dict[str, Any]:
    """JSON shape of a ``RunSummary`` (camelCase, as ``.status`` names the same counters)."""
    return {
        "phase": summary.phase.value,
        "turn": summary.turn,
        "steps": summary.steps,
        "toolCalls": summary.tool_calls,
        "toolFailures": summary.tool_failures,
        "corrections": summary.corrections,
        "usage": usage_as_dict(summary.usage),
        "answer": summary.answer,
        "message": summary.message,
        "pendingApproval": held_call_as_dict(summary.pending_approval),
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
        corrections=int(data["corrections"]),
        usage=usage_from_dict(data["usage"]),
        answer=data.get("answer"),
        message=str(data.get("message", "")),
        pending_approval=None
        if waiting is None
        else kernel.HeldCall(
            waiting["toolCallID"], waiting["tool"], waiting["arguments"], waiting["digest"]
        ),
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


def _results_as_list(results: tuple[kernel.ToolResult, ...]) -> list[Any]:
    return [
        {"toolCallID": r.tool_call_id, "name": r.name, "content": r.content, "isError": r.is_error}
        for r in results
    ]


def _results_from_list(data: list[Any]) -> tuple[kernel.ToolResult, ...]:
    return tuple(
        kernel.ToolResult(r["toolCallID"], r["name"], r["content"], bool(r["isError"]))
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
        case kernel.Answered(turn, decision, usage, calls, results, held, stopped):
            return {
                "kind": "answered",
                "turn": turn,
                "decision": decision_as_dict(decision),
                "usage": usage_as_dict(usage),
                "calls": _calls_as_list(calls),
                "results": _results_as_list(results),
                "held": list(held),
                "stopped": _ending_as_dict(stopped),
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

    @property
    def phase(self) -> kernel.Phase:
        """The run's phase after this event."""
        return self.summary.phase

    def state(self) -> kernel.RunState:
        """Counters-only state after this event (see ``kernel.state_from_summary``)."""
        return kernel.state_from_summary(self.summary)

    def encode(self) -> bytes:
        """Payload bytes."""
        data: dict[str, Any] = {
            "kind": self.kind,
            "runUID": self.run_uid,
            "summary": summary_as_dict(self.summary),
            "time": self.time,
        }
        if self.config is not None:
            data["config"] = self.config.as_dict()
        if self.record is not None:
            data["record"] = record_as_dict(self.record)
        if self.approval is not None:
            data["approval"] = dataclasses.asdict(self.approval)
        return dumps(data)

    @classmethod
    def decode(cls, payload: bytes, *, seq: int = 0) -> RunEvent:
        """Parse a payload; raises ``ValueError`` (incl. JSON errors) or ``KeyError`` if bad."""
        data = json.loads(payload)
        kind = data["kind"]
        if kind not in ("admitted", "turn", "stop", "approval"):
            raise ValueError(f"unknown event kind {kind!r}")
        return cls(
            kind=kind,
            run_uid=str(data["runUID"]),
            summary=summary_from_dict(data["summary"]),
            config=RunConfig.from_dict(data["config"]) if data.get("config") else None,
            record=record_from_dict(data["record"]) if data.get("record") else None,
            approval=Approval(str(data["approval"]["digest"]), bool(data["approval"]["approved"]))
            if data.get("approval")
            else None,
            seq=seq,
            time=float(data.get("time", 0.0)),
        )
