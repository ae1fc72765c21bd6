"""Builders for chat-completions responses and kernel values used across kernel tests."""

from __future__ import annotations

import json
from typing import Any

from agentrun import kernel

CALC = kernel.ToolSchema(
    "calculate",
    {
        "type": "object",
        "properties": {"expression": {"type": "string", "maxLength": 200}},
        "required": ["expression"],
        "additionalProperties": False,
    },
)
PING = kernel.ToolSchema(
    "ping", {"type": "object", "properties": {}, "additionalProperties": False}
)
TOOLS = {"calculate": CALC, "ping": PING}


def call(name: str, arguments: Any = None, *, id: str | None = "call_1") -> dict[str, Any]:
    """One tool call in the response shape; dict arguments are JSON-encoded."""
    args = json.dumps(arguments) if isinstance(arguments, dict) else arguments
    return {"id": id, "type": "function", "function": {"name": name, "arguments": args}}


def response(
    content: str | None = None,
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    finish_reason: str | None = None,
    refusal: str | None = None,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A chat.completion object."""
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": refusal}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    if finish_reason is None:
        finish_reason = "tool_calls" if tool_calls else "stop"
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": usage,
    }


def tool_turn(
    state: kernel.RunState,
    *calls: kernel.CheckedCall | kernel.InvalidCall,
    ok: bool = True,
    fault: kernel.ToolFault | None = None,
) -> kernel.TurnRecord:
    """A turn in which the model called ``calls`` and each got a result (an error with
    ``fault`` unless ``ok``)."""
    results = tuple(
        kernel.ToolResult(c.id, c.name, "42", False)
        if ok and isinstance(c, kernel.CheckedCall)
        else kernel.ToolResult(
            c.id,
            c.name,
            "boom",
            True,
            kernel.ToolFault.ARGUMENTS if isinstance(c, kernel.InvalidCall) else fault,
        )
        for c in calls
    )
    return kernel.Answered(
        turn=state.turn,
        decision=kernel.ToolCalls((), None),
        calls=calls,
        results=results,
        usage=kernel.Usage(100, 10),
    )


def checked(id: str = "c1", expression: str = "1+1") -> kernel.CheckedCall:
    """A valid calculate call."""
    return kernel.CheckedCall(id, "calculate", {"expression": expression})
