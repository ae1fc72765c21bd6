"""Helpers shared by the mock model tests (imported by name: pytest puts this folder on
sys.path)."""

from __future__ import annotations

from typing import Any


def conversation(goal: str, *, turns: int = 0, system: str = "You are helpful.") -> list[Any]:
    """Messages for turn `turns`: system, user goal, then `turns` assistant+tool exchanges."""
    messages: list[Any] = [
        {"role": "system", "content": system},
        {"role": "user", "content": goal},
    ]
    for k in range(turns):
        call = {
            "id": f"call{k:05d}",  # 9 alphanumerics: the mock checks ids as Mistral does
            "type": "function",
            "function": {"name": "calculate", "arguments": '{"expression":"1"}'},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call{k:05d}", "content": "1"})
    return messages
