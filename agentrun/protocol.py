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
from typing import Any, Literal

from agentrun import kernel
from agentrun.kernel import decision as dec
from agentrun.kernel.loop import state_from_summary

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


def record_as_dict(record: kernel.TurnRecord) -> dict[str, Any]:
    """JSON shape of a ``TurnRecord``."""
    calls: list[dict[str, Any]] = []
    for call in record.calls:
        if isinstance(call, kernel.CheckedCall):
            calls.append({"id": call.id, "name": call.name, "arguments": dict(call.arguments)})
        else:
            calls.append({"id": call.id, "name": call.name, "error": call.error})
    gate = record.gate
    return {
        "turn": record.turn,
        "gate": None
        if gate is None
        else {
            "phase": gate.phase.value if gate.phase else None,
            "maxOutputTokens": gate.max_output_tokens,
            "message": gate.message,
        },
        "decision": decision_as_dict(record.decision),
        "calls": calls,
        "results": [
            {
                "toolCallID": r.tool_call_id,
                "name": r.name,
                "content": r.content,
                "isError": r.is_error,
            }
            for r in record.results
        ],
        "usage": record.usage.as_dict(),
        "failure": record.failure.error if record.failure else None,
        "summary": record.summary,
        "held": list(record.held),
        "resume": record.resume,
    }


def record_from_dict(data: Mapping[str, Any]) -> kernel.TurnRecord:
    """Inverse of ``record_as_dict``."""
    calls: list[kernel.CheckedCall | kernel.InvalidCall] = []
    for c in data.get("calls", ()):
        if "error" in c:
            calls.append(kernel.InvalidCall(c["id"], c["name"], c["error"]))
        else:
            calls.append(kernel.CheckedCall(c["id"], c["name"], c["arguments"]))
    gate = data.get("gate")
    return kernel.TurnRecord(
        turn=int(data["turn"]),
        gate=None
        if gate is None
        else kernel.Gate(
            kernel.Phase(gate["phase"]) if gate.get("phase") else None,
            int(gate.get("maxOutputTokens", 0)),
            str(gate.get("message", "")),
        ),
        decision=decision_from_dict(data.get("decision")),
        calls=tuple(calls),
        results=tuple(
            kernel.ToolResult(r["toolCallID"], r["name"], r["content"], bool(r["isError"]))
            for r in data.get("results", ())
        ),
        usage=kernel.Usage.from_dict(data.get("usage") or {}),
        failure=kernel.ModelFailure(data["failure"]) if data.get("failure") else None,
        summary=bool(data.get("summary", False)),
        held=tuple(data.get("held") or ()),
        resume=bool(data.get("resume", False)),
    )


@dataclasses.dataclass(frozen=True, slots=True)
class RunEvent:
    """One event on a run's subject, with the stream sequence it was stored at (0 if unsent)."""

    kind: EventKind
    run_uid: str
    summary: Mapping[str, Any]
    """``RunState.summary()`` after this event: counters, usage, phase, answer."""
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
        return kernel.Phase(self.summary.get("phase", "running"))

    def state(self) -> kernel.RunState:
        """Counters-only state after this event (see ``state_from_summary``)."""
        return state_from_summary(dict(self.summary))

    def encode(self) -> bytes:
        """Payload bytes."""
        data: dict[str, Any] = {
            "kind": self.kind,
            "runUID": self.run_uid,
            "summary": self.summary,
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
            summary=data.get("summary") or {},
            config=RunConfig.from_dict(data["config"]) if data.get("config") else None,
            record=record_from_dict(data["record"]) if data.get("record") else None,
            approval=Approval(str(data["approval"]["digest"]), bool(data["approval"]["approved"]))
            if data.get("approval")
            else None,
            seq=seq,
            time=float(data.get("time", 0.0)),
        )
