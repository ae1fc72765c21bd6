"""Wire types between operator and workers: subjects, TurnRequests, run configs, run events.

What belongs here: the JSON shapes that cross NATS and their conversion to and from the
kernel's values — each shape defined once. What does not: connecting or publishing (``bus``),
deciding anything (``kernel``). Payloads are UTF-8 JSON.

- ``subjects``: stream, subject and consumer names;
- ``messages``: the values (``RunConfig``, ``TurnRequest``, ``Approval``);
- ``shapes``: pydantic models of the payloads off the hot path, parsed and converted once;
- ``events``: ``RunEvent`` and the per-turn codec of records and summaries;
- ``versions``: the wire schema's version every message carries, and the readers' check.
- ``sealed``: the operator's ``Seal`` on an event and the exact bytes it covers.
"""

from agentrun.protocol.events import (
    EventKind,
    RunEvent,
    decision_as_dict,
    decision_from_dict,
    held_call_as_dict,
    pending_approval_as_dict,
    record_as_dict,
    record_from_dict,
    summary_as_dict,
    summary_from_dict,
    usage_as_dict,
    usage_from_dict,
)
from agentrun.protocol.messages import (
    DEFAULT_RUN_TIMEOUT,
    DEFAULT_TENANT,
    Approval,
    ModelConfig,
    RemoteTool,
    RunConfig,
    SecretRef,
    TurnRequest,
    UrlRule,
    duration_seconds,
    duration_text,
)
from agentrun.protocol.sealed import Seal, admitted_content, approval_content, canonical
from agentrun.protocol.shapes import (
    RunConfigShape,
    TurnRequestShape,
    decode_turn_request,
    encode_run_config,
    encode_turn_request,
)
from agentrun.protocol.subjects import (
    CANCEL_SUBJECTS,
    EFFECTS_BUCKET,
    EVENT_SUBJECTS,
    LEDGER_BUCKET,
    LEDGER_MAKING,
    LEDGER_QUEUES,
    LEDGER_RUNS,
    LEDGER_TOTALS,
    OPERATOR_CONSUMER,
    STREAM_EVENTS,
    STREAM_TURNS,
    TURN_SUBJECTS,
    WORKERS_CONSUMER,
    cancel_subject,
    dumps,
    event_subject,
    kv_stream,
    kv_subject,
    operator_consumer,
    turn_subject,
)
from agentrun.protocol.versions import SCHEMA_VERSION, UnsupportedSchema

__all__ = [
    "CANCEL_SUBJECTS",
    "DEFAULT_RUN_TIMEOUT",
    "DEFAULT_TENANT",
    "EFFECTS_BUCKET",
    "EVENT_SUBJECTS",
    "LEDGER_BUCKET",
    "LEDGER_MAKING",
    "LEDGER_QUEUES",
    "LEDGER_RUNS",
    "LEDGER_TOTALS",
    "OPERATOR_CONSUMER",
    "SCHEMA_VERSION",
    "STREAM_EVENTS",
    "STREAM_TURNS",
    "TURN_SUBJECTS",
    "WORKERS_CONSUMER",
    "Approval",
    "EventKind",
    "ModelConfig",
    "RemoteTool",
    "RunConfig",
    "RunConfigShape",
    "RunEvent",
    "Seal",
    "SecretRef",
    "TurnRequest",
    "TurnRequestShape",
    "UnsupportedSchema",
    "UrlRule",
    "admitted_content",
    "approval_content",
    "cancel_subject",
    "canonical",
    "decision_as_dict",
    "decision_from_dict",
    "decode_turn_request",
    "dumps",
    "duration_seconds",
    "duration_text",
    "encode_run_config",
    "encode_turn_request",
    "event_subject",
    "held_call_as_dict",
    "kv_stream",
    "kv_subject",
    "operator_consumer",
    "pending_approval_as_dict",
    "record_as_dict",
    "record_from_dict",
    "summary_as_dict",
    "summary_from_dict",
    "turn_subject",
    "usage_as_dict",
    "usage_from_dict",
]
