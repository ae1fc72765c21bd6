"""The strictest common rules OpenAI-compatible servers apply to a chat request, as a checker.

An independent statement of the rules the kernel's ``wire.conform`` promises (written apart from
it, so a test can hold one against the other): the scripted model server answers 400 to a
request that breaks any of them, as the strictest providers do, and the kernel's property tests
check every prompt with it. Sources: Mistral's API ("Unexpected role 'user' after role 'tool'",
"Tool call id was … but must be a-z, A-Z, 0-9, with a length of 9"), the chat templates of
Llama, Gemma and Mistral ("conversation roles must alternate user/assistant"), and OpenAI's
tool-calling contract (every call answered by one ``tool`` message with its id, function names
``^[a-zA-Z0-9_-]{1,64}$``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

CALL_ID = re.compile(r"^[a-zA-Z0-9]{9}$")
FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
NEXT_ROLES = {
    None: {"system", "user"},
    "system": {"user"},
    "user": {"assistant"},
    "assistant": {"user"},
    "assistant+tool_calls": {"tool"},
    "tool": {"tool", "assistant"},
}
"""Which role may follow which (``None``: the start); an assistant message with tool calls is
followed by its results (which ones, and in which order, is checked apart)."""


def _calls_problems(index: int, calls: Any, seen: set[str], *, call_ids: bool) -> list[str]:
    if not isinstance(calls, list) or not calls:
        return [f"messages[{index}].tool_calls must be a non-empty array"]
    problems = []
    for k, call in enumerate(calls):
        where = f"messages[{index}].tool_calls[{k}]"
        call = call if isinstance(call, Mapping) else {}
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            problems.append(f"{where}: tool call id {call_id!r} must be a non-empty string")
        elif call_ids and not CALL_ID.match(call_id):
            problems.append(f"{where}: tool call id {call_id!r} must be 9 of a-z, A-Z, 0-9")
        elif call_id in seen:
            problems.append(f"{where}: tool call id {call_id!r} is used twice")
        else:
            seen.add(call_id)
        function = call.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(name, str) or not FUNCTION_NAME.match(name):
            problems.append(f"{where}: function name {name!r} must match {FUNCTION_NAME.pattern}")
    return problems


def violations(messages: Sequence[Mapping[str, Any]], *, call_ids: bool = True) -> list[str]:
    """Every rule ``messages`` breaks, as readable sentences (empty: the request is fine).

    Rules: the order of roles in ``NEXT_ROLES``; the conversation ends with ``user`` or
    ``tool``; an assistant message with ``tool_calls`` is followed by exactly one ``tool``
    message per call, in call order, with the call's id; ids are 9 alphanumerics, unique in
    the request; function names match ``FUNCTION_NAME``. ``call_ids=False`` drops only the
    rule on an id's form (``CALL_ID``, Mistral's): ids must still be strings, unique and
    answered in order. Clients that echo the model's ids as given (the OpenAI Agents SDK)
    break that one rule against a model whose ids have another form.
    """
    problems: list[str] = []
    seen: set[str] = set()
    expected: list[str] = []  # ids of the calls still waiting for their result, in order
    previous: str | None = None
    for index, message in enumerate(messages):
        role = message.get("role")
        if expected and role != "tool":
            problems.append(f"messages[{index}]: results missing for calls {expected}")
            expected = []
        allowed = NEXT_ROLES.get(previous, set())
        if role not in allowed:
            problems.append(f"messages[{index}]: unexpected role {role!r} after role {previous!r}")
        if role == "tool":
            answered = message.get("tool_call_id")
            if not expected or answered != expected[0]:
                want = expected[0] if expected else "none"
                problems.append(f"messages[{index}]: result for {answered!r}, expected {want}")
            else:
                expected.pop(0)
        if role == "assistant" and "tool_calls" in message:
            problems.extend(_calls_problems(index, message["tool_calls"], seen, call_ids=call_ids))
            calls = message["tool_calls"] if isinstance(message["tool_calls"], list) else []
            expected = [str(c.get("id")) for c in calls if isinstance(c, Mapping)]
        previous = role if isinstance(role, str) else None
        if role == "assistant" and "tool_calls" in message:
            previous = "assistant+tool_calls"
    if expected:
        problems.append(f"the request ends before the results of calls {expected}")
    if previous not in ("user", "tool"):
        problems.append(f"the last message has role {previous!r}, not 'user' or 'tool'")
    return problems
